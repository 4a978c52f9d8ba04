"""The lazy-attention reference against the spec: autograd gradcheck, the causal mask, and the
spec's hand-written backward formulas (docs/specs/lazy_attention.md)."""

from __future__ import annotations

import math

import pytest
import torch
from harness.references.lazy_attention import lazy_attention, lazy_attention_parts

B, H, L, DH, W = 2, 2, 5, 4, 3


def _inputs(tau: list[float], seed: int = 0, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, DH, generator=g, dtype=dtype) for _ in range(3))
    bias = 0.5 * torch.randn(H, W, generator=g, dtype=dtype)
    return [q, k, v, bias, torch.tensor(tau, dtype=dtype)]


def _kink_margin(args: list[torch.Tensor]) -> float:
    parts = lazy_attention_parts(*args)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    return parts["z"].abs()[..., causal].min().item()


@pytest.mark.parametrize("tau,seed", [([-0.3, -0.15], 3), ([0.2, -0.45], 0), ([0.35, 0.1], 0)])
def test_gradcheck_float64(tau: list[float], seed: int) -> None:
    args = _inputs(tau, seed)
    # finite differences are only meaningful away from the ReLU kink
    assert _kink_margin(args) > 1e-3
    if min(tau) < 0:  # the ReLU must actually drop something, or its gradient is not exercised
        assert (~lazy_attention_parts(*args)["m"]).tril().any()
    args = [a.requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda *a: lazy_attention(*a)["o"], args, eps=1e-6, atol=1e-7)


def test_mask_is_causal_with_positive_tau() -> None:
    parts = lazy_attention_parts(*_inputs([0.3, 0.1]))
    above = torch.ones(L, L, dtype=torch.bool).triu(1)
    assert (parts["z"][..., above] > 0).all()        # the ReLU alone would let these through
    assert not parts["m"][..., above].any()
    assert (parts["e"][..., above] == 0).all()
    # and below: e = p + c > 0 everywhere
    assert (parts["e"][..., ~above] > 0).all()


def test_negative_tau_drops_elements() -> None:
    # with tau = -0.9, row 0 keeps p[0,0] = 1 > 0.9 while later rows drop their small probabilities
    parts = lazy_attention_parts(*_inputs([-0.9, -0.5]))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    dropped = causal & ~parts["m"]
    assert dropped.any()
    assert (parts["e"][dropped.expand_as(parts["e"])] == 0).all()


def test_forward_matches_loops() -> None:
    q, k, v, bias, tau = _inputs([-0.3, 0.2], seed=1)
    o = lazy_attention(q, k, v, bias, tau)["o"]
    scale = 1 / math.sqrt(DH)
    want = torch.zeros_like(o)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                s = [scale * float(q[b, h, i] @ k[b, h, j]) + (float(bias[h, i - j]) if i - j < W else 0.0)
                     for j in range(i + 1)]
                mx = max(s)
                den = sum(math.exp(x - mx) for x in s)
                for j in range(i + 1):
                    z = math.exp(s[j] - mx) / den + float(tau[h]) / (i + 1)
                    if z > 0:
                        want[b, h, i] += z * v[b, h, j]
    torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12)


def test_backward_matches_spec_formulas() -> None:
    args = [a.requires_grad_() for a in _inputs([-0.3, 0.2], seed=2)]
    q, k, v, bias, tau = args
    g = torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = torch.autograd.grad(lazy_attention(*args)["o"], args, g)
    with torch.no_grad():
        P = lazy_attention_parts(*args)
        p, e = P["p"], P["e"]
        m = P["m"].to(p.dtype)
        scale = 1 / math.sqrt(DH)
        dv = e.transpose(-1, -2) @ g
        dp = m * (g @ v.transpose(-1, -2))
        delta = (p * dp).sum(-1, keepdim=True)
        # the cheaper Delta of the spec agrees
        U = m @ v
        torch.testing.assert_close(delta[..., 0], (g * (P["o"] - P["c"] * U)).sum(-1))
        ds = p * (dp - delta)
        dq = scale * ds @ k
        dk = scale * ds.transpose(-1, -2) @ q
        dbias = torch.stack([torch.stack([ds[:, h].diagonal(offset=-d, dim1=-2, dim2=-1).sum()
                                          for d in range(W)]) for h in range(H)])
        inv = 1.0 / torch.arange(1, L + 1, dtype=p.dtype)
        dtau = (inv[:, None] * dp).sum(dim=(0, 2, 3))
    for name, a, b in zip(("dq", "dk", "dv", "dbias", "dtau"), got, (dq, dk, dv, dbias, dtau), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_strided_inputs_same_values() -> None:
    args = _inputs([-0.4, 0.1], seed=4)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in args[:3])
    assert q.stride() != args[0].stride()
    torch.testing.assert_close(lazy_attention(q, k, v, *args[3:])["o"], lazy_attention(*args)["o"],
                               rtol=0, atol=0)


def test_float32_compute_for_half_inputs() -> None:
    q, k, v, bias, tau = _inputs([-0.4, 0.1], dtype=torch.float32)
    o = lazy_attention(q.half(), k.half(), v.half(), bias, tau)["o"]
    assert o.dtype == torch.float32


def _grads_with_mask(q, k, v, bias, tau, g, flip: torch.Tensor) -> dict[str, torch.Tensor]:
    """The spec's forward and backward with the ReLU mask flipped where ``flip`` is set."""
    P = lazy_attention_parts(q, k, v, bias, tau)
    p, z = P["p"], P["z"]
    m = (P["m"] ^ flip).to(p.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    e = m * z.abs()                      # a flipped kernel keeps a tiny |z|, whatever its sign here
    dp = m * (g @ v.transpose(-1, -2))
    ds = p * (dp - (p * dp).sum(-1, keepdim=True))
    Lq, Wb = q.shape[-2], bias.shape[1]
    dbias = torch.stack([ds.diagonal(offset=-d, dim1=-2, dim2=-1).sum(dim=(0, 2)) if d < Lq
                         else torch.zeros(q.shape[1], dtype=p.dtype) for d in range(Wb)], dim=1)
    inv = 1.0 / torch.arange(1, Lq + 1, dtype=p.dtype)
    return {"o": e @ v, "dq": scale * ds @ k, "dk": scale * ds.transpose(-1, -2) @ q,
            "dv": e.transpose(-1, -2) @ g, "dbias": dbias, "dtau": (inv[:, None] * dp).sum(dim=(0, 2, 3))}


@pytest.mark.parametrize("tau_kind", ["neg", "mixed"])
def test_kink_bound_covers_mask_flips(tau_kind: str) -> None:
    from harness.cases.lazy_attention import C, kink_bound, make_inputs

    from harness.model.inputs import generator

    case = C("kink", 2, 3, 40, 16, 7, tau=tau_kind)
    t = make_inputs(case, torch.float32, generator("kink-test", tau_kind), "cpu").tensors
    t = {n: x.double() for n, x in t.items()}
    g = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    # tf32's eps marks enough elements at this size to exercise every term of the bound
    bound = kink_bound(t, {"o": g}, case, matmul_precision="tf32")
    assert bound["_marked"] > 0
    P = lazy_attention_parts(*t.values())
    eps = 2.0 ** -10
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    marked = (P["z"].abs() <= 8 * eps * (P["p"].abs() + P["c"].abs())) & causal
    assert int(marked.sum()) == bound["_marked"]
    base = _grads_with_mask(*t.values(), g, torch.zeros_like(marked))
    rnd = torch.rand(marked.shape, generator=torch.Generator().manual_seed(6)) < 0.5
    for flip in (marked, marked & rnd):
        got = _grads_with_mask(*t.values(), g, flip)
        for name, b in base.items():
            diff = (got[name] - b).abs()
            assert (diff <= bound[name] * (1 + 1e-9) + 1e-15).all(), name
            if name != "o":
                assert diff.max() > 0, name     # the flip did change this component
