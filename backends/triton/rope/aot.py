"""Ahead-of-time compile targets of the rope kernel: the constexpr combos the GPU launches use.

Both pair layouts, forward (SIGN 1) and backward (SIGN -1), at head dimensions 128 (64 pairs) and 64 in bf16, and
128 in fp16 and fp32; the wrapper's GPU tiles. Contiguous tensors: the head dimension's stride specialized as
constexpr 1 and the other strides and pointers 16-aligned, as the JIT sees them at production sizes.
"""

from __future__ import annotations

from . import kernels as K
from .wrapper import GPU_CONFIG as C

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
_UNIT = ("sxd", "syd")
_ALIGNED = ("sxb", "sxs", "sxh", "syb", "sy_s", "syh", "HALF")


def _target(name: str, dtype: str, sign: int, interleaved: bool, D: int) -> dict:
    fn = K._rope_kernel
    constexprs = {a: 1 for a in _UNIT} | {"SIGN": sign, "INTERLEAVED": interleaved, "BLOCK_T": C["BLOCK_T"],
                                          "BLOCK_H": C["BLOCK_H"], "BLOCK_P": D // 2}
    sig = {}
    for a in fn.arg_names:
        sig[a] = ("constexpr" if a in constexprs else "*fp32" if a == "inv_ptr" else _PTR[dtype]
                  if a.endswith("_ptr") else "i32")
    aligned = [a for a in fn.arg_names if a not in constexprs and (a.endswith("_ptr") or a in _ALIGNED)]
    return {"name": name, "kernel": fn, "signature": sig, "constexprs": constexprs,
            "options": {"num_warps": C["warps"]}, "aligned": aligned}


def aot_targets() -> list[dict]:
    out = []
    for dt, D in (("bf16", 128), ("bf16", 64), ("fp16", 128), ("fp32", 128)):
        for il in (False, True):
            for sign, pas in ((1, "fwd"), (-1, "bwd")):
                out.append(_target(f"{pas}-{'il' if il else 'half'}-{dt}-D{D}", dt, sign, il, D))
    return out
