"""The floor's order draws (harness/measure/orders.py): long float32 reductions summed block by block in order, in a
forward and in autograd's backward, the same value as torch's up to rounding, and rounding differently."""

from __future__ import annotations

import torch

from harness.measure.orders import TiledOrder


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max())


def test_sums_and_products_in_the_tiled_order_round_otherwise_and_stay_close():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 1024, generator=g), torch.randn(1024, 8, generator=g)
    x = torch.randn(30, 70, generator=g)
    with TiledOrder(8):
        mm, s, s0, mu = a @ b, x.sum(), x.sum(0, keepdim=True), x.mean(1)
    ref_mm = a.double() @ b.double()
    assert _err(mm, ref_mm) < 1e-3 and not torch.equal(mm, a @ b)
    assert _err(s, x.double().sum()) < 1e-2 and s0.shape == (1, 70) and mu.shape == (30,)
    assert _err(mu, x.double().mean(1)) < 1e-5


def test_the_backward_of_a_broadcast_scalar_is_summed_in_the_tiled_order():
    # mHC's dalpha: the gradient of a scalar that scales a [T, n] tensor, a sum over all T * n products
    g = torch.Generator().manual_seed(1)
    t, up = torch.randn(8000, 4, generator=g), torch.randn(8000, 4, generator=g)
    exact = (t.double() * up.double()).sum()
    w = torch.ones((), requires_grad=True)
    (plain,) = torch.autograd.grad(w * t, w, up)
    with TiledOrder(8):
        (tiled,) = torch.autograd.grad(w * t, w, up)
    assert tiled.item() != plain.item()
    assert _err(tiled, exact) < 1e-2
