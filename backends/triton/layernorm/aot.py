"""Ahead-of-time compile targets of the layernorm kernels: the constexpr combos the GPU launches use.

Forward and backward in each x dtype, and the dw/db reduction per parameter dtype. Block sizes come from
the wrapper's GPU configuration; unit innermost strides and 16-aligned row strides are specialized as the
JIT does for contiguous tensors at production sizes (F = 4096).
"""

from __future__ import annotations

from harness.backends.triton import _rowplan as rowplan

from harness.tools.triton_aot import rowwise_target

from . import kernels as K
from .wrapper import GPU_CONFIG as C

# pointers that carry x's dtype (w, b, y and the gradients share it); the others are float32
_DATA = {"x_ptr", "w_ptr", "b_ptr", "y_ptr", "dy_ptr", "dx_ptr", "out_ptr"}
_UNIT = ("sxf", "sw", "sb", "syf", "sdyf", "sdxf", "so")
_ALIGNED = {"sxr", "syr", "sdyr", "sdxr", "F"}


def _target(name: str, fn, dtype: str, constexprs: dict, warps: int) -> dict:
    return rowwise_target(name, fn, dtype, constexprs, warps, _DATA, _UNIT, _ALIGNED)


def aot_targets() -> list[dict]:
    out = []
    blocks = {"BLOCK_R": C["BLOCK_R"], "BLOCK_F": C["BLOCK_F"]}
    for dt in ("bf16", "fp16", "fp32"):
        out.append(_target(f"fwd-{dt}", K._fwd_kernel, dt, dict(blocks), C["warps"]))
        bwd = _target(f"bwd-{dt}", K._bwd_kernel, dt, dict(blocks), C["warps"])
        bwd["options"]["enable_fp_fusion"] = False  # as wrapper.backward launches it
        out.append(bwd)
        out.append(_target(f"reduce-{dt}", K._reduce_kernel, dt, {"BLOCK_T": C["red_t"], "BLOCK_F": C["red_f"]},
                           C["red_warps"]))
        # the one-read kernels at the production widths (F = 4096 and 8192: one row a tile)
        for F in (4096, 8192):
            p, pb = rowplan.plan(F, C), rowplan.plan(F, C, backward=True)
            rows = {"BLOCK_R": p.block_r, "BLOCK_F": p.block_f}
            out.append(_target(f"fwd-rows-F{F}-{dt}", K._fwd_rows_kernel, dt, dict(rows), p.warps))
            bwd = _target(f"bwd-rows-F{F}-{dt}", K._bwd_rows_kernel, dt, dict(rows), pb.warps)
            bwd["options"]["enable_fp_fusion"] = False
            out.append(bwd)
    return out
