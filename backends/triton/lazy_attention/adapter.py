"""Registers the Triton backend of ``lazy_attention`` (no triton import here)."""

from harness import Backend, register_backend
from harness.registry import interpreted

_DIR = "backends/triton/lazy_attention/"

register_backend(Backend(
    operator="lazy_attention", name="triton", impl=".wrapper:lazy_attention_triton", package=__package__,
    devices=("cuda", "cpu"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # query blocks of the dq kernel, key blocks of the dk/dv kernel (16-bit inputs, GPU; the dq kernel's
    # query blocks are 128 at Dh=128, 64 below: localization in blocks of 64 fits both)
    blocks={"BLOCK_M": 16, "BLOCK_N": 16} if interpreted() else {"BLOCK_M": 64, "BLOCK_N": 128},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True, matmul_precision="ieee",
    description="Triton: forward LSE + output passes; backward Delta (sum p dp) + dq with per-block "
                "dbias/dtau partial rows, dk/dv, and a deterministic reduction"))
