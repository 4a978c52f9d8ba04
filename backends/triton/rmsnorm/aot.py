"""Ahead-of-time compile targets of the rmsnorm kernels: the constexpr combos the GPU launches use.

Forward and backward with and without the residual in each x dtype, and the dw reduction per dw dtype.
Block sizes come from the wrapper's GPU configuration; unit innermost strides and 16-aligned row strides
are specialized as the JIT does for contiguous tensors at production sizes (F = 4096).
"""

from __future__ import annotations

from harness.backends.triton import _rowplan as rowplan

from harness.tools.triton_aot import rowwise_target

from . import kernels as K
from .wrapper import GPU_CONFIG as C

# pointers that carry x's dtype (w, the outputs and the gradients share it); the others are float32
_DATA = {"x_ptr", "r_ptr", "w_ptr", "y_ptr", "ro_ptr", "dy_ptr", "dro_ptr", "dx_ptr", "dw_ptr"}
_UNIT = ("sxf", "srf", "syf", "sof", "sw", "sdyf", "sdof", "sdxf", "sdw")
_ALIGNED = {"sxr", "srr", "syr", "sor", "sdyr", "sdor", "sdxr", "F"}


def _target(name: str, fn, dtype: str, constexprs: dict, warps: int) -> dict:
    return rowwise_target(name, fn, dtype, constexprs, warps, _DATA, _UNIT, _ALIGNED)


def aot_targets() -> list[dict]:
    out = []
    blocks = {"BLOCK_R": C["BLOCK_R"], "BLOCK_F": C["BLOCK_F"]}
    for dt in ("bf16", "fp16", "fp32"):
        for res in (True, False):
            tag = f"{dt}{'-res' if res else ''}"
            out.append(_target(f"fwd-{tag}", K._fwd_kernel, dt, {"HAS_RES": res} | blocks, C["warps"]))
            out.append(_target(f"bwd-{tag}", K._bwd_kernel, dt, {"HAS_RES": res} | blocks, C["warps"]))
        out.append(_target(f"reduce-{dt}", K._reduce_kernel, dt, {"BLOCK_T": C["red_t"], "BLOCK_F": C["red_f"]},
                           C["red_warps"]))
        # the one-read kernels at the production widths (F = 4096 and 8192: one row a tile)
        for F in (4096, 8192):
            p, pb = rowplan.plan(F, C), rowplan.plan(F, C, backward=True)
            rows = {"BLOCK_R": p.block_r, "BLOCK_F": p.block_f}
            for res in (True, False):
                tag = f"F{F}-{dt}{'-res' if res else ''}"
                out.append(_target(f"fwd-rows-{tag}", K._fwd_rows_kernel, dt, {"HAS_RES": res} | rows, p.warps))
                out.append(_target(f"bwd-rows-{tag}", K._bwd_rows_kernel, dt, {"HAS_RES": res} | rows, pb.warps))
    return out
