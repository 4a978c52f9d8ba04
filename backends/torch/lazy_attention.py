"""``lazy_attention`` in eager torch, as a user would write it, in the case dtype; autograd does the
backward. Also ``sdpa``: plain causal FlashAttention through scaled_dot_product_attention, the
speed-of-light reference of `harness bench` (it ignores bias and tau, so it is never judged)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness import Backend, Gap, register_backend

Tensor = torch.Tensor


def lazy_attention_torch(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                         scale: float | None = None) -> dict[str, Tensor]:
    L, Dh, W = q.shape[-2], q.shape[-1], bias.shape[1]
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    dt = q.dtype
    pos = torch.arange(L, device=q.device)
    dist = pos[:, None] - pos[None, :]
    causal = dist >= 0
    rel = torch.where(causal & (dist < W), bias[:, dist.clamp(0, W - 1)], 0.0).to(dt)     # [H, L, L]
    s = (q @ k.transpose(-1, -2)) * scale + rel
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    c = tau[:, None] / (pos + 1)                                                          # [H, L]
    e = torch.relu(p + c[:, :, None].to(dt)).masked_fill(~causal, 0.0)
    return {"o": e @ v}


def sdpa_causal(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, tau: Tensor, *,
                scale: float | None = None) -> dict[str, Tensor]:
    return {"o": F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)}


_EAGER = "eager attention computes scores, softmax and p+c in the case dtype"

register_backend(Backend(
    operator="lazy_attention", name="torch", impl=lazy_attention_torch, devices=("cpu", "cuda"),
    # ceilings: the worst ratios of the committed H100/H200/CPU sweeps (at 350e7a5), with about 2x room: the
    # per-head scalars dtau and dbias are sums over every score, accumulated in the case dtype
    expected_gaps=(
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("dtau", "dbias"), ceiling=7e5),
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("dq", "dk"), ceiling=70.0),
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("dv", "o"), ceiling=3.0),
    ),
    dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
    description="eager torch in the case dtype (matmul, softmax, relu), autograd backward"))

register_backend(Backend(
    operator="lazy_attention", name="sdpa", impl=sdpa_causal, devices=("cuda", "cpu"),
    dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
    role="speed-reference",
    description="causal scaled_dot_product_attention without bias or tau: the speed-of-light "
                "reference for bench only (bias and tau get no gradient)"))
