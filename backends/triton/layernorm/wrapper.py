"""Launchers, the autograd Function and the user-facing ``layernorm_triton`` (docs/kernels/triton-layernorm.md)."""

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


def forward(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean [R] float32, rstd [R] float32) for x [R, F], w and b [F]."""
    R, F = x.shape
    dev = x.device
    y = torch.empty((R, F), dtype=x.dtype, device=dev)
    mean = torch.empty((R,), dtype=torch.float32, device=dev)
    rstd = torch.empty((R,), dtype=torch.float32, device=dev)
    p = rowplan.plan(F, CONFIG)
    # one program per row tile: cdiv(R, BLOCK_R) < 2^31 for any R * F < 2^31 * BLOCK_R
    kernel = K._fwd_rows_kernel if p.rows_kernels else K._fwd_kernel
    kernel[(triton.cdiv(R, p.block_r),)](
        x, w, b, y, mean, rstd, R, F, eps, *x.stride(), w.stride(0), b.stride(0), *y.stride(),
        BLOCK_R=p.block_r, BLOCK_F=p.block_f, num_warps=p.warps)
    return y, mean, rstd


def _reduce(part: Tensor, out: Tensor) -> None:
    T, F = part.shape
    K._reduce_kernel[(triton.cdiv(F, CONFIG["red_f"]),)](
        part, out, T, F, out.stride(0), BLOCK_T=CONFIG["red_t"], BLOCK_F=CONFIG["red_f"],
        num_warps=CONFIG["red_warps"])


def backward(dy: Tensor, x: Tensor, w: Tensor, b: Tensor, mean: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dw, db)."""
    R, F = x.shape
    dev = x.device
    p = rowplan.plan(F, CONFIG, backward=True)
    br = p.block_r
    tiles = triton.cdiv(R, br)
    # the one-read kernel is persistent (partials per program), the looped one a program per tile
    progs = rowplan.programs(dev, tiles, p.warps, CONFIG) if p.rows_kernels else tiles
    dx = torch.empty((R, F), dtype=x.dtype, device=dev)
    pw = torch.empty((progs, F), dtype=torch.float32, device=dev)
    pb = torch.empty((progs, F), dtype=torch.float32, device=dev)
    ptrs = (x, w, dy, mean, rstd, dx, pw, pb, R, F)
    strides = (*x.stride(), w.stride(0), *dy.stride(), *dx.stride())
    # no FMA contraction: mean(g) is a sum of rounded products g = dy * w, and dx's g - mean(g) must subtract
    # the same rounded g (fused into fma(dy, w, -mean g) it leaves the product's rounding: at one feature, where
    # the exact dx is 0, that failed on an H200, layernorm/triton/float32/R3-F1)
    consts = {"BLOCK_R": br, "BLOCK_F": p.block_f, "num_warps": p.warps, "enable_fp_fusion": False}
    if p.rows_kernels:
        K._bwd_rows_kernel[(progs,)](*ptrs, tiles, *strides, **consts)
    else:
        K._bwd_kernel[(progs,)](*ptrs, *strides, **consts)
    dw = torch.empty((F,), dtype=w.dtype, device=dev)
    db = torch.empty((F,), dtype=b.dtype, device=dev)
    _reduce(pw, dw)
    _reduce(pb, db)
    return dx, dw, db


class LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        y, mean, rstd = forward(x, w, b, eps)
        ctx.save_for_backward(x, w, b, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w, b, mean, rstd = ctx.saved_tensors
        dx, dw, db = backward(dy, x, w, b, mean, rstd)
        return dx, dw, db, None


def layernorm_triton(x: Tensor, w: Tensor, b: Tensor, *, eps: float = 1e-5) -> dict[str, Tensor]:
    """LayerNorm of x [R, F] with weight w [F] and bias b [F]: {"y"}."""
    return {"y": LayerNormFn.apply(x, w, b, eps)}
