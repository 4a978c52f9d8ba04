"""Golden reference of ``fused_linear_xent``: z = hidden @ weight.T + bias, optional softcap, then the
cross-entropy of specs/xent.md (see references/softmax_xent.py for the all-ignored NaN rule).

Dtype-generic: the logits are materialized in the promoted dtype of ``hidden`` and ``weight`` (float64
for the oracle, float32 for the floor reference); being a reference, memory is not its concern.
"""

from __future__ import annotations

import torch
from harness.references.softmax_xent import xent_from_logits

Tensor = torch.Tensor


def fused_linear_xent(hidden: Tensor, weight: Tensor, bias: Tensor | None = None,
                      targets: Tensor | None = None, *, ignore_index: int = -100, reduction: str = "mean",
                      label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                      normalizer: float | None = None, return_lse: bool = False) -> dict[str, Tensor]:
    if targets is None:
        raise ValueError("fused_linear_xent: targets [N] (int64) is required")
    ct = torch.promote_types(hidden.dtype, weight.dtype)
    z = hidden.to(ct) @ weight.to(ct).T
    if bias is not None:
        z = z + bias.to(ct)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    loss, lse = xent_from_logits(z, targets, ignore_index=ignore_index, reduction=reduction,
                                 label_smoothing=label_smoothing, z_loss=z_loss, normalizer=normalizer)
    out = {"loss": loss}
    if return_lse:
        out["lse"] = lse
    return out
