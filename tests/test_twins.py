"""Layout twins (harness/model/twins.py): the base case's values in other strides, derived for any operator, and the
bugs only they expose: an innermost stride taken as 1, one tensor addressed with another's strides."""

from __future__ import annotations

import pytest
import torch

from harness import Backend, Case, Inputs, OperatorSpec, tensor
from harness.judge.judgement import Rules, judge_cell
from harness.measure.cell import run_cell
from harness.measure.oracle import (
    clear_cache,
    gen_grad_outputs,
    gen_inputs,
    oracle_and_floor,
    output_contract,
    reference_run,
)
from harness.model import registry
from harness.model.twins import base_case, layouts, twin, with_twins


def draw(op: OperatorSpec, case: Case) -> tuple[Inputs, dict[str, torch.Tensor]]:
    inputs = gen_inputs(op, case, torch.float32, 0, "cpu")
    outs, _, _ = reference_run(op, inputs, None, torch.float64)
    grads = gen_grad_outputs(op, case, 0, inputs.tensors, {k: tuple(v.shape) for k, v in outs.items()},
                             output_contract(op, inputs.tensors), "cpu")
    return inputs, grads


def test_a_twin_draws_its_base_values_and_only_changes_strides():
    op = registry.get_operator("lazy_attention")
    base = next(c for c in op.cases("smoke", "cpu") if c.name == "L17-qkvT-dOcontig-B2")
    b_in, b_g = draw(op, base)
    for which, inner in (("stride", [2, 2, 2, 2, 2, 2]), ("mixed", [2, 3, 4, 5, 6, 7])):
        t_in, t_g = draw(op, twin(base, which))
        tensors = {**t_in.tensors, "grad:o": t_g["o"]}
        assert [tensors[n].stride(-1) for n in ("q", "k", "v", "bias", "tau", "grad:o")] == inner, which
        for n, t in b_in.tensors.items():
            assert torch.equal(t_in.tensors[n], t), (which, n)
        assert torch.equal(t_g["o"], b_g["o"]) and t_in.options == b_in.options


def test_integer_and_scalar_tensors_keep_their_layout():
    op = registry.get_operator("softmax_xent")
    base = next(c for c in op.cases("smoke", "cpu") if c.name == "N5-V31-pad-ls")  # reduction mean: a scalar loss
    inputs, grads = draw(op, twin(base, "mixed"))
    assert inputs.tensors["logits"].stride() == (62, 2)
    assert inputs.tensors["targets"].stride() == (1,) and grads["loss"].dim() == 0
    assert layouts(op, twin(base, "mixed"), inputs.tensors, grads) == {"logits": "stride:2"}


def test_a_twin_has_the_oracle_of_its_base():
    op = registry.get_operator("mhc_pre")
    base = op.cases("smoke", "cpu")[0]
    clear_cache()
    want = oracle_and_floor(op, base, torch.float32, 0, "cpu", False)
    got = oracle_and_floor(op, twin(base, "mixed"), torch.float32, 0, "cpu", False)
    for key in ("o_out", "o_grad"):
        for name, v in want[key].items():
            assert v is None and got[key][name] is None or torch.equal(v, got[key][name]), (key, name)
    clear_cache()


def test_with_twins_puts_the_twins_after_the_cases_named():
    a, b = Case("a", {"n": 1}), Case("b", {"n": 2}, ("t",), 2)
    cases = with_twins([a, b], only=("b",))
    assert [c.name for c in cases] == ["a", "b", "b~stride", "b~mixed", "b~offset", "b~unaligned", "b~expand"]
    assert cases[3].params == {"n": 2, "twin": "mixed"} and cases[3].tags == ("t",) and cases[3].microbatches == 2
    assert base_case(cases[3]) == b and base_case(a) is a
    assert [c.name for c in with_twins([a], which=("mixed",))] == ["a", "a~mixed"]


@pytest.mark.parametrize("call, message", [
    (lambda: twin(Case("a", {}), "diagonal"), "twin 'diagonal': expected one of stride, mixed"),
    (lambda: twin(twin(Case("a", {}), "stride"), "mixed"), "is already the 'stride' twin of 'a'"),
    (lambda: with_twins([Case("a", {})], only=("b",)), "with_twins: no case named b; cases: a"),
])
def test_a_twin_that_cannot_be_made_is_an_error_naming_it(call, message: str):
    with pytest.raises(ValueError, match=message):
        call()


# ---- the bugs twins expose, on an operator of the test's own (RMSNorm in eager torch) ----------------------

def rmsnorm(x, w, *, eps):
    return {"y": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w}


def make_inputs(case, dtype, gen, device):
    p = case.params
    return Inputs({"x": tensor((p["rows"], p["features"]), gen, dtype, device),
                   "w": tensor((p["features"],), gen, dtype, device)}, {"eps": 1e-6})


OP = OperatorSpec(name="twins-rmsnorm", inputs=("x", "w"), differentiable=("x", "w"), outputs=("y",),
                  graded_outputs=("y",), reference=rmsnorm, make_inputs=make_inputs, presets={},
                  dims={"x": ("row", "feature"), "w": ("feature",), "y": ("row", "feature")})
BASE = Case("rows3-features6", {"rows": 3, "features": 6})


def shown(impl) -> list[str]:
    """The judged status of the base case and its two twins."""
    backend = Backend(operator=OP.name, name="eager", impl=impl, devices=("cpu",))
    out = []
    for case in with_twins([BASE]):
        out.append(judge_cell(run_cell(OP, backend, case, "float32", "cpu", repeats=1), Rules()).shown)
    return out


def test_a_correct_backend_passes_every_twin():
    # the base case, then its stride, mixed, offset, unaligned and expand twins
    assert shown(rmsnorm) == ["PASS"] * 6


def test_a_backend_that_ignores_the_innermost_stride_fails_the_twins():
    def dense_rows(x, w, *, eps):
        # assumes x's elements one apart: right for every layout a preset lists, wrong for a twin
        x = torch.as_strided(x, x.shape, (x.stride(0), 1))
        return rmsnorm(x, w, eps=eps)

    assert shown(dense_rows) == ["PASS", "FAIL", "FAIL", "PASS", "PASS", "PASS"]


class _GradWithStridesOf(torch.autograd.Function):
    """Identity on y; its backward reads the upstream gradient with x's strides."""

    @staticmethod
    def forward(ctx, y, x):
        ctx.x_stride = x.stride()
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        return torch.as_strided(g, g.shape, ctx.x_stride, g.storage_offset()), None


def test_a_backend_that_addresses_the_gradient_with_x_strides_fails_the_mixed_twin_only():
    def dy_with_x_strides(x, w, *, eps):
        return {"y": _GradWithStridesOf.apply(rmsnorm(x, w, eps=eps)["y"], x)}

    # the stride twin gives x and dy the same strides; the mixed one gives them innermost strides 2 and 4; the
    # offset and unaligned ones the same strides again; the expand one a dy of strides 0, read with x's (6, 1)
    assert shown(dy_with_x_strides) == ["PASS", "PASS", "FAIL", "PASS", "PASS", "FAIL"]


def test_a_backend_that_rounds_a_pointer_down_to_16_bytes_fails_the_unaligned_twin_only():
    def aligned_down(x, w, *, eps):
        # a vector loop from the 16-byte boundary at or before x's start (4 float32 elements)
        x = torch.as_strided(x, x.shape, x.stride(), x.storage_offset() // 4 * 4)
        return rmsnorm(x, w, eps=eps)

    assert shown(aligned_down) == ["PASS", "PASS", "PASS", "PASS", "FAIL", "PASS"]


def test_the_adversarial_twins_place_as_named():
    op = registry.get_operator("lazy_attention")
    base = next(c for c in op.cases("smoke", "cpu") if c.name == "L17-qkvT-dOcontig-B2")
    b_in, b_g = draw(op, base)
    o_in, o_g = draw(op, twin(base, "offset"))
    u_in, u_g = draw(op, twin(base, "unaligned"))
    e_in, e_g = draw(op, twin(base, "expand"))
    for name, t in {**o_in.tensors, "grad:o": o_g["o"]}.items():
        assert t.storage_offset() * t.element_size() == 16 and t.data_ptr() % 16 == 0, name
        assert t.dim() == 1 or (t.stride(-2) - t.size(-1)) * t.element_size() == 32, name
    for name, t in {**u_in.tensors, "grad:o": u_g["o"]}.items():
        assert t.is_contiguous() and t.data_ptr() % 16 == t.element_size(), name
    for tw_in, tw_g in ((o_in, o_g), (u_in, u_g)):
        assert all(torch.equal(tw_in.tensors[n], t) for n, t in b_in.tensors.items())
        assert torch.equal(tw_g["o"], b_g["o"])
    assert all(t is None or torch.equal(e_in.tensors[n], t) for n, t in b_in.tensors.items())  # inputs as drawn
    g = e_g["o"]
    assert set(g.stride()) == {0} and torch.equal(g, torch.full_like(b_g["o"], b_g["o"].reshape(-1)[0].item()))


def test_a_failing_twin_whose_base_passes_is_told_the_layout():
    from harness.judge.judgement import judge_cells

    def dense_rows(x, w, *, eps):
        return rmsnorm(torch.as_strided(x, x.shape, (x.stride(0), 1)), w, eps=eps)

    backend = Backend(operator=OP.name, name="eager", impl=dense_rows, devices=("cpu",))
    cells = [run_cell(OP, backend, c, "float32", "cpu", repeats=1) for c in with_twins([BASE], ("stride",))]
    from unittest import mock
    with mock.patch("harness.judge.judgement.rules_for", return_value=Rules()):
        base, stride = judge_cells(cells)
    assert base.shown == "PASS" and stride.shown == "FAIL"
    hints = [h for c in stride.failed_components for h in c.hints]
    assert hints and all(h.cls in ("layout", "stride", "later-block-offsets") for h in hints)
    assert "passes as rows3-features6, fails as its 'stride' twin" in hints[0].text
    # alone, without its base, the twin gets no layout hint
    with mock.patch("harness.judge.judgement.rules_for", return_value=Rules()):
        (alone,) = judge_cells(cells[1:])
    assert all(h.cls != "layout" for c in alone.failed_components for h in c.hints)


def test_a_marginal_twin_failure_is_not_laid_to_the_layout():
    """A twin failing at under 2x (another draw of the rounding, as golden mhc_pre's stride twin at 1.01x at CPU
    seed 2) keeps its own hints: only a gross failure is evidence of a layout bug."""
    from unittest import mock

    from harness.judge.judgement import judge_cells
    from harness.judge.verdict import bounds

    (stride_case,) = with_twins([BASE], ("stride",))[1:]
    exact = Backend(operator=OP.name, name="eager", impl=rmsnorm, devices=("cpu",))
    fig = next(f for f in run_cell(OP, exact, stride_case, "float32", "cpu", repeats=1).components if f.name == "y")
    tol_max, tol_rms = bounds(fig)
    # where x is strided, y off by noise of no structure, the worse of its two ratios 1.5x
    noise = torch.linspace(-1.0, 1.0, 18, dtype=torch.float64)[torch.randperm(18, generator=torch.Generator()
                                                                               .manual_seed(0))].reshape(3, 6)
    noise = noise * 1.5 / max(1 / tol_max, float(noise.pow(2).mean().sqrt()) / tol_rms)

    def strided_rounds_more(x, w, *, eps):
        y = rmsnorm(x, w, eps=eps)["y"]
        return {"y": y if x.is_contiguous() else y + noise.to(y.dtype)}

    backend = Backend(operator=OP.name, name="eager", impl=strided_rounds_more, devices=("cpu",))
    cells = [run_cell(OP, backend, c, "float32", "cpu", repeats=1) for c in with_twins([BASE], ("stride",))]
    with mock.patch("harness.judge.judgement.rules_for", return_value=Rules()):
        base, stride = judge_cells(cells)
    assert base.shown == "PASS" and stride.shown == "FAIL" and stride.severity == "marginal", stride.severity
    assert all(h.cls != "layout" for c in stride.failed_components for h in c.hints)


def test_a_twin_failing_in_one_tile_only_is_not_laid_to_the_layout():
    """A layout misread spoils the whole tensor: a twin whose failure is the local rule's alone (one tile off,
    the component within its global bounds) keeps its local hint, however large the tile's ratio."""
    import dataclasses
    from unittest import mock

    from harness.judge.judgement import judge_cells
    from harness.model.records import LocalFigures

    exact = Backend(operator=OP.name, name="eager", impl=rmsnorm, devices=("cpu",))
    base, stride = [run_cell(OP, exact, c, "float32", "cpu", repeats=1) for c in with_twins([BASE], ("stride",))]
    one_tile = LocalFigures(["row", "feature"], [1, 2], [3, 6], 9, err=0.5, floor=1e-7, at=[1, 1])
    stride = dataclasses.replace(stride, components=[dataclasses.replace(f, local=one_tile) if f.name == "y" else f
                                                     for f in stride.components])
    with mock.patch("harness.judge.judgement.rules_for", return_value=Rules()):
        judged_base, judged_stride = judge_cells([base, stride])
    (y,) = judged_stride.failed_components
    assert judged_base.shown == "PASS" and judged_stride.shown == "FAIL" and y.verdict.kind == "local"
    assert judged_stride.severity == "gross", judged_stride.severity
    assert [h.cls for h in y.hints] == ["local"], y.hints
