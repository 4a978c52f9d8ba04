"""Registers Liger's RMSNorm (and its fused residual add) as ``rmsnorm/liger`` where liger_kernel is installed
(docs/kernels/liger.md). GPU only: the kernels fail under the Triton interpreter (backends/liger/_release.py)."""

from __future__ import annotations

from harness.backends.liger._release import description, installed, kernel_files, origin

from harness import Backend, ContractException, register_backend

if installed():
    register_backend(Backend(
        operator="rmsnorm", name="liger", impl=".wrapper:rmsnorm_liger", package=__package__,
        devices=("cuda",), requires=("liger_kernel",), origin=origin(),
        sources=(__file__, __file__.replace("adapter.py", "wrapper.py"),
                 *kernel_files("rms_norm.py", "fused_add_rms_norm.py")),
        contract_exceptions=(ContractException(
            "input-unchanged", "in_place=True, Liger's default, writes dx over the upstream gradient dy"),),
        deterministic=True,
        description=description("liger_rms_norm / liger_fused_add_rms_norm with their defaults (casting mode "
                                "llama, in place)")))
