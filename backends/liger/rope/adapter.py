"""Registers Liger's RoPE as ``rope/liger`` where liger_kernel is installed (docs/kernels/liger.md): the half-split
layout only."""

from __future__ import annotations

from harness.backends.liger._release import description, installed, kernel_files, origin

from harness import Backend, ContractException, register_backend


def _half_split_only(case, dtype: str, device: str) -> str | None:
    if case.params.get("interleaved"):
        return "Liger's RoPE rotates half-split pairs (p, p + D/2) only (a declared limitation)"
    return None


if installed():
    register_backend(Backend(
        operator="rope", name="liger", impl=".wrapper:rope_liger", package=__package__, devices=("cpu", "cuda"),
        interpret=True, requires=("liger_kernel",), origin=origin(), skip=_half_split_only,
        sources=(__file__, __file__.replace("adapter.py", "wrapper.py"), *kernel_files("rope.py")),
        contract_exceptions=(ContractException(
            "input-unchanged", "Liger rotates q and k in place, and their gradients in place, by design"),),
        deterministic=True, description=description("liger_rope (Hugging Face cos/sin in the case dtype)")))
