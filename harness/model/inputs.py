"""Deterministic inputs: seeded generators and strided layouts with the same values.

Inputs are drawn on the CPU from a stable hash of (operator, case, seed), rounded to their declared
dtype, then placed on the device in the requested layout, so every backend, the oracle and the
floor reference see bit-identical values whatever the device.

An operator's ``make_inputs(case, dtype, gen, device)`` uses these (``gen`` is the cell's seeded
generator; see ``tensor``). The layouts :func:`place` takes, listed by :func:`layouts`:

==================  ====================================================================
``contiguous``      row-major
``transposed``      stored with the last two dimensions swapped, viewed back
``pad[:K]``         last dimension padded by K (default 5): the row stride exceeds the size
``stride[:K]``      every element K (default 2) apart: innermost stride K, NaN in the gaps
``perm:a,b,...``    stored in the permuted dimension order, viewed back
==================  ====================================================================
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


LAYOUTS = {
    "contiguous": "row-major",
    "transposed": "stored with the last two dimensions swapped, viewed back (needs 2 or more dimensions)",
    "pad[:K]": "the last dimension padded by K elements (default 5): the row stride exceeds the size",
    "stride[:K]": "every element K apart (default 2) in a K times wider buffer: innermost stride K",
    "perm:a,b,...": "stored in the permuted dimension order and viewed back (perm:0,2,1,3: [B,H,L,Dh] of [B,L,H,Dh])",
}


def layouts() -> dict[str, str]:
    """The layout names :func:`place` takes (with their arguments in brackets), each with what it means."""
    return dict(LAYOUTS)


def _filler(values: Tensor) -> float | int:
    # NaN in the gaps of a float buffer: a kernel that reads a gap (ignores a stride) gets NaN, not a
    # plausible value that might pass
    return float("nan") if values.is_floating_point() else 0


def place(values: Tensor, layout: str, device: str | torch.device) -> Tensor:
    """Put ``values`` on ``device`` with the strides that ``layout`` names (see :func:`layouts` and the
    module docstring), values unchanged; gaps of a wider buffer hold NaN (integers: 0)."""
    if layout in ("", "contiguous", None):
        return values.to(device).contiguous()
    kind, _, arg = layout.partition(":")
    if kind in ("pad", "stride"):
        k = int(arg) if arg else (5 if kind == "pad" else 2)
        if k < 1 or (kind == "stride" and k < 2):
            raise ValueError(f"layout {layout!r}: K must be at least {1 if kind == 'pad' else 2}")
        if values.dim() == 0:
            raise ValueError(f"layout {layout!r}: a 0-dimensional tensor has no last dimension to {kind}")
        shape = list(values.shape)
        wide = shape[-1] + k if kind == "pad" else shape[-1] * k
        buf = torch.full((*shape[:-1], wide), _filler(values), dtype=values.dtype, device=device)
        out = buf[..., : shape[-1]] if kind == "pad" else buf[..., ::k]
        out.copy_(values.to(device))
        return out
    if kind == "transposed":
        if arg:
            raise ValueError(f"layout {layout!r}: 'transposed' takes no argument (perm:a,b,... for others)")
        if values.dim() < 2:
            raise ValueError(f"layout 'transposed' needs 2 or more dimensions, got shape {list(values.shape)}")
        return values.transpose(-1, -2).contiguous().to(device).transpose(-1, -2)
    if kind == "perm":
        perm = [int(a) for a in arg.split(",")]
        if sorted(perm) != list(range(values.dim())):
            raise ValueError(f"layout {layout!r}: expected a permutation of 0..{values.dim() - 1}")
        inv = [perm.index(i) for i in range(len(perm))]
        return values.permute(perm).contiguous().to(device).permute(inv)
    raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def tensor(
    shape: tuple[int, ...] | list[int],
    gen: torch.Generator,
    dtype: torch.dtype,
    device: str | torch.device,
    layout: str = "contiguous",
    scale: float = 1.0,
) -> Tensor:
    """Normal draws times ``scale``, rounded to ``dtype``, placed on ``device`` in ``layout``: one input
    of a ``make_inputs``."""
    return place(randn(shape, gen, dtype, scale=scale), layout, device)
