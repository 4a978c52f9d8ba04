"""Ahead-of-time compile targets of the lazy_attention kernels (the GPU's constexpr combos).

Compiled for sm_90 in CI without a GPU, so that errors only the GPU compiler sees (layouts of
tl.gather, dot shapes, shared memory) show up there too.
"""

from __future__ import annotations

import torch

from . import kernels as K
from .wrapper import REDUCE_BLOCK, gpu_config, launch_opts

_PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
_FLOATS = ("qk_scale", "scale")
# which pointer arguments carry the input dtype (the others are float32 tensors)
_DATA = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "DS"}
_SIZES = {"H", "L", "W", "R", "R2"}


def _signature(fn, dtype: torch.dtype, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name[0].isupper() and name not in _SIZES:
            sig[name] = _PTR[dtype] if name in _DATA else "*fp32"
        elif name in _FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _target(name: str, fn, dtype: torch.dtype, constexprs: dict, cfg: dict | None = None) -> dict:
    return {"name": name, "kernel": fn, "signature": _signature(fn, dtype, constexprs),
            "constexprs": constexprs, "options": launch_opts(cfg or {})}


def aot_targets() -> list[dict]:
    """Each kernel once per head dim, the dtypes spread over them (bf16, fp32 with ieee dots, fp16).

    Kept to one dtype per head dim: ptxas takes up to minutes per fp32 kernel on a CI core, and the
    layouts that differ between head dims and dtypes are what this is for.
    """
    combos = [(torch.bfloat16, 16), (torch.float32, 32), (torch.float16, 64), (torch.bfloat16, 128)]
    out = []
    for dtype, dh in combos:
        tag = f"{str(dtype).replace('torch.', '')}-dh{dh}"
        prec = "ieee" if dtype == torch.float32 else "tf32"
        ls, f, dl, kv = (gpu_config(k, dh, dtype) for k in ("lse", "fwd", "delta", "dkdv"))
        out.append(_target(f"lse-{tag}", K._lazy_fwd_lse_kernel, dtype,
                           {"DH": dh, "BLOCK_M": ls["BLOCK_M"], "BLOCK_L": ls["BLOCK_L"], "PREC": prec}, ls))
        out.append(_target(f"fwd-{tag}", K._lazy_fwd_kernel, dtype,
                           {"DH": dh, "BLOCK_M": f["BLOCK_M"], "BLOCK_N": f["BLOCK_N"], "PREC": prec}, f))
        out.append(_target(f"delta-{tag}", K._lazy_bwd_delta_kernel, dtype,
                           {"DH": dh, "BLOCK_M": dl["BLOCK_M"], "BLOCK_N": dl["BLOCK_N"], "PREC": prec}, dl))
        out.append(_target(f"dkdv-{tag}", K._lazy_bwd_dkdv_kernel, dtype,
                           {"DH": dh, "BLOCK_M": kv["BLOCK_M"], "BLOCK_N": kv["BLOCK_N"], "SPAN": kv.get("SPAN", 0),
                            "PREC": prec}, kv))
    out.append(_target("reduce", K._lazy_bwd_reduce_kernel, torch.float32, {"BLOCK_W": REDUCE_BLOCK}))
    return out
