"""A mutant of the Triton fused_linear_xent backend that no absolute bound catches (issue #29).

The lean backward sums dhidden over vocabulary slabs in a float32 accumulator; this mutant keeps the
running sum in the input dtype. On 16-bit inputs the error grows but stays inside the verdict's bound:
only a comparison with the backend's own earlier run (`harness run --compare REF`) sees it. The zoo
lists it apart ("compare-only") instead of counting it as missed.
"""

from __future__ import annotations

from harness.cases.fused_linear_xent import C

from harness import Expectation, Mutant, register_mutant

# the dhidden kernel's read of the running sum (the dweight kernel has the same line, already cast)
_LOAD = "if MODE == 1 or MODE == 3:\n        acc = tl.load(acc_ptr + offs, mask=mask, other=0.0)"

register_mutant(Mutant(
    id="xent-lean-dhidden-half-accum", operator="fused_linear_xent", backend="triton-lean",
    edits=(("wrapper.py", "float32 whatever the inputs (docs/specs/fused_linear_xent.md).\"\"\"\n    return F32",
             "float32 whatever the inputs (docs/specs/fused_linear_xent.md).\"\"\"\n    return dtype"),
           # the running sum is read back into the float32 dot (which compiles for float32 accumulators only)
           # and stored in the input dtype again: one rounding per slab
           ("kernels.py", _LOAD, _LOAD + ".to(tl.float32)")),
    # measured on the CPU (interpreted; the lean plan makes 6 passes over the accumulator there): dhidden's rms
    # ratio grows from 0.268 to 0.47 (1.76x), inside the bound, its max ratio less than 1.5x: the 1.5x
    # threshold decides. On a GPU's bf16 cuBLAS path the running sum is then a bf16 addmm output.
    expect=(Expectation(C("N7-H16-V1025", 7, 16, 1025, ("size",), ignored=0.2), "float16", status="PASS",
                        passing=("loss", "lse", "dhidden", "dweight", "dbias")),),
    compare_only=True,
    description="dhidden summed over vocabulary slabs in the input dtype instead of float32 (lean mode)"))
