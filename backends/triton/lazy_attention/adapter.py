"""Registers the two Triton backends of ``lazy_attention`` (no triton import here)."""

from harness import Backend, register_backend
from harness.registry import interpreted

_DIR = "backends/triton/lazy_attention/"

for _name, _impl, _desc in (
    ("triton", "lazy_attention_triton",
     "Triton: forward LSE + output passes; backward Delta (sum p dp, dtau shares), dk/dv with dbias partial "
     "rows storing ds (about B*H*L*L/2 elements), dq as a GEMM over ds (the recompute path where ds exceeds "
     "LAZY_ATTENTION_DS_BUDGET bytes, default 2 GiB), and a deterministic reduction"),
    ("triton-recompute", "lazy_attention_triton_recompute",
     "Triton, recompute backward always: Delta (sum p dp, dtau shares), dq with dbias partial rows "
     "recomputing p and dp, dk/dv, and a deterministic reduction; no L*L memory"),
):
    register_backend(Backend(
        operator="lazy_attention", name=_name, impl=f".wrapper:{_impl}", package=__package__,
        devices=("cuda", "cpu"), interpret=True, requires=("triton",),
        dtypes=("float32", "bfloat16", "float16"),
        # query blocks of the dq kernels, key blocks of the dk/dv kernels (16-bit inputs, GPU: 64 and 64 on
        # the ds path; the recompute path's 64-row dq and 128-key dk/dv blocks fit blocks of 64 too)
        blocks={"BLOCK_M": 16, "BLOCK_N": 16} if interpreted() else {"BLOCK_M": 64, "BLOCK_N": 64},
        sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
        deterministic=True, matmul_precision="ieee", description=_desc))
