"""Ahead-of-time compile targets of the gated MLP kernels: the constexpr combos the GPU launches use.

Each activation (silu, gelu erf, gelu tanh) for the forward and backward kernels, in bf16 (the training
dtype) and, for silu, fp16 and fp32; the wrapper's GPU tiles. Contiguous tensors at production sizes: the
feature stride is specialized as constexpr 1 (what vectorizes) and row strides and pointers are 16-aligned,
as the JIT sees them.
"""

from __future__ import annotations

from . import kernels as K
from .wrapper import ACTS
from .wrapper import GPU_CONFIG as C

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
# feature strides (unit for contiguous tensors) and row strides (multiples of 16 at production sizes)
_UNIT = ("sgf", "suf", "sof", "sdf", "sdgf", "sduf")
_ALIGNED = ("sgr", "sur", "sor", "sdr", "sdgr", "sdur", "F")


def _target(name: str, fn, dtype: str, act: int) -> dict:
    constexprs = {a: 1 for a in _UNIT if a in fn.arg_names}
    constexprs |= {"ACT": act, "BLOCK_R": C["BLOCK_R"], "BLOCK_F": C["BLOCK_F"]}
    sig = {a: "constexpr" if a in constexprs else _PTR[dtype] if a.endswith("_ptr") else "i32" for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if a not in constexprs and (a.endswith("_ptr") or a in _ALIGNED)]
    return {"name": name, "kernel": fn, "signature": sig, "constexprs": constexprs,
            "options": {"num_warps": C["warps"]}, "aligned": aligned}


def aot_targets() -> list[dict]:
    out = []
    for act, dtypes in (("silu", ("bf16", "fp16", "fp32")), ("gelu", ("bf16",)), ("gelu_tanh", ("bf16", "fp32"))):
        for dt in dtypes:
            out.append(_target(f"fwd-{act}-{dt}", K._fwd_kernel, dt, ACTS[act]))
            out.append(_target(f"bwd-{act}-{dt}", K._bwd_kernel, dt, ACTS[act]))
    return out
