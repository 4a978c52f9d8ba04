"""Deterministic inputs: seeded generators and strided layouts with the same values.

Inputs are drawn on the CPU from a stable hash of (operator, case, seed), rounded to their declared
dtype, then placed on the device in the requested layout, so every backend, the oracle and the
floor reference see bit-identical values whatever the device.
"""

from __future__ import annotations

import hashlib
import json

import torch

Tensor = torch.Tensor


def stable_seed(*parts: object) -> int:
    blob = json.dumps(
        [str(p) if not isinstance(p, (int, float, str, list, dict)) else p for p in parts], sort_keys=True, default=str
    ).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & ((1 << 63) - 1)


def generator(*parts: object) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(stable_seed(*parts))
    return g


def randn(
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    dtype: torch.dtype = torch.float32,
    scale: float = 1.0,
    mean: float = 0.0,
) -> Tensor:
    """CPU normal draws rounded to ``dtype`` (drawn in float32 so every dtype sees the same stream)."""
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * scale + mean).to(dtype)


def uniform(
    shape: tuple[int, ...] | list[int], gen: torch.Generator, lo: float, hi: float, dtype: torch.dtype = torch.float32
) -> Tensor:
    return (torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def place(values: Tensor, layout: str, device: str | torch.device) -> Tensor:
    """Put ``values`` on ``device`` with the strides that ``layout`` names, values unchanged.

    - ``contiguous``: row-major.
    - ``pad`` / ``pad:K``: the last dimension padded by K (default 5) elements, so the row stride
      exceeds the size (a slice of a wider tensor).
    - ``perm:a,b,c,...``: stored in the permuted dimension order and viewed back, e.g.
      ``perm:0,2,1,3`` gives a [B,H,L,Dh] view of a [B,L,H,Dh] buffer.
    """
    if layout in ("", "contiguous", None):
        return values.to(device).contiguous()
    kind, _, arg = layout.partition(":")
    if kind == "pad":
        k = int(arg) if arg else 5
        shape = list(values.shape)
        buf = torch.full(
            (*shape[:-1], shape[-1] + k),
            float("nan") if values.is_floating_point() else 0,
            dtype=values.dtype,
            device=device,
        )
        out = buf[..., : shape[-1]]
        out.copy_(values.to(device))
        return out
    if kind == "perm":
        perm = [int(a) for a in arg.split(",")]
        if sorted(perm) != list(range(values.dim())):
            raise ValueError(f"layout {layout!r}: expected a permutation of 0..{values.dim() - 1}")
        inv = [perm.index(i) for i in range(len(perm))]
        return values.permute(perm).contiguous().to(device).permute(inv)
    raise ValueError(f"layout {layout!r}: expected 'contiguous', 'pad[:K]' or 'perm:a,b,...'")
