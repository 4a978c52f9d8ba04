"""``rope`` in eager torch, as a user would write it (the Hugging Face way): cos and sin of the angles computed
in float32 and cast to the case dtype, then ``x * cos + rotate(x) * sin`` in the case dtype; autograd does the
backward.

Also ``torch-compile`` (role speed-reference, GPU only): the same function under ``torch.compile``, the speed
reference of the Triton backend's target (cases/rope.py); not judged.
"""

from __future__ import annotations

import torch

from harness import Backend, register_backend

Tensor = torch.Tensor


def rope_torch(x: Tensor, *, base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> dict[str, Tensor]:
    B, S, H, D = x.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))
    pos = torch.arange(offset, offset + S, dtype=torch.float32, device=x.device)
    freqs = torch.outer(pos, inv_freq)
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos()[None, :, None, :].to(x.dtype)
    sin = emb.sin()[None, :, None, :].to(x.dtype)
    if interleaved:
        rot = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        rot = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)
    return {"out": x * cos + rot * sin}


_COMPILED: list = []


def rope_compiled(x: Tensor, *, base: float = 10000.0, interleaved: bool = False, offset: int = 0) -> dict[str, Tensor]:
    if not _COMPILED:
        _COMPILED.append(torch.compile(rope_torch, dynamic=False))
    return _COMPILED[0](x, base=base, interleaved=interleaved, offset=offset)


# declared gaps (harness.Gap), each with the measured worst ratio and about 2x room (docs/kernels/torch-activations.md)
GAPS: tuple = ()

register_backend(Backend(
    operator="rope", name="torch", impl=rope_torch, devices=("cpu", "cuda"), expected_gaps=GAPS,
    dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
    description="eager torch: float32 cos/sin cast to the case dtype, x * cos + rotate(x) * sin, autograd backward"))

register_backend(Backend(
    operator="rope", name="torch-compile", impl=rope_compiled, devices=("cuda",), role="speed-reference",
    dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
    description="torch.compile of the eager backend: the speed reference of the Triton target, not judged"))
