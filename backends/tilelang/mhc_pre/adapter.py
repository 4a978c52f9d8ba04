"""Registers the TileLang backend of ``mhc_pre`` (no tilelang or torch.cuda import here)."""

from harness import Backend, register_backend

_DIR = "backends/tilelang/mhc_pre/"
register_backend(Backend(
    operator="mhc_pre", name="tilelang", impl=".wrapper:mhc_pre_tilelang", package=__package__,
    devices=("cuda",), requires=("tilelang",),
    dtypes=("float32", "bfloat16", "float16"),
    # forward: tiles of BLOCK_T tokens x BLOCK_ND flattened features (kernels.plan BT, BK); the dx
    # kernel's tiles are BLOCK_T tokens x (per stream) 64 features for n = 3, 4 (other n: plan.BD)
    blocks={"BLOCK_ND": 64, "BLOCK_T": 64},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    deterministic=True, matmul_precision="ieee",
    description="TileLang: forward = per token tile, h_mix on bf16 tensor cores (operands split into "
                "bf16 pieces: float32-accurate products) + sum of squares, coefficients, then h_in "
                "(x read twice); backward = per-token scalars with dh_pre, then dx and dphi partials "
                "per (D slice of all streams, token split), fixed-order reductions; long tensor-core "
                "reductions restart per tile (float32 adds across tiles), products of pieces summed "
                "smallest first; TMA pipelines only where D % 64 == 0 (bwd_col: only where all "
                "its copies can be TMA, as planned bf16 with n = 4; a plain loop elsewhere)"))
