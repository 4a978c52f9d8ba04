"""Launchers, the autograd Function and the user-facing ``rmsnorm_triton`` (docs/kernels/triton-rmsnorm.md)."""

from __future__ import annotations

import os

import torch
import triton
from harness.backends.triton import _rowplan as rowplan

from . import kernels as K

Tensor = torch.Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Under the interpreter the blocks are small so that CPU-sized cases span several of them (what exposes
# block bugs); the adapter declares BLOCK_R / BLOCK_F (a test checks that they match). The one-read kernels'
# plan (ROW_MAX, row_*) is rowplan's, shared with the other norm.
CPU_CONFIG = {"BLOCK_R": 8, "BLOCK_F": 32, "warps": 4, "red_t": 8, "red_f": 32, "red_warps": 4, **rowplan.CPU_ROWS}
GPU_CONFIG = {"BLOCK_R": 16, "BLOCK_F": 512, "warps": 8, "red_t": 32, "red_f": 64, "red_warps": 4, **rowplan.GPU_ROWS}
CONFIG = dict(CPU_CONFIG if INTERPRET else GPU_CONFIG)


def forward(x: Tensor, residual: Tensor | None, w: Tensor, eps: float) -> tuple[Tensor, Tensor | None, Tensor]:
    """(y, residual_out or None, rstd [R] float32) for x [R, F] (+ residual [R, F]), w [F]."""
    R, F = x.shape
    dev = x.device
    y = torch.empty((R, F), dtype=x.dtype, device=dev)
    ro = torch.empty((R, F), dtype=x.dtype, device=dev) if residual is not None else None
    rstd = torch.empty((R,), dtype=torch.float32, device=dev)
    r, rs = (residual, residual.stride()) if residual is not None else (x, (0, 0))
    o, os_ = (ro, ro.stride()) if ro is not None else (y, (0, 0))
    p = rowplan.plan(F, CONFIG)
    # one program per row tile: cdiv(R, BLOCK_R) < 2^31 for any R * F < 2^31 * BLOCK_R
    kernel = K._fwd_rows_kernel if p.rows_kernels else K._fwd_kernel
    kernel[(triton.cdiv(R, p.block_r),)](
        x, r, w, y, o, rstd, R, F, eps, *x.stride(), *rs, w.stride(0), *y.stride(), *os_,
        HAS_RES=residual is not None, BLOCK_R=p.block_r, BLOCK_F=p.block_f, num_warps=p.warps)
    return y, ro, rstd


def backward(dy: Tensor, dro: Tensor | None, x: Tensor, residual: Tensor | None, w: Tensor,
             rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx, dw); with a residual, dx (= dh, d residual_out added) is also dresidual."""
    R, F = x.shape
    dev = x.device
    p = rowplan.plan(F, CONFIG, backward=True)
    br = p.block_r
    tiles = triton.cdiv(R, br)
    # the one-read kernel is persistent (a dw partial per program), the looped one a program per tile
    progs = rowplan.programs(dev, tiles, p.warps, CONFIG) if p.rows_kernels else tiles
    dx = torch.empty((R, F), dtype=x.dtype, device=dev)
    part = torch.empty((progs, F), dtype=torch.float32, device=dev)
    r, rs = (residual, residual.stride()) if residual is not None else (x, (0, 0))
    d, ds = (dro, dro.stride()) if dro is not None else (dy, (0, 0))
    strides = (*x.stride(), *rs, w.stride(0), *dy.stride(), *ds, *dx.stride())
    consts = {"HAS_RES": residual is not None, "BLOCK_R": br, "BLOCK_F": p.block_f, "num_warps": p.warps}
    ptrs = (x, r, w, dy, d, rstd, dx, part, R, F)
    if p.rows_kernels:
        K._bwd_rows_kernel[(progs,)](*ptrs, tiles, *strides, **consts)
    else:
        K._bwd_kernel[(progs,)](*ptrs, *strides, **consts)
    dw = torch.empty((F,), dtype=w.dtype, device=dev)
    K._reduce_kernel[(triton.cdiv(F, CONFIG["red_f"]),)](
        part, dw, progs, F, dw.stride(0), BLOCK_T=CONFIG["red_t"], BLOCK_F=CONFIG["red_f"],
        num_warps=CONFIG["red_warps"])
    return dx, dw


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, residual: Tensor | None, w: Tensor, eps: float):
        y, ro, rstd = forward(x, residual, w, eps)
        ctx.save_for_backward(x, residual, w, rstd)
        ctx.has_res = residual is not None
        return (y, ro) if ctx.has_res else y

    @staticmethod
    def backward(ctx, dy: Tensor, dro: Tensor | None = None):
        x, residual, w, rstd = ctx.saved_tensors
        dx, dw = backward(dy, dro if ctx.has_res else None, x, residual, w, rstd)
        # h = x + residual: one gradient for both (the same tensor, as fused add + norm kernels return it)
        return dx, (dx if ctx.has_res else None), dw, None


def rmsnorm_triton(x: Tensor, residual: Tensor | None, w: Tensor, *, eps: float = 1e-6) -> dict[str, Tensor]:
    """RMSNorm of x [R, F] (h = x + residual when given) with weight w [F]: {"y"} or {"y", "residual_out"}."""
    if residual is None:
        return {"y": RMSNormFn.apply(x, None, w, eps)}
    y, ro = RMSNormFn.apply(x, residual, w, eps)
    return {"y": y, "residual_out": ro}
