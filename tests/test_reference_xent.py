"""The cross-entropy references: autograd gradients (gradcheck, float64), torch agreement, NaN rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from references.fused_linear_xent import fused_linear_xent
from references.softmax_xent import softmax_xent

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
