"""Bug-zoo mutants of the Triton gated-MLP backend (backends/triton/gated_mlp/) on ``geglu``
(docs/specs/bug-zoo.md); they run on the CPU under the interpreter too. The kernels are swiglu's: the
mutants here are those of gelu's derivative, which only dgate sees (out and dup stay right)."""

from __future__ import annotations

from harness.cases.swiglu import C

from harness import Expectation, Mutant, register_mutant

TANH = C("zoo-R7-F100-tanh", 7, 100, ("zoo",), approximate="tanh")
ERF = C("zoo-R7-F100-none", 7, 100, ("zoo",), approximate="none")

# d/dg tanh(k (g + c g^3)) = (1 - t^2) k (1 + 3 c g^2): the chain rule's cubic term dropped
register_mutant(Mutant(
    id="gelu-tanh-dgate-missing-cubic", operator="geglu", backend="triton", seed="issue 47: gelu derivative",
    description="gelu (tanh) derivative without the inner polynomial's 3 c g^2 term",
    edits=(("kernels.py", "* 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)", "* 0.7978845608028654"),),
    expect=(Expectation(TANH, "float32", fail=("dgate",), passing=("out", "dup"),
                        where={"dgate": {"feature": "all", "row": "all"}}),
            Expectation(ERF, "float32", passing=("out", "dgate", "dup"))),
))

# gelu'(g) = Phi(g) + g phi(g): the second term (the derivative of the cdf) dropped
register_mutant(Mutant(
    id="gelu-erf-dgate-missing-pdf", operator="geglu", backend="triton", seed="issue 47: gelu derivative",
    description="gelu (erf) derivative Phi(g) only, without g * phi(g)",
    edits=(("kernels.py", "da = cdf + g * (0.3989422804014327 * tl.exp(-0.5 * g * g))", "da = cdf"),),
    expect=(Expectation(ERF, "float32", fail=("dgate",), passing=("out", "dup"),
                        where={"dgate": {"feature": "all", "row": "all"}}),
            Expectation(TANH, "float32", passing=("out", "dgate", "dup"))),
))
