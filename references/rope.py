"""Reference of ``rope``: rotary position embedding of x [batch, seq, heads, head_dim] (docs/specs/rope.md).

Pair p of head dimension D (p < D/2) at sequence position s is rotated by the angle
``(s + offset) * inv_freq[p]``, ``inv_freq = 1 / base ** (arange(0, D, 2) / D)``. The pairs are
``(2p, 2p + 1)`` when ``interleaved`` (GPT-J, the original RoFormer) and ``(p, p + D/2)`` otherwise (half-split,
GPT-NeoX and Llama). Dtype-generic: everything, the angles included, in the dtype of ``x`` (float64 for the
oracle; float32 for the floor, whose angles then carry float32 rounding, as a float32 kernel's do).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def inv_freq(D: int, base: float, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``1 / base ** (arange(0, D, 2) / D)`` in ``dtype``: the angle per position of each pair."""
    return 1.0 / (base ** (torch.arange(0, D, 2, dtype=dtype, device=device) / D))


def angles(S: int, D: int, base: float, offset: int, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``[S, D/2]``: position ``offset + s`` times ``inv_freq``, one rounding in ``dtype``."""
    pos = torch.arange(offset, offset + S, dtype=dtype, device=device)
    return pos[:, None] * inv_freq(D, base, dtype, device)[None, :]


def rope(x: Tensor, *, base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> dict[str, Tensor]:
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"expected x [batch, seq, heads, head_dim] with an even head_dim, got {tuple(x.shape)}")
    B, S, H, D = x.shape
    ang = angles(S, D, base, offset, x.dtype, x.device)[None, :, None, :]  # [1, S, 1, D/2]
    cos, sin = ang.cos(), ang.sin()
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    out = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return {"out": out}
