"""Reference of ``rmsnorm`` (docs/specs/rmsnorm.md): RMSNorm over the last dimension, optionally fused with
a residual add.

    h = x + residual            (residual given; else h = x)
    y = h * rsqrt(mean(h^2, -1) + eps) * w
    residual_out = h            (only when residual is given)

Dtype-generic: all math runs in the dtype of ``x`` (float64 for the oracle, float32 for the floor); the
harness rounds each output to its contract dtype (x's) afterwards. Autograd gives the backward.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def rmsnorm(x: Tensor, residual: Tensor | None, w: Tensor, *, eps: float) -> dict[str, Tensor]:
    h = x if residual is None else x + residual.to(x.dtype)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.to(x.dtype)
    return {"y": y} if residual is None else {"y": y, "residual_out": h}
