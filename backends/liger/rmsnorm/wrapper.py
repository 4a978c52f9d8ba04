"""Liger's RMSNorm as its users call it: ``liger_rms_norm`` and, with a residual, ``liger_fused_add_rms_norm``,
with their defaults (offset 0, casting_mode "llama", in_place True: dx written over dy)."""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_fused_add_rms_norm, liger_rms_norm

Tensor = torch.Tensor


def rmsnorm_liger(x: Tensor, residual: Tensor | None, w: Tensor, *, eps: float) -> dict[str, Tensor]:
    if residual is None:
        return {"y": liger_rms_norm(x, w, eps)}
    y, h = liger_fused_add_rms_norm(x, residual, w, eps)
    return {"y": y, "residual_out": h}
