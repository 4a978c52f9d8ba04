"""The cross-entropy references: autograd gradients (gradcheck, float64), torch agreement, NaN rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from harness.references.fused_linear_xent import fused_linear_xent
from harness.references.softmax_xent import softmax_xent

from harness import Inputs

F64 = torch.float64


def _targets(N: int, V: int, ignored: list[int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, V, (N,), generator=g)
    t[ignored] = -100
    return t


def _logits(N: int, V: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, V, generator=g, dtype=F64).mul_(2.0).requires_grad_(True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-2), (0.2, 0.5)])
def test_softmax_xent_gradcheck(reduction: str, label_smoothing: float, z_loss: float) -> None:
    z, t = _logits(5, 7), _targets(5, 7, [1, 3])

    def f(z: torch.Tensor) -> torch.Tensor:
        return softmax_xent(z, t, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)["loss"]

    assert torch.autograd.gradcheck(f, (z,))


def test_softmax_xent_gradcheck_normalizer() -> None:
    z, t = _logits(4, 6), _targets(4, 6, [0])
    assert torch.autograd.gradcheck(lambda z: softmax_xent(z, t, normalizer=11.0)["loss"], (z,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.15])
def test_softmax_xent_matches_torch(reduction: str, label_smoothing: float) -> None:
    z, t = _logits(9, 13), _targets(9, 13, [2, 5, 6])
    mine = softmax_xent(z, t, reduction=reduction, label_smoothing=label_smoothing)["loss"]
    ref = F.cross_entropy(z, t, reduction=reduction, label_smoothing=label_smoothing)
    torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)
    gup = torch.randn_like(ref)
    g_mine, = torch.autograd.grad(mine, z, gup)
    g_ref, = torch.autograd.grad(ref, z, gup)
    torch.testing.assert_close(g_mine, g_ref, rtol=1e-12, atol=1e-12)


def test_softmax_xent_normalizer_is_sum_over_normalizer() -> None:
    z, t = _logits(6, 5), _targets(6, 5, [4])
    total = softmax_xent(z, t, reduction="sum")["loss"]
    torch.testing.assert_close(softmax_xent(z, t, normalizer=17.0)["loss"], total / 17.0)


def test_ignored_target_never_indexes() -> None:
    # -100 would be an out-of-range gather; a custom ignore_index inside [0, V) must be ignored too
    z = _logits(3, 4)
    t = torch.tensor([2, 1, 1])
    out = softmax_xent(z, t, ignore_index=1, reduction="none")["loss"]
    assert out[1] == 0 and out[2] == 0 and out[0] != 0


@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.1, 0.3)])
def test_all_ignored_mean_is_nan_with_zero_gradients(label_smoothing: float, z_loss: float) -> None:
    z = _logits(4, 6)
    t = torch.full((4,), -100)
    loss = softmax_xent(z, t, label_smoothing=label_smoothing, z_loss=z_loss)["loss"]
    assert torch.isnan(loss)
    g, = torch.autograd.grad(loss, z, torch.tensor(2.5, dtype=F64))
    assert torch.equal(g, torch.zeros_like(g))
    # the same convention as torch
    ref = F.cross_entropy(z, t, label_smoothing=label_smoothing)
    assert torch.isnan(ref)

    h = torch.randn(4, 3, dtype=F64, requires_grad=True)
    w = torch.randn(6, 3, dtype=F64, requires_grad=True)
    b = torch.randn(6, dtype=F64, requires_grad=True)
    out = fused_linear_xent(h, w, b, t, z_loss=z_loss, softcap=3.0)["loss"]
    assert torch.isnan(out)
    for gr in torch.autograd.grad(out, (h, w, b), torch.tensor(-1.5, dtype=F64)):
        assert torch.equal(gr, torch.zeros_like(gr))


def test_all_ignored_with_normalizer_is_zero() -> None:
    # a microbatch without a valid token contributes 0 to the global mean, not NaN
    z = _logits(3, 5)
    loss = softmax_xent(z, torch.full((3,), -100), normalizer=7.0)["loss"]
    assert loss.item() == 0.0


def _fused_args(N: int, H: int, V: int, bias: bool, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g, dtype=F64).requires_grad_(True)
    w = (torch.randn(V, H, generator=g, dtype=F64) / H ** 0.5).requires_grad_(True)
    b = torch.randn(V, generator=g, dtype=F64).requires_grad_(True) if bias else None
    return h, w, b, _targets(N, V, [1], seed)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", [
    {}, {"label_smoothing": 0.1}, {"z_loss": 1e-2}, {"softcap": 2.0},
    {"return_lse": True}, {"softcap": 1.5, "z_loss": 0.1, "label_smoothing": 0.05, "return_lse": True},
])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_xent_gradcheck(reduction: str, opts: dict, bias: bool) -> None:
    h, w, b, t = _fused_args(5, 3, 7, bias)
    names = ["loss", "lse"] if opts.get("return_lse") else ["loss"]

    def f(h, w, *rest):
        out = fused_linear_xent(h, w, rest[0] if rest else None, t, reduction=reduction, **opts)
        return tuple(out[n] for n in names)

    args = (h, w) + ((b,) if bias else ())
    assert torch.autograd.gradcheck(f, args)


def test_fused_linear_xent_matches_linear_then_cross_entropy() -> None:
    h, w, b, t = _fused_args(6, 4, 9, True)
    mine = fused_linear_xent(h, w, b, t, label_smoothing=0.1)["loss"]
    ref = F.cross_entropy(F.linear(h, w, b), t, label_smoothing=0.1)
    torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)
    for a, r in zip(torch.autograd.grad(mine, (h, w, b)), torch.autograd.grad(ref, (h, w, b)), strict=True):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def test_fused_linear_xent_lse_for_every_row() -> None:
    h, w, b, t = _fused_args(4, 3, 5, False)
    t[:] = -100
    out = fused_linear_xent(h, w, None, t, reduction="sum", softcap=2.0, return_lse=True)
    z = 2.0 * torch.tanh((h @ w.T) / 2.0)
    torch.testing.assert_close(out["lse"], torch.logsumexp(z, 1))
    assert out["loss"].item() == 0.0


def test_microbatch_gradients_sum_to_full_batch() -> None:
    # the property the harness checks on backends, here on the reference itself
    h, w, b, t = _fused_args(9, 4, 6, True)
    t[[0, 1, 7]] = -100
    n_valid = float((t != -100).sum())
    full = torch.autograd.grad(fused_linear_xent(h, w, b, t)["loss"], (w, b))
    parts = [slice(0, 3), slice(3, 9)]
    acc = [torch.zeros_like(w), torch.zeros_like(b)]
    for s in parts:
        loss = fused_linear_xent(h[s], w, b, t[s], normalizer=n_valid)["loss"]
        for a, g in zip(acc, torch.autograd.grad(loss, (w, b)), strict=True):
            a += g
    for a, g in zip(acc, full, strict=True):
        torch.testing.assert_close(a, g, rtol=1e-12, atol=1e-12)


# ---- the case files' invariants and microbatch split (cases/softmax_xent.py, cases/fused_linear_xent.py)

def _cell(op_name: str, case_name: str, dtype: torch.dtype):
    """Inputs of a CPU sweep case, an upstream gradient, and the float32 floor gradients in ``dtype``."""
    from harness.model.inputs import generator
    from harness.model.registry import get_operator
    op = get_operator(op_name)
    case = next(c for c in op.cases("sweep", "cpu") if c.name == case_name)
    inp = op.make_inputs(case, dtype, generator(op_name, case.name, 0), "cpu")
    leaves = {n: inp.tensors[n].detach().float().requires_grad_(True)
              for n in op.differentiable if inp.tensors[n] is not None}
    args = {**inp.tensors, **leaves}
    out = op.reference(**args, **inp.options)["loss"]
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(out, list(leaves.values()), g)
    floor = {n: v.to(dtype) for n, v in zip(leaves, grads, strict=True)}
    return op, case, inp, {"loss": g}, floor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case_name", ["N16-V1025-ls-zloss-none", "N16-V1025-extreme",
                                       "N16-V1025-confident-ls", "N128-V1025"])
def test_softmax_xent_invariants_hold_for_the_floor_and_catch_defects(case_name: str,
                                                                      dtype: torch.dtype) -> None:
    from harness.cases.softmax_xent import token_weights
    op, case, inp, g, floor = _cell("softmax_xent", case_name, dtype)
    assert op.invariants({}, floor, inp, case, grad_outputs=g) == []
    valid = inp.tensors["targets"] != inp.options["ignore_index"]
    if (~valid).any():
        garbage = floor["logits"].clone()
        garbage[~valid] = 1e-3
        fails = op.invariants({}, {"logits": garbage}, inp, case, grad_outputs=g)
        assert any("ignored rows" in f for f in fails)
    # a constant added to each element of a row (a smoothing term of eps = 0.05 dropped) breaks its sum
    c = token_weights(inp.tensors["targets"], inp.options, g["loss"].expand(valid.shape))
    shifted = floor["logits"].double() + 0.05 * c[:, None] / floor["logits"].shape[1]
    fails = op.invariants({}, {"logits": shifted.to(dtype)}, inp, case, grad_outputs=g)
    assert any("do not sum" in f for f in fails)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_xent_invariants(dtype: torch.dtype) -> None:
    op, case, inp, g, floor = _cell("fused_linear_xent", "N32-H24-V129-zloss", dtype)
    assert op.invariants({}, floor, inp, case, grad_outputs=g) == []
    valid = inp.tensors["targets"] != inp.options["ignore_index"]
    garbage = dict(floor, hidden=floor["hidden"].clone())
    garbage["hidden"][~valid] = 1e-3
    assert any("ignored token rows" in f for f in op.invariants({}, garbage, inp, case, grad_outputs=g))
    # the z-loss gradient dropped: dbias sums to 0 instead of sum_i c_i 2 lam LSE_i
    no_z = dict(floor, bias=(floor["bias"].double() - floor["bias"].double().mean()).to(dtype))
    assert any("dbias" in f for f in op.invariants({}, no_z, inp, case, grad_outputs=g))


@pytest.mark.parametrize("op_name,case_name", [("softmax_xent", "N16-V1025-microbatch2"),
                                               ("fused_linear_xent", "N32-H24-V129-mb2"),
                                               ("fused_linear_xent", "N32-H24-V129-mb3-zloss-lse")])
def test_microbatch_split_is_unequal_and_sums_to_the_full_batch(op_name: str, case_name: str) -> None:
    from harness.model.inputs import generator
    from harness.model.registry import get_operator
    op = get_operator(op_name)
    case = next(c for c in op.cases("sweep", "cpu") if c.name == case_name)
    inp = op.make_inputs(case, torch.float32, generator(op_name, case.name, 0), "cpu")
    mb = op.microbatch
    parts = mb.split(inp, case.microbatches, torch.Generator())
    counts = [int((p.tensors["targets"] != p.options["ignore_index"]).sum()) for p in parts]
    assert len(set(counts)) == len(counts) and all(c > 0 for c in counts)
    names = [n for n in op.differentiable if inp.tensors[n] is not None]

    def grads(i: Inputs) -> list[torch.Tensor]:
        t = {n: (v.double().requires_grad_(n in names) if v is not None and v.is_floating_point() else v)
             for n, v in i.tensors.items()}
        return list(torch.autograd.grad(op.reference(**t, **i.options)["loss"], [t[n] for n in names]))

    def combined(per_part: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        return [torch.cat(gs) if mb.combine[n] == "cat0" else sum(gs)
                for n, gs in zip(names, zip(*per_part, strict=True), strict=True)]

    full = grads(inp)
    for a, b in zip(combined([grads(p) for p in parts]), full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    naive = combined([grads(Inputs(p.tensors, mb.naive_options(p.options))) for p in parts])
    assert (naive[0] - full[0]).abs().max() > 0.1 * full[0].abs().max()
