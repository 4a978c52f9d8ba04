"""Registers the Triton backend of ``mhc_pre`` (no triton import here)."""

from harness import Backend, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/mhc_pre/"

register_backend(Backend(
    operator="mhc_pre", name="triton", impl=".wrapper:forward_saved", backward=".wrapper:backward_saved",
    package=__package__,
    devices=("cuda", "cpu"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # tiles of the dx / dphi kernel: BLOCK_ND features of one stream (blocks restart at each stream)
    # x BLOCK_T tokens; must match wrapper.CPU_CONFIG / GPU_CONFIG (a test checks it)
    blocks={"BLOCK_ND": 64, "BLOCK_T": 16} if interpreted() else {"BLOCK_ND": 128, "BLOCK_T": 32},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True, matmul_precision="ieee",
    description="Triton: split-K GEMM + sum of squares on bf16 tensor cores with exact float32 products "
                "(operands split into bf16 parts), epilogue + h_in; backward: per-token scalars, then "
                "dx and dphi partials per (stream block, token group), fixed-order reductions"))
