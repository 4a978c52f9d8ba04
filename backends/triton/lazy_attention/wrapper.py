"""Launch helpers, the autograd Function and ``lazy_attention_triton`` (docs/specs/lazy_attention.md)."""

from __future__ import annotations

import math
import os

import torch
import triton

from .kernels import (
    _lazy_bwd_delta_kernel,
    _lazy_bwd_dkdv_kernel,
    _lazy_bwd_reduce_kernel,
    _lazy_fwd_kernel,
    _lazy_fwd_lse_kernel,
)

Tensor = torch.Tensor
LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
# Under the interpreter every block is 16, so that CPU-sized L spans several blocks.
INTERPRET_BLOCK = 16
REDUCE_BLOCK = 128
# Per-kernel launch settings can be replaced here (the GPU benchmark script sweeps them).
OVERRIDES: dict[str, dict] = {}
# The same under the interpreter (tests of mixed block sizes on CPU).
INTERPRET_OVERRIDES: dict[str, dict] = {}


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def config(kernel: str, dh: int, dtype: torch.dtype) -> dict:
    """Block sizes and launch options of ``kernel`` ("lse", "fwd", "delta", "dkdv") for head dim ``dh``."""
    if _interpreted():
        if kernel in INTERPRET_OVERRIDES:
            return dict(INTERPRET_OVERRIDES[kernel])
        b = INTERPRET_BLOCK
        return {"lse": {"BLOCK_M": b, "BLOCK_L": b}, "fwd": {"BLOCK_M": b, "BLOCK_N": b},
                "delta": {"BLOCK_M": b, "BLOCK_N": b},
                "dkdv": {"BLOCK_M": b, "BLOCK_N": b, "SPAN": 2 if dtype == torch.float32 else 0}}[kernel]
    return gpu_config(kernel, dh, dtype)


def gpu_config(kernel: str, dh: int, dtype: torch.dtype) -> dict:
    """The compiled (GPU) launch settings, also what aot.py compiles."""
    if kernel in OVERRIDES:
        return dict(OVERRIDES[kernel])
    if dtype == torch.float32:
        # ieee fp32 dots run on the FMA units: small tiles keep registers (and ptxas time) in bounds
        return {"lse": {"BLOCK_M": 32, "BLOCK_L": 32, "num_warps": 4, "num_stages": 1},
                "fwd": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
                "delta": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
                # dk/dv summed per 16 query blocks first (kernels._dkdv_range)
                "dkdv": {"BLOCK_M": 32, "BLOCK_N": 32, "SPAN": 16, "num_warps": 4, "num_stages": 1}}[kernel]
    # 16-bit inputs (Hopper, wgmma), B=4, H=16, L=4096, W=512.
    # Forward (H200 sweep, then H100): the LSE pass as a kernel of its own, 64x64 tiles, 4 warps, 3 stages
    #   1.61 ms (forward) vs 1.71 for a one-kernel forward; 128x64 with 8 warps 1.64; 128-key blocks 1.80-1.85.
    #   The output kernel (H100, forward with the LSE pass, .ci/lazy-ab at f49d8c7): 64x64 tiles, 4 warps,
    #   1 stage, at most 168 registers (3 programs an SM) 1.32 ms; 152 registers 1.33; 2 stages 1.41; 128x32
    #   with 8 warps at 128 registers 1.34-1.35; 128x64 at 128 registers 1.37-1.38, 112 1.78, 96 2.23; without
    #   a register cap 128x64 with 8 warps, 2 stages 1.62 (206 registers: one program an SM), 64x64 with 4
    #   warps, 3 stages 1.65. Dh=64: 0.98 vs 1.21 for 64x64 tiles, 3 stages, no cap.
    # Backward (H100, each kernel alone, .ci/lazy-ab at a8b6d1f), Dh=128, ms:
    #   Delta+dq 64x32 (queries x keys), 4 warps, 3 stages 1.49; 2 stages 1.55; 1 stage 1.72; 64x64 1.72-1.85;
    #     128x32 with 8 warps 1.68. All at 255 registers; ptxas spills least at 32-key blocks.
    #   dk/dv 32x64 (queries x keys), 4 warps, 1 stage 1.91; 2 stages 2.54; 64x64 2.14; 64x128 with 8 warps
    #     2.15-2.17; 128x128 6.9.
    # Dh=64 (103cc95): Delta+dq 64x64, 4 warps, 3 stages 0.88 (2 stages 0.93, 128x128 1.54); dk/dv 64x64,
    #   4 warps, 1 stage 1.28 (32x64 1.31, 64x128 with 8 warps 1.49). Dh=16/32 take the Dh=64 settings.
    if dh <= 64:
        return {"lse": {"BLOCK_M": 64, "BLOCK_L": 128, "num_warps": 4, "num_stages": 3},
                "fwd": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "maxnreg": 168},
                "delta": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
                "dkdv": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}}[kernel]
    return {"lse": {"BLOCK_M": 64, "BLOCK_L": 64, "num_warps": 4, "num_stages": 3},
            "fwd": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1, "maxnreg": 168},
            "delta": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
            "dkdv": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}}[kernel]


def checked_config(kernel: str, dh: int, dtype: torch.dtype) -> dict:
    """``config``, with the tile shapes the backward kernels assume checked (overrides included)."""
    cfg = config(kernel, dh, dtype)
    if kernel == "delta" and cfg["BLOCK_M"] % cfg["BLOCK_N"]:
        raise ValueError(f"delta BLOCK_M must be a multiple of BLOCK_N (its diagonal tile is BLOCK_M keys); "
                         f"got {cfg}")
    if kernel == "dkdv" and cfg["BLOCK_N"] not in (cfg["BLOCK_M"], 2 * cfg["BLOCK_M"]):
        raise ValueError(f"dkdv BLOCK_N must be BLOCK_M or 2 * BLOCK_M (the dbias diagonal chunks); got {cfg}")
    return cfg


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs: exact fp32 products (no tf32); 16-bit inputs use the tensor cores either way
    return "ieee" if dtype == torch.float32 else "tf32"


def _check(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share a [B,H,L,Dh] shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v must share one of float16/bfloat16/float32; "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} not supported; expected one of {HEAD_DIMS}")
    H = q.shape[1]
    if bias.dim() != 2 or bias.shape[0] != H or tau.shape != (H,):
        raise ValueError(f"bias must be [H, W] and tau [H] with H={H}; "
                         f"got {tuple(bias.shape)}, {tuple(tau.shape)}")
    if bias.dtype != torch.float32 or tau.dtype != torch.float32:
        raise ValueError(f"bias and tau must be float32; got {bias.dtype}, {tau.dtype}")


def launch_opts(cfg: dict) -> dict:
    return {k: cfg[k] for k in ("num_warps", "num_stages", "maxnreg") if k in cfg}


def lazy_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor,
                 scale: float) -> tuple[Tensor, Tensor]:
    """o [B,H,L,Dh] in q.dtype and lse2 [B,H,L] (float32, log2 units) for the backward."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    o = torch.empty((B, H, L, DH), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
    cl = config("lse", DH, q.dtype)
    _lazy_fwd_lse_kernel[(triton.cdiv(L, cl["BLOCK_M"]), H, B)](
        q, k, bias, lse, *q.stride(), *k.stride(), bias.stride(0), bias.stride(1), H, L, W, scale * LOG2E,
        DH=DH, BLOCK_M=cl["BLOCK_M"], BLOCK_L=cl["BLOCK_L"], PREC=_precision(q.dtype), **launch_opts(cl))
    cfg = config("fwd", DH, q.dtype)
    _lazy_fwd_kernel[(triton.cdiv(L, cfg["BLOCK_M"]), H, B)](
        q, k, v, bias, tau, lse, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        bias.stride(0), bias.stride(1), tau.stride(0), H, L, W, scale * LOG2E,
        DH=DH, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], PREC=_precision(q.dtype), **launch_opts(cfg))
    return o, lse


def lazy_backward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, o: Tensor,
                  do: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (input dtype), dbias [H,W] and dtau [H] (float32), all computed by the kernels: Delta and dq in
    one pass over p and dp, then dk, dv and the dbias partial rows in a second; nothing of size L*L."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    dev = q.device
    dq = torch.empty((B, H, L, DH), dtype=q.dtype, device=dev)
    dk = torch.empty((B, H, L, DH), dtype=k.dtype, device=dev)
    dv = torch.empty((B, H, L, DH), dtype=v.dtype, device=dev)
    delta = torch.empty((B, H, L), dtype=torch.float32, device=dev)
    tau_part = launch_delta(q, k, v, bias, tau, lse, o, do, scale, delta, dq)
    part = launch_dkdv(q, k, v, bias, tau, lse, do, scale, delta, dk, dv)
    dbias = torch.zeros((H, W), dtype=torch.float32, device=dev)
    dtau = torch.zeros((H,), dtype=torch.float32, device=dev)
    bw = REDUCE_BLOCK   # (H, (W+1)/128) programs, each summing the partial rows in a fixed order
    _lazy_bwd_reduce_kernel[(H, triton.cdiv(W + 1, bw))](part, tau_part, dbias, dtau, part.shape[0],
                                                         tau_part.shape[0], H, W, BLOCK_W=bw)
    return dq, dk, dv, dbias, dtau


def launch_delta(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, o: Tensor, do: Tensor,
                 scale: float, delta: Tensor, dq: Tensor) -> Tensor:
    """Runs the Delta kernel: delta [B, H, L] = sum_j p dp (float32) and dq, from the forward's lse and output o;
    returns the dtau shares [B * n_m, H]."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    cd = checked_config("delta", DH, q.dtype)
    n_m = triton.cdiv(L, cd["BLOCK_M"])
    tau_part = torch.empty((B * n_m, H), dtype=torch.float32, device=q.device)
    _lazy_bwd_delta_kernel[(n_m, H, B)](
        q, k, v, do, o, bias, tau, lse, delta, tau_part, dq, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *o.stride(), *dq.stride(), bias.stride(0), bias.stride(1), tau.stride(0), H, L, W,
        scale * LOG2E, scale, DH=DH, BLOCK_M=cd["BLOCK_M"], BLOCK_N=cd["BLOCK_N"], PREC=_precision(q.dtype),
        **launch_opts(cd))
    return tau_part


def launch_dkdv(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, do: Tensor,
                scale: float, delta: Tensor, dk: Tensor, dv: Tensor) -> Tensor:
    """Runs the dk/dv kernel (reads the delta of the Delta kernel); returns the dbias partial rows
    [B * n_n, H, W]."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    ckv = checked_config("dkdv", DH, q.dtype)
    n_n = triton.cdiv(L, ckv["BLOCK_N"])
    # one partial row of W dbias sums per (batch, key block, head)
    part = torch.zeros((B * n_n, H, W), dtype=torch.float32, device=q.device)
    _lazy_bwd_dkdv_kernel[(n_n, H, B)](
        q, k, v, do, bias, tau, lse, delta, dk, dv, part, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dk.stride(), *dv.stride(), bias.stride(0), bias.stride(1), tau.stride(0), H, L, W,
        scale * LOG2E, scale, DH=DH, BLOCK_M=ckv["BLOCK_M"], BLOCK_N=ckv["BLOCK_N"], SPAN=ckv.get("SPAN", 0),
        PREC=_precision(q.dtype), **launch_opts(ckv))
    return part


class LazyAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, scale: float) -> Tensor:
        o, lse = lazy_forward(q, k, v, bias, tau, scale)
        if any(ctx.needs_input_grad[:5]):
            # o: the Delta kernel's estimate g . o (see kernels._delta_range)
            ctx.save_for_backward(q, k, v, bias, tau, lse, o)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        q, k, v, bias, tau, lse, o = ctx.saved_tensors
        dq, dk, dv, dbias, dtau = lazy_backward(q, k, v, bias, tau, lse, o, do.to(q.dtype), ctx.scale)
        return dq, dk, dv, dbias, dtau, None


def lazy_attention_triton(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                          scale: float | None = None) -> dict[str, Tensor]:
    """Lazy attention on Triton kernels: {"o": o}, differentiable in q, k, v, bias and tau."""
    _check(q, k, v, bias, tau)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return {"o": LazyAttentionFn.apply(q, k, v, bias, tau, s)}
