"""Registers the Triton backend of ``mhc_pre`` (no triton import here)."""

from harness import Backend, Gap, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/mhc_pre/"
# dx = (phi * gamma)^T dh_mix - coef x + h_pre g_in: for 16-bit x the first GEMM keeps the bf16 part products
# above 2^-16 (kernels.py _dot_pp, MM_ORDER 1: "enough for a 16-bit result"), but at one feature per stream its
# first two terms are equal (the rms normalization's gradient is 0 there) and their difference keeps that
# 2^-16 of each: dx 7.6 fp16 ulps off, 2.88x its bound (CPU seed 31, n1-D1-T1 float16). MM_ORDER 2 at D = 1
# would fix it; it needs a GPU run.
_ONE_FEATURE = Gap("at one feature per stream dx's two GEMM terms cancel exactly, and the 16-bit path's GEMM keeps "
                   "their product bits above 2^-16 only", dtypes=("float16", "bfloat16"), components=("dx",),
                   tags=("features1",), ceiling=10.0)

register_backend(Backend(
    operator="mhc_pre", name="triton", impl=".wrapper:forward_saved", backward=".wrapper:backward_saved",
    package=__package__,
    devices=("cuda", "cpu"), interpret=True, requires=("triton",),
    dtypes=("float32", "bfloat16", "float16"),
    # tiles of the dx / dphi kernel: BLOCK_ND features of one stream (blocks restart at each stream)
    # x BLOCK_T tokens; must match wrapper.CPU_CONFIG / GPU_CONFIG (a test checks it)
    blocks={"BLOCK_ND": 64, "BLOCK_T": 16} if interpreted() else {"BLOCK_ND": 128, "BLOCK_T": 32},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    expected_gaps=(_ONE_FEATURE,), deterministic=True, matmul_precision="ieee",
    description="Triton: split-K GEMM + sum of squares on bf16 tensor cores with exact float32 products "
                "(operands split into bf16 parts), epilogue + h_in; backward: per-token scalars, then "
                "dx and dphi partials per (stream block, token group), fixed-order reductions"))
