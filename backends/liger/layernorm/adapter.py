"""Registers Liger's LayerNorm as ``layernorm/liger`` where liger_kernel is installed (docs/kernels/liger.md).
GPU only: the kernel fails under the Triton interpreter (backends/liger/_release.py)."""

from __future__ import annotations

from harness.backends.liger._release import description, installed, kernel_files, origin

from harness import Backend, register_backend

if installed():
    register_backend(Backend(
        operator="layernorm", name="liger", impl=".wrapper:layernorm_liger", package=__package__,
        devices=("cuda",), requires=("liger_kernel",), origin=origin(),
        sources=(__file__, __file__.replace("adapter.py", "wrapper.py"), *kernel_files("layer_norm.py")),
        deterministic=True, description=description("liger_layer_norm")))
