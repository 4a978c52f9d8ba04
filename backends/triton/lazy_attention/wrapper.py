"""Launch helpers, the autograd Function and ``lazy_attention_triton`` (specs/lazy_attention.md)."""

from __future__ import annotations

import math
import os

import torch
import triton

from .kernels import (
    _lazy_bwd_delta_kernel,
    _lazy_bwd_dkdv_kernel,
    _lazy_bwd_dq_ds_kernel,
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


def _budget_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name} must be a byte count >= 0 (e.g. 0 or 2147483648); got {raw!r}")
    return value


# The backward stores ds (about B*H*L*L/2 elements of q's dtype) and computes dq from it, unless that
# takes more than this many bytes (env LAZY_ATTENTION_DS_BUDGET); then a dq kernel recomputes p and dp.
DS_BUDGET_BYTES = _budget_from_env("LAZY_ATTENTION_DS_BUDGET", 2 << 30)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def config(kernel: str, dh: int, dtype: torch.dtype) -> dict:
    """Block sizes and launch options of ``kernel`` ("lse", "fwd", "delta", "delta_dq", "dkdv", "dkdv_ds",
    "dq_ds") for head dim ``dh``."""
    if _interpreted():
        if kernel in INTERPRET_OVERRIDES:
            return dict(INTERPRET_OVERRIDES[kernel])
        b = INTERPRET_BLOCK
        return {"lse": {"BLOCK_M": b, "BLOCK_L": b}, "fwd": {"BLOCK_M": b, "BLOCK_N": b},
                "delta": {"BLOCK_M": b, "BLOCK_N": b}, "delta_dq": {"BLOCK_M": b, "BLOCK_N": b},
                "dkdv": {"BLOCK_M": b, "BLOCK_N": b},
                "dkdv_ds": {"BLOCK_M": b, "BLOCK_N": 2 * b}, "dq_ds": {"BLOCK_M": b}}[kernel]
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
                "delta_dq": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
                "dkdv": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
                "dkdv_ds": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
                "dq_ds": {"BLOCK_M": 32, "num_warps": 4, "num_stages": 2}}[kernel]
    # 16-bit inputs (Hopper, wgmma): the fastest of two sweeps at B=4, H=16, L=4096, W=512 on an H200
    # (.scratch sweep, each kernel timed alone with triton.testing.do_bench, outputs checked against the
    # previous config's). Dh=128 (ms):
    #   fwd 128x64 (LSE pass in 128-key blocks), 8 warps, 2 stages 1.75; 64-key LSE blocks, 3 stages 1.82;
    #     1 stage 1.76; 4-warp 64-row tiles 2.15-2.26; 128x128 tiles 1.95 (3+ stages overflow shared memory).
    #   dq 128-row tiles, 8 warps, 1 stage 3.10; 64-row tiles with 4 warps, 3 stages 3.44 (2 or 4 stages, or
    #     128-key Delta/far blocks 3.43-3.74); 64-row tiles with 8 warps 3.80-4.33; 128-row tiles with 2+
    #     stages overflow shared memory.
    #   dk/dv 64x128 (queries x keys), 8 warps, 1 stage 1.87; 2 stages 2.33; 3 stages 2.39; 32x128 2.6;
    #     4 warps 6.1-9.3 (register spills); 64x64 3.5-3.8; 128x64 3.06.
    # Dh=64: fwd 64x64 tiles with 4 warps 1.26 vs 1.54 for 128x64; dq 64-row tiles, 4 warps 1.81 vs 2.6-2.8
    # for wider blocks (128-row, 2 stages included); dk/dv 64x128, 8 warps, 2 stages 1.47 vs 1.76-2.4
    # (1-stage dq/dk/dv configs not measured at Dh=64). Dh=16/32 take the Dh=64 settings (not swept).
    # The Delta pass was then inside the dq kernel (1 stage, BLOCK_D = 64 keys); as a kernel of its own it
    # takes the forward's tiles with pipelined loads. Retimed on an H100 with the Delta kernel (fwd+bwd,
    # .scratch/lazy_cfg.py): dq 64-row tiles, 4 warps, 3 stages 6.29 vs 6.52 for 128-row tiles with 8
    # warps and 1 stage (255 registers and 300 B of spills; the 64-row kernel spills 28 B); 2 or 4 stages
    # 6.33-6.38; 32-key far blocks 6.47; 32-row tiles 7.10. Delta 128x64 with 4 stages the same as 3;
    # dk/dv 32x128 (7.20), 64x64 (6.83) and 32x64 (7.09) all slower than 64x128.
    # The LSE pass as a kernel of its own (H100, forward alone): 64x64 tiles, 4 warps, 3 stages 1.61 ms
    # vs 1.71 for the one-kernel forward; 128x64 with 8 warps 1.64 (3 or 4 stages); 128-key blocks
    # 1.80-1.85. The output kernel keeps 128x64, 8 warps, 2 stages (3 stages 1.64, 128x128 1.70).
    # The ds path (H100, fwd+bwd, .scratch/lazy_ds_ab.py, SDPA 2.09 and the recompute path 6.12 in the same
    # run): dk/dv+ds 32x64 (queries x keys), 4 warps, 1 stage 5.05 ms; 2 stages 5.71; 64x128 with 8 warps,
    # 1 stage 5.82 (132 spills), 2 stages 5.91. dq from ds: 64-row tiles, 4 warps, 3 stages (0.47 ms);
    # 128-row with 8 warps the same. In the 64x128 kernel (timed alone, .scratch/lazy_diag.py) the ds store
    # cost 0.47 ms, the dbias chunks 0.32 and dtau (float64 column sums) 1.08, hence dtau moved to Delta.
    # Dh <= 64 takes the same ds-path tiles. ds vs recompute path, fwd+bwd in one run (.scratch/lazy_dh_ab.py
    # on branch lazy-fused-bwd): B=4, H=16, L=4096: Dh=64 3.80 vs 4.29 ms, Dh=32 3.20 vs 3.93; B=8, L=1024:
    # Dh=64 1.04 vs 1.24, Dh=128 1.18 vs 1.60; B=2, L=8192, Dh=64 6.39 vs 6.86 (ds 2.16 GB: over the default
    # budget, so that shape recomputes unless the budget is raised).
    if dh <= 64:
        return {"lse": {"BLOCK_M": 64, "BLOCK_L": 128, "num_warps": 4, "num_stages": 3},
                "fwd": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
                "delta": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
                "delta_dq": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
                "dkdv": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
                "dkdv_ds": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
                "dq_ds": {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}}[kernel]
    return {"lse": {"BLOCK_M": 64, "BLOCK_L": 64, "num_warps": 4, "num_stages": 3},
            "fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
            "delta": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
            "delta_dq": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
            "dkdv": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
            "dkdv_ds": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1},
            "dq_ds": {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}}[kernel]


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


def _launch_opts(cfg: dict) -> dict:
    return {k: cfg[k] for k in ("num_warps", "num_stages") if k in cfg}


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
        DH=DH, BLOCK_M=cl["BLOCK_M"], BLOCK_L=cl["BLOCK_L"], PREC=_precision(q.dtype), **_launch_opts(cl))
    cfg = config("fwd", DH, q.dtype)
    _lazy_fwd_kernel[(triton.cdiv(L, cfg["BLOCK_M"]), H, B)](
        q, k, v, bias, tau, lse, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        bias.stride(0), bias.stride(1), tau.stride(0), H, L, W, scale * LOG2E,
        DH=DH, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], PREC=_precision(q.dtype), **_launch_opts(cfg))
    return o, lse


def lazy_backward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, o: Tensor,
                  do: Tensor, scale: float,
                  ds_budget: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv (input dtype), dbias [H,W] and dtau [H] (float32), all computed by the kernels; the ds
    path where ds fits ``ds_budget`` bytes (None: DS_BUDGET_BYTES), else the fused path."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    dev = q.device
    dq = torch.empty((B, H, L, DH), dtype=q.dtype, device=dev)
    dk = torch.empty((B, H, L, DH), dtype=k.dtype, device=dev)
    dv = torch.empty((B, H, L, DH), dtype=v.dtype, device=dev)
    delta = torch.empty((B, H, L), dtype=torch.float32, device=dev)

    if ds_bytes(q) <= (DS_BUDGET_BYTES if ds_budget is None else ds_budget):
        tau_part = launch_delta(q, k, v, bias, tau, lse, do, scale, delta)
        part = launch_ds_path(q, k, v, bias, tau, lse, do, scale, delta, dq, dk, dv)
    else:
        part, tau_part = launch_fused_path(q, k, v, bias, tau, lse, do, o, scale, delta, dq, dk, dv)

    dbias = torch.zeros((H, W), dtype=torch.float32, device=dev)
    dtau = torch.zeros((H,), dtype=torch.float32, device=dev)
    bw = REDUCE_BLOCK   # (H, (W+1)/128) programs, each summing the partial rows in a fixed order
    _lazy_bwd_reduce_kernel[(H, triton.cdiv(W + 1, bw))](part, tau_part, dbias, dtau, part.shape[0],
                                                         tau_part.shape[0], H, W, BLOCK_W=bw)
    return dq, dk, dv, dbias, dtau


def launch_delta(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, do: Tensor,
                 scale: float, delta: Tensor, o: Tensor | None = None, dq: Tensor | None = None) -> Tensor:
    """Runs the Delta kernel: delta [B, H, L] = sum_j p dp, float32, and dq where given (with the forward's
    output o; "delta_dq" tiles); returns the dtau shares [B * n_m, H]."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    with_dq = dq is not None
    if with_dq and o is None:
        raise ValueError("the Delta kernel's dq takes the forward's output: o must be given with dq")
    cd = config("delta_dq" if with_dq else "delta", DH, q.dtype)
    if with_dq and cd["BLOCK_M"] % cd["BLOCK_N"]:
        raise ValueError(f"delta_dq BLOCK_M must be a multiple of BLOCK_N (its diagonal tile is BLOCK_M keys); "
                         f"got {cd}")
    n_m = triton.cdiv(L, cd["BLOCK_M"])
    tau_part = torch.empty((B * n_m, H), dtype=torch.float32, device=q.device)
    # without DQ_OUT the kernel never touches O and DQ: any tensors of their dtype do
    o_in, dq_in = (o, dq) if with_dq else (q, q)
    _lazy_bwd_delta_kernel[(n_m, H, B)](
        q, k, v, do, o_in, bias, tau, lse, delta, tau_part, dq_in, *q.stride(), *k.stride(), *v.stride(),
        *do.stride(), *o_in.stride(), *dq_in.stride(), bias.stride(0), bias.stride(1), tau.stride(0), H, L, W,
        scale * LOG2E, scale, DH=DH, BLOCK_M=cd["BLOCK_M"], BLOCK_N=cd["BLOCK_N"], DQ_OUT=with_dq,
        PREC=_precision(q.dtype), **_launch_opts(cd))
    return tau_part


def launch_dkdv(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, do: Tensor,
                scale: float, delta: Tensor, dk: Tensor, dv: Tensor, ds: Tensor | None = None,
                part: Tensor | None = None) -> None:
    """Runs the dk/dv kernel (reads the delta of the Delta kernel). Given part it also writes the dbias
    partial rows [B * n_n, H, W]; given ds too (the ds path, "dkdv_ds" tiles) it stores ds."""
    B, H, L, DH = q.shape
    W = bias.shape[1]
    store = ds is not None
    if store and part is None:
        raise ValueError("the ds path takes dbias partial rows as well: part must be given with ds")
    ckv = config("dkdv_ds" if store else "dkdv", DH, q.dtype)
    # without STORE_DS (DBIAS) the kernel never touches DS (Part): any pointers of their dtypes do
    ds_in = ds if store else dk
    part_in = part if part is not None else delta
    _lazy_bwd_dkdv_kernel[(triton.cdiv(L, ckv["BLOCK_N"]), H, B)](
        q, k, v, do, bias, tau, lse, delta, dk, dv, ds_in, part_in, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dk.stride(), *dv.stride(), bias.stride(0), bias.stride(1), tau.stride(0), H, L, W,
        scale * LOG2E, scale, DH=DH, BLOCK_M=ckv["BLOCK_M"], BLOCK_N=ckv["BLOCK_N"], STORE_DS=store,
        DBIAS=part is not None, PREC=_precision(q.dtype), **_launch_opts(ckv))


def dkdv_part(q: Tensor, bias: Tensor, tiles: str) -> Tensor:
    """Zeroed dbias partial rows [B * n_n, H, W] of the dk/dv kernel launched with ``tiles``' key blocks."""
    B, H, L, DH = q.shape
    n_n = triton.cdiv(L, config(tiles, DH, q.dtype)["BLOCK_N"])
    return torch.zeros((B * n_n, H, bias.shape[1]), dtype=torch.float32, device=q.device)


def launch_fused_path(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, do: Tensor,
                      o: Tensor, scale: float, delta: Tensor, dq: Tensor, dk: Tensor,
                      dv: Tensor) -> tuple[Tensor, Tensor]:
    """Delta, the dtau shares and dq in one pass over p and dp; then dk, dv and the dbias partial rows in a
    second. Returns (dbias partial rows [B * n_n, H, W], dtau shares [B * n_m, H])."""
    tau_part = launch_delta(q, k, v, bias, tau, lse, do, scale, delta, o, dq)
    part = dkdv_part(q, bias, "dkdv")
    launch_dkdv(q, k, v, bias, tau, lse, do, scale, delta, dk, dv, part=part)
    return part, tau_part


def ds_bytes(q: Tensor) -> int:
    """Bytes of the ds strips of the one-pass dk/dv kernel: B*H strips of BLOCK_N keys x the queries from
    each key block on (about half of B*H*L*L elements, in q's dtype)."""
    B, H, L, DH = q.shape
    bn = config("dkdv_ds", DH, q.dtype)["BLOCK_N"]
    n_n = triton.cdiv(L, bn)
    return B * H * bn * (n_n * L - bn * n_n * (n_n - 1) // 2) * q.element_size()


def launch_ds_path(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, lse: Tensor, do: Tensor,
                   scale: float, delta: Tensor, dq: Tensor, dk: Tensor, dv: Tensor) -> Tensor:
    """dk, dv, dbias partials and ds in one pass over p and dp, then dq as a GEMM over the stored ds;
    returns the dbias partial rows [B * n_n, H, W]."""
    B, H, L, DH = q.shape
    ck, cq = config("dkdv_ds", DH, q.dtype), config("dq_ds", DH, q.dtype)
    bn = ck["BLOCK_N"]
    if ck["BLOCK_M"] not in (bn, bn // 2) or bn % cq["BLOCK_M"]:
        raise ValueError(f"dkdv_ds BLOCK_N ({bn}) must be BLOCK_M or 2 * BLOCK_M and a multiple of dq_ds BLOCK_M; "
                         f"got {ck} and {cq}")
    part = dkdv_part(q, bias, "dkdv_ds")
    ds = torch.empty((ds_bytes(q) // q.element_size(),), dtype=q.dtype, device=q.device)
    launch_dkdv(q, k, v, bias, tau, lse, do, scale, delta, dk, dv, ds, part)
    _lazy_bwd_dq_ds_kernel[(triton.cdiv(L, cq["BLOCK_M"]), H, B)](
        k, ds, dq, *k.stride(), *dq.stride(), H, L, scale, DH=DH, BLOCK_M=cq["BLOCK_M"], BLOCK_N=bn,
        PREC=_precision(q.dtype), **_launch_opts(cq))
    return part


class LazyAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, scale: float,
                ds_budget: int | None) -> Tensor:
        o, lse = lazy_forward(q, k, v, bias, tau, scale)
        if any(ctx.needs_input_grad[:5]):
            ctx.save_for_backward(q, k, v, bias, tau, lse, o)
        ctx.scale = scale
        ctx.ds_budget = ds_budget
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        q, k, v, bias, tau, lse, o = ctx.saved_tensors
        dq, dk, dv, dbias, dtau = lazy_backward(q, k, v, bias, tau, lse, o, do.to(q.dtype), ctx.scale,
                                                ctx.ds_budget)
        return dq, dk, dv, dbias, dtau, None, None


def lazy_attention_triton(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                          scale: float | None = None, ds_budget: int | None = None) -> dict[str, Tensor]:
    """Lazy attention on Triton kernels: {"o": o}, differentiable in q, k, v, bias and tau. The backward
    stores ds where it takes at most ``ds_budget`` bytes (None: DS_BUDGET_BYTES), else recomputes."""
    _check(q, k, v, bias, tau)
    if ds_budget is not None and (isinstance(ds_budget, bool) or not isinstance(ds_budget, int) or ds_budget < 0):
        raise ValueError(f"ds_budget must be a byte count >= 0 or None; got {ds_budget!r}")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return {"o": LazyAttentionFn.apply(q, k, v, bias, tau, s, ds_budget)}


def lazy_attention_triton_recompute(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                                    scale: float | None = None) -> dict[str, Tensor]:
    """The same operator with the recompute backward (no stored ds: less memory, slower)."""
    return lazy_attention_triton(q, k, v, bias, tau, scale=scale, ds_budget=0)
