"""Registers the Triton backends of ``swiglu`` and ``geglu`` (no triton import here)."""

from harness import Backend, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/gated_mlp/"

for _op, _impl in (("swiglu", ".wrapper:swiglu_triton"), ("geglu", ".wrapper:geglu_triton")):
    register_backend(Backend(
        operator=_op, name="triton", impl=_impl, package=__package__,
        devices=("cpu", "cuda"), interpret=True, requires=("triton",),
        dtypes=("float32", "bfloat16", "float16"),
        # tiles of both kernels: BLOCK_R rows x BLOCK_F features; must match wrapper.CPU_CONFIG / GPU_CONFIG
        # (tests/test_triton_activations.py checks it)
        blocks={"BLOCK_R": 4, "BLOCK_F": 32} if interpreted() else {"BLOCK_R": 4, "BLOCK_F": 1024},
        sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
        deterministic=True,
        description="Triton: elementwise kernels over (row tile, feature block), activation and derivative in "
                    "float32; one read of each input and one write of each gradient"))
