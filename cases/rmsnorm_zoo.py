"""Bug-zoo mutants of the Triton rmsnorm backend (docs/specs/rmsnorm.md#zoo, docs/specs/bug-zoo.md): the
classic bugs of a row-tiled norm kernel, planted in a copy of backends/triton/rmsnorm/. They run on the CPU
under the interpreter (32-feature, 8-row blocks) and on a GPU (512 x 16).

R33 spans five interpreter row tiles (four full, one of a single row) and three GPU ones (16 rows a tile, as
the one-read kernels cut F130). F130 spans five interpreter feature blocks (the last of 2 features) but one
GPU block, so a mutant planted in the looped kernels' feature loop takes F8500: past the one-read kernels'
8192 features on a GPU, it is looped there in 17 blocks (the last of 308 features), and in 266 interpreter
blocks (the last of 20).
"""

from __future__ import annotations

from harness.cases.rmsnorm import C

from harness import Expectation, Mutant, register_mutant
from harness.model.twins import twin

CASE = C("R33-F130", 33, 130, ("size",))
CASE_WIDE = C("R33-F8500", 33, 8500, ("size",))
CASE_RES = C("R17-F100-res", 17, 100, ("residual",), residual=True)
_PART = ("        part = tl.sum(dy * h * rstd[:, None], axis=0)\n"
         "        tl.store(part_ptr + pid * F + cols, part, mask=fmask)\n")
# compiled Triton sees a name after a loop only where it was bound before it: the store moved out of the loop
# needs cols, fmask and part bound ahead of the loop (the interpreter, plain Python, would not)
_BEFORE_LOOP = "    c = tl.div_rn(tl.sum(acc, axis=1), tl.zeros([BLOCK_R], tl.float32) + F) * rstd * rstd\n"
_BOUND = _BEFORE_LOOP + ("    cols = offs\n    fmask = cols < F\n"
                         "    part = tl.zeros([BLOCK_F], dtype=tl.float32)\n")

register_mutant(Mutant(
    id="rmsnorm-dw-16bit", operator="rmsnorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="the dw partials of the row tiles are summed in float16 (the reduction's accumulator cast "
                "down before the sum)",
    edits=(("kernels.py", "tl.store(dw_ptr + cols * sdw, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=fmask)",
            "tl.store(dw_ptr + cols * sdw, tl.sum(acc.to(tl.float16), axis=0).to(dw_ptr.dtype.element_ty), "
            "mask=fmask)"),),
    # on a GPU F130 is one feature block and R33 three row tiles: no axis has the three slices whose
    # profile the precision hint reads, and the hint says "none" rather than guess (H200, f9032ce)
    expect=(Expectation(CASE, "float32", fail=("dw",), passing=("y", "dx"), hint="precision|none"),),
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
    edits=(("kernels.py", _PART, _PART.replace("        tl.store", "    tl.store")),
           ("kernels.py", _BEFORE_LOOP, _BOUND)),
    expect=(Expectation(CASE_WIDE, "float32", fail=("dw",), passing=("y", "dx"),
                        where={"dw": {"feature": "all-but-last"}}),),
))

register_mutant(Mutant(
    id="rmsnorm-residual-not-written", operator="rmsnorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="the fused residual add never stores residual_out (h = x + residual is only used for the norm)",
    edits=(("kernels.py", "        tl.store(ro_ptr + rows[:, None] * sor + cols[None, :] * sof, "
            "h.to(ro_ptr.dtype.element_ty), mask=mask)", "        pass"),),
    expect=(Expectation(CASE_RES, "float32", fail=("residual_out",), passing=("y", "dx", "dresidual", "dw"),
                        where={"residual_out": {"row": "all", "feature": "all"}}),),
))

# Layouts real backward passes receive (issue #44): y.sum().backward() hands dy on as one value expanded to
# [R, F], every stride 0 (pytorch #194719, flash-linear-attention #1138). The wrapper passes dy's row and
# feature strides as those of a contiguous [R, F] tensor: the kernel reads the NaN behind the one value. Its
# base case, with a contiguous dy, passes; the expand twin's hint says the layout is the difference.
PLAIN = C("R17-F100", 17, 100, ("size",))
register_mutant(Mutant(
    id="rmsnorm-dy-read-contiguous", operator="rmsnorm", backend="triton", seed="issue 44 (stride-0 gradients)",
    description="the upstream gradient addressed as a contiguous [R, F] tensor, whatever its strides",
    edits=(("wrapper.py", "w.stride(0), *dy.stride(), *ds, *dx.stride())", "w.stride(0), F, 1, *ds, *dx.stride())"),),
    expect=(Expectation(twin(PLAIN, "expand"), "float32", fail=("dx", "dw"), passing=("y",), hint="layout"),
            Expectation(PLAIN, "float32", passing=("y", "dx", "dw"))),
))

# An unaligned data pointer (issue #44): the wrapper rounds dy's data pointer down to a 16-byte boundary, as a
# vector kernel that loads whole 16-byte vectors from the row's start and drops the scalar head before the
# first aligned address would. Every layout the presets draw starts aligned, so only the unaligned twin, one
# element past a boundary, reads the NaN before dy.
register_mutant(Mutant(
    id="rmsnorm-dy-assumed-aligned", operator="rmsnorm", backend="triton", seed="issue 44 (unaligned pointers)",
    description="the upstream gradient's data pointer rounded down to 16 bytes (a vector loop without its head)",
    edits=(("wrapper.py", "    ptrs = (x, r, w, dy, d, rstd, dx, part, R, F)",
            "    ptrs = (x, r, w, torch.as_strided(dy, dy.shape, dy.stride(), dy.storage_offset() // (16 // "
            "dy.element_size()) * (16 // dy.element_size())), d, rstd, dx, part, R, F)"),),
    expect=(Expectation(twin(PLAIN, "unaligned"), "float32", fail=("dx", "dw"), passing=("y",), hint="layout"),
            Expectation(twin(PLAIN, "offset"), "float32", passing=("y", "dx", "dw")),
            Expectation(PLAIN, "float32", passing=("y", "dx", "dw"))),
))
