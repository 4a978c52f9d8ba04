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


def test_the_sequential_draw_adds_one_k_step_at_a_time_and_sums_in_blocks():
    # a plain float32 GEMM's accumulator: one product per K step, rounded into a running sum (eager torch's cuBLAS
    # dweight over 1,000 tokens rounded so, 2.6-2.9x a floor in blocks of 8, on an H200)
    from harness.measure import orders
    g = torch.Generator().manual_seed(2)
    a, b, x = torch.randn(5, 300, generator=g), torch.randn(300, 7, generator=g), torch.randn(6, 500, generator=g)
    chain = a[:, :1] @ b[:1]
    for k in range(1, 300):
        chain = chain + a[:, k:k + 1] @ b[k:k + 1]
    with TiledOrder(1):
        mm, s = a @ b, x.sum(1)
    with TiledOrder(orders.SUM_BLOCK_MIN):
        s8 = x.sum(1)
    assert torch.equal(mm, chain) and torch.equal(s, s8)


def test_a_long_k_is_cut_into_at_most_max_k_steps(monkeypatch):
    from harness.measure import orders
    monkeypatch.setattr(orders, "MAX_K_STEPS", 10)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 95, generator=g), torch.randn(95, 3, generator=g)
    blocks = [a[:, k:k + 10] @ b[k:k + 10] for k in range(0, 95, 10)]  # ceil(95 / 10) = 10 steps of 10
    chain = blocks[0]
    for p in blocks[1:]:
        chain = chain + p
    with TiledOrder(1):
        mm = a @ b
    assert torch.equal(mm, chain)
