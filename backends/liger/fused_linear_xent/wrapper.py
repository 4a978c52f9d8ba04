"""Liger's fused linear cross-entropy as its users call it (``liger_fused_linear_cross_entropy``), mapped onto the
operator's options; it has no LSE output (the adapter skips the cases that ask for one)."""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

from ..softmax_xent.wrapper import global_mean

Tensor = torch.Tensor


def fused_linear_xent_liger(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                            softcap: float | None = None, return_lse: bool = False, ignore_index: int = -100,
                            reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                            normalizer: float | None = None) -> dict[str, Tensor]:
    def loss_of(red: str) -> Tensor:
        return liger_fused_linear_cross_entropy(hidden, weight, targets, bias, ignore_index=ignore_index,
                                                lse_square_scale=z_loss, label_smoothing=label_smoothing,
                                                reduction=red, softcap=softcap or None)
    return {"loss": global_mean(loss_of, reduction, normalizer)}
