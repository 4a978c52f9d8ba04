"""``swiglu`` and ``geglu`` in eager torch, as a user would write them, in the case dtype:
``F.silu(gate) * up`` and ``F.gelu(gate, approximate=...) * up``; autograd does the backward.

Also ``torch-compile`` of each (role speed-reference, GPU only): the same function under ``torch.compile``,
which fuses it into one elementwise kernel per pass. It is what the Triton backends' speed target is measured
against (cases/swiglu.py, cases/geglu.py), and is not judged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness import Backend, register_backend

Tensor = torch.Tensor


def swiglu_torch(gate: Tensor, up: Tensor) -> dict[str, Tensor]:
    return {"out": F.silu(gate) * up}


def geglu_torch(gate: Tensor, up: Tensor, *, approximate: str = "none") -> dict[str, Tensor]:
    return {"out": F.gelu(gate, approximate=approximate) * up}


_COMPILED: dict[str, object] = {}


def _compiled(name: str, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


def swiglu_compiled(gate: Tensor, up: Tensor) -> dict[str, Tensor]:
    return _compiled("swiglu", swiglu_torch)(gate, up)


def geglu_compiled(gate: Tensor, up: Tensor, *, approximate: str = "none") -> dict[str, Tensor]:
    return _compiled("geglu", geglu_torch)(gate, up, approximate=approximate)


_EAGER = "eager torch rounds act(gate) to the case dtype before the product, and autograd rounds its intermediates"

# declared gaps (harness.Gap), each with the measured worst ratio and about 2x room: none, as the CPU sweeps
# (fp32, fp16) pass every cell, worst 0.88 of the bound (docs/kernels/torch-activations.md); bf16 is GPU only
GAPS: dict[str, tuple] = {
    "swiglu": (),
    "geglu": (),
}

for _op, _impl, _fast in (("swiglu", swiglu_torch, swiglu_compiled), ("geglu", geglu_torch, geglu_compiled)):
    register_backend(Backend(
        operator=_op, name="torch", impl=_impl, devices=("cpu", "cuda"),
        expected_gaps=GAPS[_op], dtypes=("float32", "bfloat16", "float16"), deterministic=True,
        sources=(__file__,), description=f"eager torch in the case dtype ({'F.silu' if _op == 'swiglu' else 'F.gelu'}"
                                         "(gate) * up), autograd backward"))
    register_backend(Backend(
        operator=_op, name="torch-compile", impl=_fast, devices=("cuda",), role="speed-reference",
        dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
        description="torch.compile of the eager backend: the speed reference of the Triton target, not judged"))
