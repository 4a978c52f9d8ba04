"""Liger's RoPE as its users call it (``liger_rope``, the Hugging Face convention): cos and sin of the half-split
layout computed in float32 and cast to the case dtype, q as [B, H, S, D] (a view of the operator's [B, S, H, D]),
and a one-head k that the operator does not use (Liger rotates q and k together)."""

from __future__ import annotations

import torch
from liger_kernel.transformers.functional import liger_rope

Tensor = torch.Tensor


def rope_liger(x: Tensor, *, base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> dict[str, Tensor]:
    B, S, H, D = x.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))
    pos = torch.arange(offset, offset + S, dtype=torch.float32, device=x.device)
    emb = torch.cat((torch.outer(pos, inv_freq),) * 2, dim=-1)[None]  # [1, S, D]
    k = x.new_zeros((B, S, 1, D)).transpose(1, 2)
    q, _ = liger_rope(x.transpose(1, 2), k, emb.cos().to(x.dtype), emb.sin().to(x.dtype))
    return {"out": q.transpose(1, 2)}
