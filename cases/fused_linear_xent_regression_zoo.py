"""A mutant of the Triton fused_linear_xent backend that no absolute bound catches (issue #29).

The lean backward sums dhidden over vocabulary slabs in a float32 accumulator; this mutant keeps the
running sum in the input dtype. On 16-bit inputs the error grows but stays inside the verdict's bound:
only a comparison with the backend's own earlier run (`harness run --compare REF`) sees it. The zoo
lists it apart ("compare-only") instead of counting it as missed.
"""

from __future__ import annotations

from harness.cases.fused_linear_xent import C

from harness import Expectation, Mutant, register_mutant

register_mutant(Mutant(
    id="xent-lean-dhidden-half-accum", operator="fused_linear_xent", backend="triton-lean",
    edits=(("wrapper.py", "acc = torch.empty(h.shape, dtype=F32, device=h.device) if n_slabs > 1 else None",
            "acc = torch.empty(h.shape, dtype=h.dtype, device=h.device) if n_slabs > 1 else None"),),
    # measured on the CPU (interpreted, 256-entry slabs): dhidden's ratios there grow from 0.14 / 0.259 (max /
    # rms) to 0.273 / 0.64, inside the bound; 1.95x and 2.47x, so the 1.5x threshold decides
    expect=(Expectation(C("N64-H8-V1100", 64, 8, 1100, ("size",), ignored=0.2), "float16", status="PASS",
                        passing=("loss", "lse", "dhidden", "dweight", "dbias")),),
    compare_only=True,
    description="dhidden summed over vocabulary slabs in the input dtype instead of float32 (lean mode)"))
