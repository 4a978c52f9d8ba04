"""Launchers and the autograd Function of the gated MLP activations (``swiglu``, ``geglu``).

The user-facing calls are ``swiglu_triton(gate, up)`` and ``geglu_triton(gate, up, approximate=...)``; the
harness registers them through adapter.py. Outputs and gradients are allocated contiguous in the input dtype;
inputs of any strides are read in place.
"""

from __future__ import annotations

import os

import torch
import triton

from . import kernels as K

Tensor = torch.Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Under the interpreter the tiles are small so that CPU-sized cases span several row tiles and feature blocks
# (what exposes tail and offset bugs); the adapter declares BLOCK_R / BLOCK_F (a test checks they match).
CPU_CONFIG = {"BLOCK_R": 4, "BLOCK_F": 32, "warps": 4}
# an elementwise kernel: 4 rows x 1024 features (16 KB of float32 per tensor and program) with 4 warps
GPU_CONFIG = {"BLOCK_R": 4, "BLOCK_F": 1024, "warps": 4}
CONFIG = dict(CPU_CONFIG if INTERPRET else GPU_CONFIG)

ACTS = {"silu": K.ACT_SILU, "gelu": K.ACT_GELU, "gelu_tanh": K.ACT_GELU_TANH}


def _grid(R: int, F: int) -> tuple[int]:
    # one axis (row tiles x feature blocks: no 65535 limit on the row tiles); kernels._tile unflattens it
    return (triton.cdiv(R, CONFIG["BLOCK_R"]) * triton.cdiv(F, CONFIG["BLOCK_F"]),)


def gated_forward(gate: Tensor, up: Tensor, act: int) -> Tensor:
    R, F = gate.shape
    out = torch.empty((R, F), dtype=gate.dtype, device=gate.device)
    if out.numel():
        K._fwd_kernel[_grid(R, F)](gate, up, out, R, F, *gate.stride(), *up.stride(), *out.stride(), ACT=act,
                                   BLOCK_R=CONFIG["BLOCK_R"], BLOCK_F=CONFIG["BLOCK_F"], num_warps=CONFIG["warps"])
    return out


def gated_backward(dout: Tensor, gate: Tensor, up: Tensor, act: int) -> tuple[Tensor, Tensor]:
    R, F = gate.shape
    dgate = torch.empty((R, F), dtype=gate.dtype, device=gate.device)
    dup = torch.empty((R, F), dtype=up.dtype, device=up.device)
    if dgate.numel():
        K._bwd_kernel[_grid(R, F)](gate, up, dout, dgate, dup, R, F, *gate.stride(), *up.stride(), *dout.stride(),
                                   *dgate.stride(), *dup.stride(), ACT=act, BLOCK_R=CONFIG["BLOCK_R"],
                                   BLOCK_F=CONFIG["BLOCK_F"], num_warps=CONFIG["warps"])
    return dgate, dup


class GatedAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor, act: int) -> Tensor:
        if gate.dim() != 2 or gate.shape != up.shape or gate.dtype != up.dtype:
            raise ValueError(f"expected gate and up of one shape [rows, features] and one dtype, got "
                             f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}")
        ctx.save_for_backward(gate, up)
        ctx.act = act
        return gated_forward(gate, up, act)

    @staticmethod
    def backward(ctx, dout: Tensor):
        gate, up = ctx.saved_tensors
        dgate, dup = gated_backward(dout, gate, up, ctx.act)
        return dgate, dup, None


def swiglu_triton(gate: Tensor, up: Tensor) -> dict[str, Tensor]:
    return {"out": GatedAct.apply(gate, up, ACTS["silu"])}


def geglu_triton(gate: Tensor, up: Tensor, *, approximate: str = "none") -> dict[str, Tensor]:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate={approximate!r}: expected 'none' or 'tanh'")
    return {"out": GatedAct.apply(gate, up, ACTS["gelu_tanh" if approximate == "tanh" else "gelu"])}
