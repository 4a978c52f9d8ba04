"""``geglu``: out = gelu(gate) * up, exact (erf) or tanh-approximated (docs/specs/geglu.md).

The case machinery is swiglu's (cases/swiglu.py); every preset runs each size with both ``approximate``
values.
"""

from __future__ import annotations

from harness.cases.swiglu import make_spec
from harness.references.gated_mlp import geglu

from harness import register_operator

OPTIONS = [{"approximate": "none"}, {"approximate": "tanh"}]

SPEC = register_operator(make_spec("geglu", geglu, OPTIONS,
                                   "gated MLP activation gelu(gate) * up, erf or tanh (specs/geglu.md)"))
