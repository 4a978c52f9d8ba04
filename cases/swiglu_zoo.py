"""Bug-zoo mutants of the Triton gated-MLP backend (backends/triton/gated_mlp/) on ``swiglu``
(docs/specs/bug-zoo.md); they run on the CPU under the interpreter too.

The case has 7 rows (two row tiles of 4 under the interpreter) and 100 features: three whole feature blocks
of 32 and a partial last one of 4 under the interpreter (one partial block of 1024 on a GPU).
"""

from __future__ import annotations

from harness.cases.swiglu import C

from harness import Expectation, Mutant, register_mutant

CASE = C("zoo-R7-F100", 7, 100, ("zoo",))
ALL = ("out", "dgate", "dup")

# the gate's sigmoid rounded to 16 bits: every product with it carries a relative error of 2^-11, far above a
# float32 kernel's floor; the forward and the backward share the helper, so all three components fail
register_mutant(Mutant(
    id="glu-sigmoid-fp16", operator="swiglu", backend="triton", seed="issue 47: activations in 16 bits",
    description="sigmoid(gate) computed in float32 but kept in 16 bits (fp16) before its products",
    edits=(("kernels.py", "        s = tl.sigmoid(g)\n", "        s = tl.sigmoid(g).to(tl.float16).to(tl.float32)\n"),),
    # on a GPU R7-F100 is one feature block (1024) and two row blocks (4): no axis has the three slices whose
    # profile the precision hint reads, and the hint says "none" rather than guess (H200, f9032ce)
    expect=(Expectation(CASE, "float32", fail=ALL, hint="precision|none",
                        where={"out": {"feature": "all", "row": "all"}}),),
))

# the feature mask one short: the last feature of every row is never read nor written, in the forward and the
# backward (they share the tile helper): out, dgate and dup keep the NaN poison there, in the last feature block
register_mutant(Mutant(
    id="glu-feature-tail-dropped", operator="swiglu", backend="triton", seed="issue 47: masks off by one",
    description="feature mask cols < F - 1: the last feature of each row never computed",
    edits=(("kernels.py", "mask = (rows < R)[:, None] & (cols < F)[None, :]",
            "mask = (rows < R)[:, None] & (cols < F - 1)[None, :]"),),
    expect=(Expectation(CASE, "float32", fail=ALL, hint="never-written",
                        where={"out": {"feature": "last", "row": "all"}, "dgate": {"feature": "last"},
                               "dup": {"feature": "last"}}),),
))
