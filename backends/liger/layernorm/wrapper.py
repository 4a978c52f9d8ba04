"""Liger's LayerNorm as its users call it (``liger_layer_norm``)."""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_layer_norm

Tensor = torch.Tensor


def layernorm_liger(x: Tensor, w: Tensor, b: Tensor, *, eps: float) -> dict[str, Tensor]:
    return {"y": liger_layer_norm(x, w, b, eps)}
