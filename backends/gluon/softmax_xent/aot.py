"""Ahead-of-time compile targets of the Gluon rows kernel: every mode, each dtype, each way of feeding the ring.

Block sizes come from the wrapper's configuration; the pointers, the row strides and V are marked
16-divisible as the JIT finds them at production sizes (V = 128256), which is what vectorizes the stores.
"""

from __future__ import annotations

from triton.experimental.gluon import language as gl

from . import kernels as K
from .wrapper import CONFIG

_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_INTS = {"ls": "i64", "ds": "i64", "ts": "i64", "ignore_index": "i64", "gs": "i64", "N": "i32", "V": "i32"}
_ALIGNED = ("src_ptr", "out_ptr", "tgt_ptr", "stats_ptr", "loss_ptr", "inv_ptr", "g_ptr", "ls", "ds", "V")
# (mode, skip_if_one): the forward without and with dlogits, the recomputing and the in-place backward
_MODES = ((0, False), (1, False), (2, True), (3, True))
# how the ring is fed (kernels.py): pointer loads, TMA loads issued by a producer warp
_RINGS = {0: "ptr", 1: "tma"}


def _descriptor_type(dtype: str, block_v: int) -> str:
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * _BYTES[dtype], rank=2)
    return f"tensordesc<{dtype}[1, {block_v}],{layout!r}>"


def _target(dtype: str, mode: int, skip: bool, ring: int, smooth: bool = False) -> dict:
    cfg = CONFIG[_BYTES[dtype]]
    consts = {"MODE": mode, "SKIP_IF_ONE": skip, "RING": ring, "SMOOTH": smooth, "BLOCK_V": cfg["BLOCK_V"],
              "STAGES": cfg["STAGES"], "VEC": 16 // _BYTES[dtype]}
    if not ring:
        consts["desc"] = None
    sig = {}
    for name in K.xent_rows_kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "desc":
            sig[name] = _descriptor_type(dtype, cfg["BLOCK_V"])
        elif name in ("src_ptr", "out_ptr"):
            sig[name] = f"*{dtype}"
        elif name == "tgt_ptr":
            sig[name] = "*i64"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        else:
            sig[name] = _INTS.get(name, "fp32")
    name = f"mode{mode}-{dtype}-{_RINGS[ring]}{'-smooth' if smooth else ''}"
    return {"name": name, "kernel": K.xent_rows_kernel,
            "signature": sig, "constexprs": consts, "options": {"num_warps": cfg["warps"]},
            "aligned": [a for a in _ALIGNED if a not in consts]}


def aot_targets() -> list[dict]:
    plain = [_target(dt, mode, skip, ring) for dt in ("bf16", "fp16", "fp32") for mode, skip in _MODES
             for ring in _RINGS]
    # label smoothing adds the per-lane sum of the logits to the statistics pass
    return plain + [_target(dt, 1, False, 1, smooth=True) for dt in ("bf16", "fp32")]
