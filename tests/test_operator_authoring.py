"""Operators from outside the repository: OperatorSpec's defaults (output dtypes, components and axes
from named dimensions), the public input layouts, and the example operator in tests/examples/rmsnorm run
through `harness run --plugin` from a folder outside the repository."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from subprocess_env import inner_pytest_env

from harness import Axis, Backend, Case, Component, Inputs, OperatorSpec, layouts, named_cases, place, randn, tensor
from harness.judge.judgement import Rules, judge_cell
from harness.measure.cell import run_cell
from harness.measure.oracle import output_contract
from harness.model.inputs import generator

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "examples" / "rmsnorm"
DIMS = {"x": ("row", "feature"), "w": ("feature",), "y": ("row", "feature")}


def rmsnorm(x, w, *, eps):
    return {"y": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w}


def make_inputs(case, dtype, gen, device):
    p = case.params
    x = tensor((p["rows"], p["features"]), gen, dtype, device, layout=p.get("layout", "contiguous"))
    return Inputs({"x": x, "w": tensor((p["features"],), gen, dtype, device)}, {"eps": 1e-6})


def spec(name: str, **kw) -> OperatorSpec:
    """An RMSNorm spec that states only what the defaults cannot know (not registered: no side effects)."""
    base = dict(name=name, inputs=("x", "w"), differentiable=("x", "w"), outputs=("y",), graded_outputs=("y",),
                reference=rmsnorm, make_inputs=make_inputs, presets={}, dims=DIMS, dim_blocks={"feature": "BLOCK"})
    return OperatorSpec(**{**base, **kw})


def cell(op: OperatorSpec, impl, params: dict, dtype: str = "float32", blocks: dict | None = None):
    backend = Backend(operator=op.name, name="eager", impl=impl, devices=("cpu",), blocks=blocks or {})
    rec = run_cell(op, backend, Case("c", params), dtype, "cpu", repeats=1)
    return rec, judge_cell(rec, Rules())


# ---- OperatorSpec defaults ------------------------------------------------------------------------

def test_outputs_default_to_the_dtype_of_the_dtype_input_else_the_first_differentiable_one():
    t = {"x": torch.zeros(2, 3, dtype=torch.float16), "w": torch.zeros(3, dtype=torch.float32)}
    assert output_contract(spec("dt-a"), t) == {"y": torch.float16}  # no dtype_input: x, differentiable first
    assert output_contract(spec("dt-b", dtype_input="w"), t) == {"y": torch.float32}
    declared = spec("dt-c", output_dtypes=lambda t: {"y": torch.float64})
    assert output_contract(declared, t) == {"y": torch.float64}  # a declaration still wins


def test_a_correct_backend_passes_without_output_dtypes_declared():
    # without the default the contract was the oracle's float64: every correct cell was SHAPE
    rec, j = cell(spec("no-output-dtypes"), rmsnorm, {"rows": 3, "features": 10})
    assert j.shown == "PASS", [(c.name, c.verdict.reason) for c in j.components]
    assert [c.name for c in j.components] == ["y", "dx", "dw"]


def test_components_default_to_outputs_and_gradients_with_axes_from_dims():
    op = spec("derived")
    row, feature = Axis("row", 0), Axis("feature", 1, block="BLOCK")
    assert op.components == (Component("y", "out:y", None, (row, feature)),
                             Component("dx", "grad:x", None, (row, feature)),
                             Component("dw", "grad:w", None, (Axis("feature", 0, block="BLOCK"),)))
    bare = spec("no-dims", dims={}, dim_blocks={})
    assert [(c.name, c.source, c.axes) for c in bare.components] == [("y", "out:y", ()), ("dx", "grad:x", ()),
                                                                       ("dw", "grad:w", ())]


def test_explicit_components_are_kept_as_given():
    mine = (Component("loss", "out:y", lambda t, p: t.sum().reshape(1)),)
    assert spec("explicit", components=mine, dims={}, dim_blocks={}).components == mine


@pytest.mark.parametrize("kw, message", [
    ({"dims": {"z": ("row",)}}, "dims names 'z', which is neither an input"),
    ({"dims": {"x": ("row", "row")}}, "distinct dimension names"),
    ({"dim_blocks": {"feat": "BLOCK"}}, "dim_blocks names dimension 'feat'"),
    ({"outputs": ("y", "dx"), "graded_outputs": ("y",)}, "share the name(s) dx"),
    ({"components": (Component("y", "out:y"),)}, "dims/dim_blocks derive the default components only"),
])
def test_a_misspelled_dimension_or_tensor_fails_when_the_spec_is_made(kw: dict, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        spec("typo", **kw)


def test_a_derived_feature_axis_is_localized_per_backend_block():
    class KeepLastBlock(torch.autograd.Function):
        """Identity forward; the gradient keeps only features 8.. (the last block of 4 of 10)."""

        @staticmethod
        def forward(ctx, w):
            return w.clone()

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            g[:8] = 0
            return g

    def wrong(x, w, *, eps):
        return rmsnorm(x, KeepLastBlock.apply(w), eps=eps)

    rec, j = cell(spec("blocks"), wrong, {"rows": 5, "features": 10}, blocks={"BLOCK": 4})
    assert j.shown == "FAIL" and [c.name for c in j.failed_components] == ["dw"]
    assert "feature (blocks of 4): 0-1 bad of 3 (2 ok)" in j.failed_components[0].where


def test_named_cases_are_named_after_their_parameters_and_must_differ():
    cases = named_cases({"rows": 7, "features": 100, "layout": "stride:2"}, {"rows": 1, "features": 8}, tags=("t",))
    assert [c.name for c in cases] == ["rows7-features100-layout=stride2", "rows1-features8"]
    assert cases[0].params == {"rows": 7, "features": 100, "layout": "stride:2"} and cases[1].tags == ("t",)
    with pytest.raises(ValueError, match="the same parameters twice"):
        named_cases({"rows": 1}, {"rows": 1})


# ---- layouts ---------------------------------------------------------------------------------------

# (layout, strides of a [5, 7] tensor, contiguous?)
LAYOUTS = [
    ("contiguous", (7, 1), True),
    ("transposed", (1, 5), False),
    ("pad", (12, 1), False),
    ("pad:3", (10, 1), False),
    ("stride", (14, 2), False),
    ("stride:3", (21, 3), False),
    ("perm:1,0", (1, 5), False),
]


@pytest.mark.parametrize("layout, strides, contiguous", LAYOUTS)
def test_a_layout_keeps_the_values_and_has_the_strides_it_names(layout: str, strides: tuple, contiguous: bool):
    values = randn((5, 7), generator("layout-test"))
    t = place(values, layout, "cpu")
    assert torch.equal(t, values) and t.shape == values.shape
    assert t.stride() == strides and t.is_contiguous() == contiguous


@pytest.mark.parametrize("layout, gaps", [("pad:3", 5 * 3), ("stride:3", 5 * 7 * 2)])
def test_the_gaps_of_a_wider_buffer_hold_nan(layout: str, gaps: int):
    t = place(randn((5, 7), generator("gaps")), layout, "cpu")
    whole = torch.empty(0).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // 4,))
    assert int(torch.isnan(whole).sum()) == gaps  # a kernel that reads a gap gets NaN, not a plausible value


def test_transposed_swaps_the_last_two_dimensions_of_a_batch():
    values = randn((2, 3, 4), generator("batch"))
    t = place(values, "transposed", "cpu")
    assert torch.equal(t, values) and t.stride() == (12, 1, 3)


def test_an_integer_tensor_is_padded_with_zeros():
    t = place(torch.arange(6).reshape(2, 3), "stride:2", "cpu")
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]] and t.stride() == (6, 2)


@pytest.mark.parametrize("layout, shape, message", [
    ("stride:1", (3, 4), "K must be at least 2"),
    ("transposed", (4,), "needs 2 or more dimensions"),
    ("transposed:2", (3, 4), "takes no argument"),
    ("diagonal", (3, 4), "expected one of contiguous, transposed, pad[:K], stride[:K], perm:a,b,..."),
])
def test_a_layout_that_cannot_apply_is_an_error_naming_it(layout: str, shape: tuple, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        place(torch.zeros(shape), layout, "cpu")


def test_layouts_lists_every_name_place_takes():
    names = layouts()
    assert list(names) == ["contiguous", "transposed", "pad[:K]", "stride[:K]", "perm:a,b,..."]
    for name in names:  # each listed name, with its argument filled in, is accepted
        place(torch.zeros(3, 4), name.replace("[:K]", ":2").replace("a,b,...", "1,0"), "cpu")


def test_tensor_draws_rounds_and_places():
    t = tensor((3, 4), generator("t"), torch.float16, "cpu", layout="stride:2", scale=3.0)
    want = (torch.randn((3, 4), generator=generator("t")) * 3.0).to(torch.float16)
    assert t.dtype == torch.float16 and torch.equal(t, want) and t.stride() == (8, 2)


def test_a_backend_that_ignores_the_innermost_stride_reads_the_gaps_and_fails():
    def row_major(x, w, *, eps):
        # assumes a dense [rows, features] buffer: right for contiguous x only
        x = torch.as_strided(x, x.shape, (x.shape[1], 1))
        return rmsnorm(x, w, eps=eps)

    op = spec("row-major")
    assert cell(op, row_major, {"rows": 3, "features": 6})[1].shown == "PASS"
    _, j = cell(op, row_major, {"rows": 3, "features": 6, "layout": "stride:2"})
    assert j.shown == "FAIL" and "y" in [c.name for c in j.failed_components]


# ---- the example operator, from a folder outside the repository ----------------------------------

def harness_run(folder: Path, backend: str, *more: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness", "run", "--plugin", "adapter.py", "--kernel", "example_rmsnorm", "--backend",
           backend, "--sizes", "sweep", "--device", "cpu", "--report", str(folder / "reports"), "--no-progress", *more]
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("outside") / "rmsnorm"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert ROOT not in folder.parents
    return folder


@pytest.mark.slow
def test_the_example_operator_passes_its_sweep_from_outside_the_repository(example: Path):
    r = harness_run(example, "example-triton")
    assert r.returncode == 0, r.stdout + r.stderr
    for dtype in ("float32", "float16"):
        assert re.search(rf"example-triton +{dtype} +10 pass\n", r.stdout), r.stdout


@pytest.mark.slow
def test_the_wrong_example_fails_and_the_harness_localizes_the_lost_feature_blocks(example: Path):
    r = harness_run(example, "example-triton-wrong", "--dtype", "fp32")  # the bug is the same in fp16
    assert r.returncode == 1, r.stdout + r.stderr
    # the planted bug (the dw store after the feature loop): dw wrong in every feature block but the
    # last, wherever features span more than one block of 32; y and dx right
    assert re.search(r"example-triton-wrong +float32 +3 pass, 7 fail\n", r.stdout), r.stdout
    failing = re.findall(
        r"✗ example_rmsnorm/example-triton-wrong/float32/rows\d+-features(\d+)\S*: FAIL \(gross\) (.*)", r.stdout)
    assert len(failing) == 7, r.stdout  # the cases with features > 32
    for features, what in failing:
        blocks = math.ceil(int(features) / 32)
        bad = "0" if blocks == 2 else f"0-{blocks - 2}"
        # "(3 ok)": the index of the one block that is right, the last
        assert what.startswith(f"dw FAIL (feature (blocks of 32): {bad} bad of {blocks} ({blocks - 1} ok)"), what
        assert "y FAIL" not in what and "dx FAIL" not in what
    assert "cause: example-triton-wrong: dw fail exactly where features > 32 (7/7 cells) and pass elsewhere (3/3)" \
        in r.stdout
    report = (example / "reports" / "cpu" / "example_rmsnorm.md").read_text()
    assert "where: feature (blocks of 32): 0-2 bad of 4 (3 ok)" in report


def test_the_readme_shows_the_example_operator_as_it_is():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Operators from outside the repository", 1)[1].split("\n## ", 1)[0]
    shown = re.findall(r"```python\n(.*?)```", section, re.S)
    source = (EXAMPLE / "rmsnorm.py").read_text()
    assert any(block.strip() in source and len(block.strip()) > 0.8 * len(source.strip()) for block in shown), \
        "README's example operator differs from tests/examples/rmsnorm/rmsnorm.py"


@pytest.mark.slow
def test_the_example_through_pytest_plugin_from_outside_the_repository(example: Path):
    """The same road through pytest: no test file in the folder, the conformance items collected by the plugin."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--plugin", "adapter.py", "--kernel",
           "example_rmsnorm", "--backend", "example-triton,example-triton-wrong", "--sizes", "sweep",
           "--harness-device", "cpu", "--harness-dtype", "float32"]
    r = subprocess.run(cmd, cwd=example, capture_output=True, text=True, timeout=600,
                       env=inner_pytest_env(TRITON_INTERPRET="1"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "7 failed, 13 passed" in r.stdout, r.stdout[-3000:]
    failed = re.findall(r"FAILED harness::test_conformance\[example_rmsnorm-(\S+?)-float32-", r.stdout)
    assert failed and set(failed) == {"example-triton-wrong"}, failed
    assert "dw             FAIL" in r.stdout and "feature (blocks of 32): 0-2 bad of 4 (3 ok)" in r.stdout
    assert "repro: harness repro " in r.stdout
