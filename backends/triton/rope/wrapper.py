"""Launcher and the autograd Function of ``rope``; the user-facing ``rope_triton(x, base=, interleaved=, offset=)``.

The output and the gradient are allocated contiguous in x's dtype; x of any strides is read in place.
"""

from __future__ import annotations

import os

import torch
import triton

from . import kernels as K

Tensor = torch.Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Under the interpreter the tiles are small so that CPU-sized cases span several position tiles and head blocks
# (the adapter declares BLOCK_T / BLOCK_H; tests/test_triton_activations.py checks they match).
CPU_CONFIG = {"BLOCK_T": 4, "BLOCK_H": 2, "warps": 4}
# 16 positions x 4 heads x 64 pairs (D = 128): 8 K elements per program
GPU_CONFIG = {"BLOCK_T": 16, "BLOCK_H": 4, "warps": 4}
CONFIG = dict(CPU_CONFIG if INTERPRET else GPU_CONFIG)


def inv_freq(D: int, base: float, device: torch.device) -> Tensor:
    # as references/rope.py computes it in float32, so that the kernel's angles round as the floor's do
    return 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))


def rope_apply(x: Tensor, inv: Tensor, offset: int, interleaved: bool, sign: int) -> Tensor:
    """Rotate x [B, S, H, D] by sign * angle (sign -1: the inverse rotation, the backward)."""
    B, S, H, D = x.shape
    y = torch.empty((B, S, H, D), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    half = D // 2
    grid = (B * triton.cdiv(S, CONFIG["BLOCK_T"]), triton.cdiv(H, CONFIG["BLOCK_H"]))
    K._rope_kernel[grid](x, inv, y, S, H, half, offset, *x.stride(), *y.stride(), SIGN=sign,
                         INTERLEAVED=interleaved, BLOCK_T=CONFIG["BLOCK_T"], BLOCK_H=CONFIG["BLOCK_H"],
                         BLOCK_P=triton.next_power_of_2(half), num_warps=CONFIG["warps"])
    return y


class Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, base: float, interleaved: bool, offset: int) -> Tensor:
        if x.dim() != 4 or x.shape[-1] % 2:
            raise ValueError(f"expected x [batch, seq, heads, head_dim] with an even head_dim, got {tuple(x.shape)}")
        if offset < 0 or offset + x.shape[1] > 2 ** 24:
            raise ValueError(f"positions offset..offset+seq must lie in [0, 2^24] (exact in float32), got offset "
                             f"{offset} and seq {x.shape[1]}")
        inv = inv_freq(x.shape[-1], base, x.device)
        ctx.save_for_backward(inv)
        ctx.offset, ctx.interleaved = offset, interleaved
        return rope_apply(x, inv, offset, interleaved, 1)

    @staticmethod
    def backward(ctx, dout: Tensor):
        (inv,) = ctx.saved_tensors
        # the inverse rotation: dx = R(-theta) dout, at the same positions
        dx = rope_apply(dout, inv, ctx.offset, ctx.interleaved, -1)
        return dx, None, None, None


def rope_triton(x: Tensor, *, base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> dict[str, Tensor]:
    return {"out": Rope.apply(x, base, interleaved, offset)}
