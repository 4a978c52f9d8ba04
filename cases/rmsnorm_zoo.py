"""Bug-zoo mutants of the Triton rmsnorm backend (docs/specs/rmsnorm.md#zoo, docs/specs/bug-zoo.md): the
classic bugs of a row-tiled norm kernel, planted in a copy of backends/triton/rmsnorm/. They run on the CPU
under the interpreter (32-feature, 8-row blocks) and on a GPU (512 x 16).

Each expectation's case is a case of the CPU sweep: R33 spans five interpreter row tiles (four full, one of
a single row) and F130 five feature blocks (the last of 2 features).
"""

from __future__ import annotations

from harness.cases.rmsnorm import C

from harness import Expectation, Mutant, register_mutant

CASE = C("R33-F130", 33, 130, ("size",))
CASE_RES = C("R17-F100-res", 17, 100, ("residual",), residual=True)
_PART = ("        part = tl.sum(dy * h * rstd[:, None], axis=0)\n"
         "        tl.store(part_ptr + pid * F + cols, part, mask=fmask)\n")

register_mutant(Mutant(
    id="rmsnorm-dw-16bit", operator="rmsnorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="the dw partials of the row tiles are summed in float16 (the reduction's accumulator cast "
                "down before the sum)",
    edits=(("kernels.py", "tl.store(dw_ptr + cols * sdw, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=fmask)",
            "tl.store(dw_ptr + cols * sdw, tl.sum(acc.to(tl.float16), axis=0).to(dw_ptr.dtype.element_ty), "
            "mask=fmask)"),),
    expect=(Expectation(CASE, "float32", fail=("dw",), passing=("y", "dx"), hint="precision"),),
))

register_mutant(Mutant(
    id="rmsnorm-row-tail-dropped", operator="rmsnorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="the backward's grid is R // BLOCK_R row tiles, not cdiv: the last, partial row tile never runs "
                "(its dx rows stay as allocated and dw misses their terms)",
    edits=(("wrapper.py", "    tiles = triton.cdiv(R, br)\n", "    tiles = R // br\n"),),
    expect=(Expectation(CASE, "float32", fail=("dx", "dw"), passing=("y",), where={"dx": {"row": "last"}}),),
))

register_mutant(Mutant(
    id="rmsnorm-dw-last-block-only", operator="rmsnorm", backend="triton",
    seed="issue 47; the example plugin's example-triton-wrong",
    description="the dw partial's store one indent short, after the feature loop: only the last feature "
                "block's partial is stored, the others stay as allocated",
    edits=(("kernels.py", _PART, _PART.replace("        tl.store", "    tl.store")),),
    expect=(Expectation(CASE, "float32", fail=("dw",), passing=("y", "dx"),
                        where={"dw": {"feature": "all-but-last"}}),),
))

register_mutant(Mutant(
    id="rmsnorm-residual-not-written", operator="rmsnorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="the fused residual add never stores residual_out (h = x + residual is only used for the norm)",
    edits=(("kernels.py", "            tl.store(ro_ptr + rows[:, None] * sor + cols[None, :] * sof, "
            "h.to(ro_ptr.dtype.element_ty), mask=mask)", "            pass"),),
    expect=(Expectation(CASE_RES, "float32", fail=("residual_out",), passing=("y", "dx", "dresidual", "dw"),
                        where={"residual_out": {"row": "all", "feature": "all"}}),),
))
