"""Smoke covers sweep: every feature of a sweep cell (harness/tools/features.py: layouts, sizes against the backend's
blocks, options) is a feature of some smoke cell of the same backend, for every registered operator and the
example operator of tests/examples/rmsnorm (loaded as a plugin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import Case, Inputs, OperatorSpec, place, randn, tensor
from harness.model import registry
from harness.model.inputs import generator
from harness.tools.features import block_class, case_facts, layout_features, option_features

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "examples" / "rmsnorm"


# ---- features of tensors and options ---------------------------------------------------------------

def placed(layout: str, shape: tuple[int, ...] = (5, 7)) -> torch.Tensor:
    return place(randn(shape, generator("features", layout)), layout, "cpu")


@pytest.mark.parametrize("layout, shape, features", [
    ("contiguous", (5, 7), set()),
    ("stride:2", (5, 7), {"t: innermost stride > 1"}),
    ("pad:3", (5, 7), {"t: padded"}),
    ("transposed", (5, 7), {"t: transposed"}),
    ("perm:0,2,1,3", (2, 3, 4, 8), {"t: transposed"}),  # [B,H,L,Dh] viewed from [B,L,H,Dh]: Dh still innermost
    ("pad:3", (1, 7), set()),  # one row: no row stride to speak of
    ("stride:2", (5, 1), {"t: innermost stride > 1"}),  # the rows are the fastest dimension, 2 apart
])
def test_layout_classes_are_read_from_the_strides(layout: str, shape: tuple[int, ...], features: set[str]):
    assert layout_features({"t": placed(layout, shape)}) == features


def test_pairs_of_tensors_are_told_apart_by_their_strides():
    a, b, c = placed("contiguous"), placed("pad:3"), placed("stride:3")
    assert layout_features({"a": a, "b": b}) == {"b: padded", "a, b: distinct strides"}
    assert layout_features({"a": a, "c": c, "n": torch.zeros(7, dtype=torch.int64), "s": torch.zeros(())}) == \
        {"c: innermost stride > 1", "a, c: distinct strides", "a, c: distinct innermost strides"}
    # one row: its row stride is never stepped along, so the two are laid out alike
    assert layout_features({"a": placed("contiguous", (1, 7)), "b": placed("pad:3", (1, 7))}) == set()


@pytest.mark.parametrize("size, cls", [(15, "n < B"), (16, "n = B"), (17, "n > B, not a multiple"), (32, None)])
def test_a_size_is_classed_against_its_block(size: int, cls: str | None):
    assert block_class("n", "B", size, 16) == cls


def test_each_option_gives_its_value_class():
    options = {"reduction": "sum", "ignore_index": 0, "label_smoothing": 0.1, "z_loss": 0.0, "normalizer": None,
               "return_lse": False}
    assert option_features(options, 2) == {"reduction = sum", "ignore_index = 0", "label_smoothing > 0",
                                           "z_loss = 0", "normalizer unset", "not return_lse", "microbatches > 1"}


def test_a_cell_feature_set_comes_from_its_draw_and_the_backend_blocks():
    def make_inputs(case, dtype, gen, device):
        p = case.params
        return Inputs({"x": tensor((p["rows"], p["features"]), gen, dtype, device, layout=p.get("layout", "")),
                       "w": tensor((p["features"],), gen, dtype, device)}, {"eps": 1e-6})

    op = OperatorSpec(name="features-rmsnorm", inputs=("x", "w"), differentiable=("x", "w"), outputs=("y",),
                      graded_outputs=("y",), make_inputs=make_inputs, presets={},
                      reference=lambda x, w, *, eps: {"y": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w},
                      dims={"x": ("row", "feature"), "w": ("feature",), "y": ("row", "feature")},
                      dim_blocks={"feature": "BLOCK"})
    facts = case_facts(op, Case("c", {"rows": 3, "features": 16, "layout": "transposed", "grad_layout": "pad"}),
                       "float32")
    assert facts.for_backend({}) == {"row > 1", "feature > 1", "x: transposed", "grad:y: padded",
                                     "x, w: distinct innermost strides", "x, grad:y: distinct strides",
                                     "x, grad:y: distinct innermost strides", "eps > 0"}
    assert facts.for_backend({"BLOCK": 16}) - facts.for_backend({}) == {"feature = BLOCK"}
    assert facts.for_backend({"BLOCK": 8}) - facts.for_backend({}) == set()  # 16 = 2 whole blocks
    assert facts.for_backend({"BLOCK": 32}) - facts.for_backend({}) == {"feature < BLOCK"}


# ---- smoke covers sweep, for every operator --------------------------------------------------------

# Runs apart: the example operator is registered by its plugin, and the Triton backends declare the blocks of
# the interpreter (TRITON_INTERPRET=1, as in the harness's CPU workers). Backends that cannot run on this machine
# (CUDA, TileLang) run the GPU presets, whose inputs are too large to draw here: they take no part.
COVERAGE = """
import json, sys
from harness.model import registry
from harness.tools.features import preset_features, uncovered

registry.load_plugin(sys.argv[1])
out = {"uncovered": {}, "smoke": {}}
for name, op in sorted(registry.operators().items()):
    bs = [b for b in registry.backends(name) if b.role != "speed-reference" and not b.unavailable("cpu")]
    out["uncovered"][name] = uncovered(op, bs)
    out["smoke"][name] = {b: len(f) for b, f in preset_features(op, "smoke", bs).items()}
op = registry.get_operator("example_rmsnorm")
op.presets["two-cases"] = lambda device: op.cases("smoke", device)[:2]
out["planted"] = uncovered(op, registry.backends("example_rmsnorm"), covering="two-cases")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def coverage() -> dict:
    r = subprocess.run([sys.executable, "-c", COVERAGE, str(EXAMPLE / "adapter.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_operator_and_the_example_is_checked(coverage: dict):
    assert set(coverage["uncovered"]) == set(registry.operators()) | {"example_rmsnorm"}
    for op, per_backend in coverage["smoke"].items():
        assert per_backend and all(n > 5 for n in per_backend.values()), (op, per_backend)


def test_smoke_has_every_feature_of_sweep_per_backend(coverage: dict):
    missing = {op: gaps for op, gaps in coverage["uncovered"].items() if gaps}
    assert not missing, "features of sweep cells that no smoke cell has (extend the smoke presets): " + \
        json.dumps(missing, indent=1)


def test_a_smoke_preset_without_the_sweep_layouts_and_block_size_is_found_short(coverage: dict):
    # the example's smoke before it covered its sweep: its first two cases
    want = ["feature = BLOCK", "grad:y: innermost stride > 1", "w, grad:y: distinct innermost strides",
            "x, grad:y: distinct innermost strides", "x, w: distinct innermost strides", "x: innermost stride > 1",
            "x: transposed"]
    assert coverage["planted"] == {"example-triton": want, "example-triton-wrong": want}


# ---- 64-bit offsets at full size (docs/design.md, "64-bit offsets") --------------------------------------------------

# per operator: the largest element offset at which a row (token) of its largest tensor starts; a 32-bit
# offset computed there overflows when it reaches 2^31
ROW_START = {
    "softmax_xent": lambda p: (p["N"] - 1) * p["V"],
    "fused_linear_xent": lambda p: (p["N"] - 1) * p["V"],
    "mhc_pre": lambda p: (p["B"] * p["S"] - 1) * p["n"] * p["D"],
}


@pytest.mark.parametrize("operator", sorted(ROW_START))
def test_the_full_preset_has_a_case_whose_row_offsets_pass_2_to_the_31(operator: str):
    registry.discover()
    cases = [c for c in registry.get_operator(operator).cases("full", "cuda") if "64-bit-offsets" in c.tags]
    assert cases, f"{operator}: no full-preset case tagged 64-bit-offsets"
    assert any(ROW_START[operator](c.params) >= 2**31 for c in cases), \
        [(c.name, ROW_START[operator](c.params)) for c in cases]
    # and no sweep case reaches it: the class belongs to the full preset, where an 80 GB card still judges it
    assert all(ROW_START[operator](c.params) < 2**31 for c in registry.get_operator(operator).cases("sweep", "cuda"))
