"""Registers the Triton backend of ``lazy_attention`` (no triton import here)."""

from harness import Backend, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/lazy_attention/"

register_backend(Backend(
    operator="lazy_attention", name="triton", impl=".wrapper:lazy_attention_triton", package=__package__,
    devices=("cuda", "cpu"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # query blocks of the Delta+dq kernel and key blocks of the dk/dv kernel: 64 on the GPU at every head dim
    # (16-bit inputs; the 32-key Delta tiles and 32-query dk/dv tiles at Dh = 128 nest in them)
    blocks={"BLOCK_M": 16, "BLOCK_N": 16} if interpreted() else {"BLOCK_M": 64, "BLOCK_N": 64},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True, matmul_precision="ieee",
    description="Triton: forward LSE + output passes; backward Delta (sum p dp, dtau shares) with dq in the same "
                "pass, dk/dv with dbias partial rows, and a deterministic reduction; no L*L memory"))
