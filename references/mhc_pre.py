"""Golden reference of ``mhc_pre`` (mHC pre-mix), the math of specs/mhc_pre.md.

Dtype-generic: it computes in the dtype of ``phi`` (float64 for the oracle, float32 for the floor
reference); the harness rounds outputs to their contract dtypes afterwards.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def mhc_pre(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
            norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> dict[str, Tensor]:
    B, S, n, D = x.shape
    ct = phi.dtype
    X = x.reshape(B * S, n * D).to(ct)
    Xg = X * gamma.to(ct) if gamma is not None else X
    h_mix = Xg @ phi.T                                             # [T, M]
    inv_rms = torch.rsqrt(X.pow(2).mean(dim=1) + norm_eps)         # gamma NOT included
    t = h_mix * inv_rms[:, None]
    h_pre = torch.sigmoid(alpha[0] * t[:, :n] + bias[:n]) + hc_eps
    h_post = post_mult * torch.sigmoid(alpha[1] * t[:, n:2 * n] + bias[n:2 * n])
    h_res = alpha[2] * t[:, 2 * n:] + bias[2 * n:]
    h_in = (h_pre[:, :, None] * X.view(B * S, n, D)).sum(dim=1)
    return {"h_in": h_in.view(B, S, D), "h_post": h_post.view(B, S, n), "h_res": h_res.view(B, S, n, n)}
