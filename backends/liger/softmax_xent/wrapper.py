"""Liger's cross-entropy as its users call it (``liger_cross_entropy``), mapped onto the operator's options."""

from __future__ import annotations

from collections.abc import Callable

import torch
from liger_kernel.transformers.functional import liger_cross_entropy

Tensor = torch.Tensor


def global_mean(loss_of: Callable[[str], Tensor], reduction: str, normalizer: float | None) -> Tensor:
    """A mean over microbatches needs the global token count: Liger sums and the adapter divides."""
    if reduction == "mean" and normalizer is not None:
        return loss_of("sum") / normalizer
    return loss_of(reduction)


def softmax_xent_liger(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                       label_smoothing: float = 0.0, z_loss: float = 0.0,
                       normalizer: float | None = None) -> dict[str, Tensor]:
    def loss_of(red: str) -> Tensor:
        return liger_cross_entropy(logits, targets, ignore_index=ignore_index, reduction=red,
                                   label_smoothing=label_smoothing, lse_square_scale=z_loss)
    # Liger returns the loss in the logits' dtype: as float32 here, so that its 16-bit rounding is judged as an
    # error (a declared gap) rather than as a wrong dtype
    return {"loss": global_mean(loss_of, reduction, normalizer).float()}
