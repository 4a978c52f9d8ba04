"""Bug-zoo mutants of the Triton layernorm backend (docs/specs/layernorm.md#bug-zoo, docs/specs/bug-zoo.md): the
classic bugs of a row-tiled norm kernel, planted in a copy of backends/triton/layernorm/. They run on the CPU
under the interpreter (32-feature, 8-row blocks) and on a GPU (512 x 16).

R33 spans five interpreter row tiles (four full, one of a single row) and three GPU ones (16 rows a tile, as
the one-read kernels cut F130). F130 spans five interpreter feature blocks (the last of 2 features) but one
GPU block, so a mutant planted in the looped kernels' feature loop takes F8500: past the one-read kernels'
8192 features on a GPU, it is looped there in 17 blocks (the last of 308 features), and in 266 interpreter
blocks (the last of 20).
"""

from __future__ import annotations

from harness.cases.layernorm import C

from harness import Expectation, Mutant, register_mutant

CASE = C("R33-F130", 33, 130, ("size",))
CASE_WIDE = C("R33-F8500", 33, 8500, ("size",))
_PB = "        tl.store(pb_ptr + pid * F + cols, tl.sum(dy, axis=0), mask=fmask)\n"
# compiled Triton sees a name after a loop only where it was bound before it: the store moved out of the loop
# needs cols, fmask and dy bound ahead of the loop (the interpreter, plain Python, would not)
_BEFORE_LOOP = "    mgx = tl.div_rn(tl.sum(sgx, axis=1), nf)\n"
_BOUND = _BEFORE_LOOP + ("    cols = offs\n    fmask = cols < F\n"
                         "    dy = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)\n")
_DX = "rstd[:, None] * (dy * w[None, :] - mg[:, None] - xhat * mgx[:, None])"

register_mutant(Mutant(
    id="layernorm-dw-16bit", operator="layernorm", backend="triton", seed="issue 47: classic norm-kernel bugs",
    description="dw's terms dy * xhat are cast down to float16 before they are summed (in both kernel families)",
    edits=(("kernels.py", "    return dy * xhat\n", "    return (dy * xhat).to(tl.float16)\n"),),
    # every feature block off by a 16-bit rounding; the hint stays "none": the error is not that of a float16
    # reference (only the partial sums round, not the math), which is what the precision hint asks for
    expect=(Expectation(CASE, "float32", fail=("dw",), passing=("y", "dx", "db"), where={"dw": {"feature": "all"}}),),
))

register_mutant(Mutant(
    id="layernorm-row-tail-dropped", operator="layernorm", backend="triton",
    seed="issue 47: classic norm-kernel bugs",
    description="the backward's grid is R // BLOCK_R row tiles, not cdiv: the last, partial row tile never runs "
                "(its dx rows stay as allocated and dw, db miss their terms)",
    edits=(("wrapper.py", "    tiles = triton.cdiv(R, br)\n", "    tiles = R // br\n"),),
    expect=(Expectation(CASE, "float32", fail=("dx", "dw", "db"), passing=("y",), where={"dx": {"row": "last"}}),),
))

register_mutant(Mutant(
    id="layernorm-db-last-block-only", operator="layernorm", backend="triton",
    seed="issue 47; the example plugin's example-triton-wrong",
    description="the db partial's store one indent short, after the feature loop: only the last feature block's "
                "partial is stored, the others stay as allocated",
    edits=(("kernels.py", _PB, _PB.replace("        tl.store", "    tl.store")), ("kernels.py", _BEFORE_LOOP, _BOUND)),
    expect=(Expectation(CASE_WIDE, "float32", fail=("db",), passing=("y", "dx", "dw"),
                        where={"db": {"feature": "all-but-last"}}),),
))

register_mutant(Mutant(
    id="layernorm-bwd-mean-not-subtracted", operator="layernorm", backend="triton",
    seed="issue 47: classic norm-kernel bugs",
    description="the backward drops mean(dy * w) from dx (the gradient through the mean)",
    edits=(("kernels.py", _DX, _DX.replace(" - mg[:, None]", "")),),
    expect=(Expectation(CASE, "float32", fail=("dx",), passing=("y", "dw", "db"), contracts=("invariants",),
                        where={"dx": {"row": "all"}}),),
))
