"""Registers Liger's SwiGLU and GEGLU as ``swiglu/liger`` and ``geglu/liger`` where liger_kernel is installed
(docs/kernels/liger.md). GPU only: the kernels fail under the Triton interpreter (backends/liger/_release.py)."""

from __future__ import annotations

from harness.backends.liger._release import description, installed, kernel_files, origin

from harness import Backend, ContractException, register_backend

# the backward writes dgate and dup over the gate and up tensors the forward saved: the caller's inputs
OVERWRITES_INPUTS = ContractException(
    "input-unchanged", "Liger's backward writes dgate and dup over the saved gate and up, by design (no gradient "
    "buffers)")


def _tanh_only(case, dtype: str, device: str) -> str | None:
    if case.params.get("approximate", "none") != "tanh":
        return "Liger's GEGLU is gelu's tanh approximation only (a declared limitation)"
    return None


if installed():
    for _op, _fn, _file, _skip in (("swiglu", "swiglu_liger", "swiglu.py", None),
                                   ("geglu", "geglu_liger", "geglu.py", _tanh_only)):
        register_backend(Backend(
            operator=_op, name="liger", impl=f".wrapper:{_fn}", package=__package__, devices=("cuda",),
            requires=("liger_kernel",), origin=origin(), skip=_skip, contract_exceptions=(OVERWRITES_INPUTS,),
            sources=(__file__, __file__.replace("adapter.py", "wrapper.py"), *kernel_files(_file)),
            deterministic=True, description=description(f"liger_{_op}")))
