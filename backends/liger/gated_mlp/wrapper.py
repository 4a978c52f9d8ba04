"""Liger's gated activations as their users call them: ``liger_swiglu`` (silu(gate) * up) and ``liger_geglu``
(gelu(gate, tanh approximation) * up)."""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_geglu, liger_swiglu

Tensor = torch.Tensor


def swiglu_liger(gate: Tensor, up: Tensor) -> dict[str, Tensor]:
    return {"out": liger_swiglu(gate, up)}


def geglu_liger(gate: Tensor, up: Tensor, *, approximate: str = "tanh") -> dict[str, Tensor]:
    return {"out": liger_geglu(gate, up)}
