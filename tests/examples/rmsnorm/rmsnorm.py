"""RMSNorm as an operator from outside the repository: its reference and its OperatorSpec.

y = x * rsqrt(mean(x^2, -1) + eps) * w, x [rows, features], w [features]. Components (y, dx, dw),
their localization axes and the output dtype come from the spec's defaults (dims, dim_blocks).
"""

import torch

from harness import Inputs, OperatorSpec, named_cases, register_operator, tensor


def reference(x, w, *, eps):
    # dtype-generic: the harness runs it in float64 (the oracle) and float32 (the floor)
    return {"y": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w}


def make_inputs(case, dtype, gen, device):
    p = case.params
    x = tensor((p["rows"], p["features"]), gen, dtype, device, layout=p.get("layout", "contiguous"))
    return Inputs({"x": x, "w": tensor((p["features"],), gen, dtype, device)}, {"eps": 1e-6})


# smoke has every feature of the sweep (tests/test_coverage.py): features of one block, transposed x, and x and
# the upstream gradient each with an innermost stride of its own
SMOKE = named_cases(
    {"rows": 3, "features": 40}, {"rows": 2, "features": 16, "layout": "pad:3"},
    {"rows": 4, "features": 32, "layout": "transposed"},
    {"rows": 5, "features": 40, "layout": "stride:2", "grad_layout": "stride:3"},
)
# against the example kernels' 32-feature blocks and 16-row tiles: features 8 ... 32 fit one block, 33 ... 130
# span several with a partial last one; 17 rows span two tiles
SWEEP = named_cases(
    {"rows": 1, "features": 8}, {"rows": 7, "features": 17}, {"rows": 4, "features": 32},
    {"rows": 3, "features": 33}, {"rows": 7, "features": 100}, {"rows": 17, "features": 130},
    {"rows": 5, "features": 100, "layout": "pad:3"}, {"rows": 5, "features": 100, "layout": "stride:2"},
    {"rows": 5, "features": 100, "layout": "transposed"}, {"rows": 9, "features": 70, "grad_layout": "stride:3"},
)

register_operator(OperatorSpec(
    name="example_rmsnorm", inputs=("x", "w"), differentiable=("x", "w"), outputs=("y",), graded_outputs=("y",),
    reference=reference, make_inputs=make_inputs,
    presets={"smoke": lambda device: SMOKE, "sweep": lambda device: SWEEP},
    dims={"x": ("row", "feature"), "w": ("feature",), "y": ("row", "feature")},
    dim_blocks={"feature": "BLOCK"},
    doc="RMSNorm over the last dimension (example operator from outside the repository)",
))
