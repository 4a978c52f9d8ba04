"""Registers the Triton backend of ``lazy_attention`` (no triton import here)."""

from harness import Backend, register_backend
from harness.registry import interpreted

_DIR = "backends/triton/lazy_attention/"

register_backend(Backend(
    operator="lazy_attention", name="triton", impl=".wrapper:lazy_attention_triton", package=__package__,
    devices=("cuda", "cpu"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # query blocks of the dq kernels, key blocks of the dk/dv kernels (16-bit inputs, GPU: 64 and 64 on the
    # ds path; the recompute path's 64-row dq and 128-key dk/dv blocks fit localization in blocks of 64 too)
    blocks={"BLOCK_M": 16, "BLOCK_N": 16} if interpreted() else {"BLOCK_M": 64, "BLOCK_N": 64},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True, matmul_precision="ieee",
    description="Triton: forward LSE + output passes; backward Delta (sum p dp, dtau shares), dk/dv with "
                "dbias partial rows storing ds, dq as a GEMM over ds (a dq kernel recomputing p and dp where "
                "ds exceeds the memory budget), and a deterministic reduction"))
