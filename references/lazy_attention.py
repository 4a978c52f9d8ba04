"""Golden reference of ``lazy_attention`` (causal attention with Elastic-Softmax), specs/lazy_attention.md.

Dtype-generic: it computes in the common float dtype of its inputs (``bias`` and ``tau`` are
float32, so float32 at least; float64 when the oracle upcasts everything). The harness rounds
outputs to their contract dtypes afterwards. Autograd gives the backward of the spec: the ReLU's
derivative at exactly 0 is 0, as ``m = 1[p + c > 0]`` says.
"""

from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = torch.promote_types(dt, t.dtype)
    # half-precision math is what the backends are judged against, never what the reference does
    return torch.promote_types(dt, torch.float32)


def relative_bias(bias: Tensor, L: int) -> Tensor:
    """[H, L, L] with bias[h, i-j] where 0 <= i-j < W, else 0 (W is not a window)."""
    W = bias.shape[1]
    pos = torch.arange(L, device=bias.device)
    dist = pos[:, None] - pos[None, :]
    inside = (dist >= 0) & (dist < W)
    return torch.where(inside, bias[:, dist.clamp(0, W - 1)], bias.new_zeros(()))


def lazy_attention_parts(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                         scale: float | None = None) -> dict[str, Tensor]:
    """The forward's intermediates, for the kink rule and for debugging.

    Returns s (-inf above the diagonal), lse [B,H,L,1], p, c [1,H,L,1], z = p + c, m (bool, causal),
    e and o, all [B,H,L,L] except where noted.
    """
    ct = compute_dtype(q, k, v, bias, tau)
    q, k, v, bias, tau = (t.to(ct) for t in (q, k, v, bias, tau))
    L, Dh = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    pos = torch.arange(L, device=q.device)
    causal = pos[None, :] <= pos[:, None]                      # [L, L]: j <= i
    s = scale * (q @ k.transpose(-1, -2)) + relative_bias(bias, L)
    s = s.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)            # finite: j = i is always allowed
    p = torch.exp(s - lse)
    c = (tau[:, None] / (pos + 1).to(ct))[None, :, :, None]   # c_i = tau[h] / (i + 1)
    z = p + c
    # the causal mask matters here: with tau > 0, z = c > 0 above the diagonal
    m = (z > 0) & causal
    e = torch.where(m, z, z.new_zeros(()))
    o = e @ v
    return {"s": s, "lse": lse, "p": p, "c": c, "z": z, "m": m, "e": e, "o": o}


def lazy_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                   scale: float | None = None) -> dict[str, Tensor]:
    """o = relu(softmax_causal(scale q k^T + bias) + tau/(i+1)) v, causally masked; q,k,v [B,H,L,Dh]."""
    return {"o": lazy_attention_parts(q, k, v, bias, tau, scale=scale)["o"]}
