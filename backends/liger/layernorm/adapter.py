"""Registers Liger's LayerNorm as ``layernorm/liger`` where liger_kernel is installed (docs/kernels/liger.md).
GPU only: the kernel fails under the Triton interpreter (backends/liger/_release.py)."""

from __future__ import annotations

import math

from harness.backends.liger._release import description, installed, kernel_files, origin

from harness import Backend, Gap, register_backend

# one feature: x - mean is exactly 0, so dx is exactly 0 and its bound 0; Liger's backward leaves rounding there
# (dx 5.9e-6 in float32 on an H200, R3-F1): an infinite ratio, whatever its size, as eager torch's (same gap)
ONE_FEATURE = Gap("Liger's LayerNorm backward leaves rounding in dx where the exact one is 0 (one feature)",
                  dtypes=("float32",), components=("dx", "dw"), tags=("features1",), ceiling=math.inf)

if installed():
    register_backend(Backend(
        operator="layernorm", name="liger", impl=".wrapper:layernorm_liger", package=__package__,
        devices=("cuda",), requires=("liger_kernel",), origin=origin(),
        sources=(__file__, __file__.replace("adapter.py", "wrapper.py"), *kernel_files("layer_norm.py")),
        expected_gaps=(ONE_FEATURE,), deterministic=True,
        description=description("liger_layer_norm")))
