"""Registers the Triton backend of ``layernorm`` (no triton import here)."""

from harness import Backend, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/layernorm/"

register_backend(Backend(
    operator="layernorm", name="triton", impl=".wrapper:layernorm_triton", package=__package__,
    devices=("cpu", "cuda"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # row tiles x feature blocks of the forward and backward kernels; must match wrapper.CPU_CONFIG /
    # GPU_CONFIG (tests/test_triton_norms.py checks it)
    blocks={"BLOCK_R": 8, "BLOCK_F": 32} if interpreted() else {"BLOCK_R": 16, "BLOCK_F": 512},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True,
    description="Triton: one program per row tile, feature loop in blocks, float32 math, two-pass variance; "
                "backward: dx and float32 dw/db partials per row tile, then fixed-order reductions (no atomics)"))
