"""Reference of the gated MLP activations ``swiglu`` and ``geglu`` (docs/specs/swiglu.md, docs/specs/geglu.md).

``out = act(gate) * up`` elementwise, gate and up ``[rows, features]``; act is silu (swiglu) or gelu (geglu,
exact erf or its tanh approximation). Dtype-generic: all math in the dtype of ``gate`` (float64 for the oracle,
float32 for the floor); autograd gives the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

APPROXIMATE = ("none", "tanh")


def _check(gate: Tensor, up: Tensor) -> None:
    if gate.dim() != 2 or gate.shape != up.shape:
        raise ValueError(f"expected gate and up of one shape [rows, features], got {tuple(gate.shape)} and "
                         f"{tuple(up.shape)}")


def swiglu(gate: Tensor, up: Tensor) -> dict[str, Tensor]:
    _check(gate, up)
    return {"out": F.silu(gate) * up}


def geglu(gate: Tensor, up: Tensor, *, approximate: str = "none") -> dict[str, Tensor]:
    _check(gate, up)
    if approximate not in APPROXIMATE:
        raise ValueError(f"approximate={approximate!r}: expected one of {', '.join(APPROXIMATE)}")
    return {"out": F.gelu(gate, approximate=approximate) * up}
