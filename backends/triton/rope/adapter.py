"""Registers the Triton backend of ``rope`` (no triton import here)."""

from harness import Backend, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/rope/"

register_backend(Backend(
    operator="rope", name="triton", impl=".wrapper:rope_triton", package=__package__,
    devices=("cpu", "cuda"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # tiles: BLOCK_T positions x BLOCK_H heads x the whole head dimension; must match wrapper.CPU_CONFIG /
    # GPU_CONFIG (tests/test_triton_activations.py checks it)
    blocks={"BLOCK_T": 4, "BLOCK_H": 2} if interpreted() else {"BLOCK_T": 16, "BLOCK_H": 4},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True,
    description="Triton: one program per (batch, position tile, head block), angles and cos/sin in float32 "
                "in the kernel; the backward is the same kernel rotating by the negated angle"))
