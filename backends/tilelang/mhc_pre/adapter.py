"""Registers the TileLang backend of ``mhc_pre`` (no tilelang or torch.cuda import here)."""

from harness import Backend, Gap, register_backend

_DIR = "backends/tilelang/mhc_pre/"
# The backward takes the sigmoid as s = h_pre - hc_eps (kernels.py; docs/specs/mhc_pre.md's formula), from the
# float32 h_pre: at saturating gates s ~ 1, and 1 - s in dh_pre * s * (1 - s) keeps few of its bits, which the
# floor (s as the sigmoid returned it) keeps. dalpha.pre, a sum of those terms, was 5x the floor's error in every
# dtype on an H200: 1.56x (float32), 1.85x (bf16), 1.79x (fp16) its bound (seed 31, saturating). Saving s, or
# 1 - s from the logit, would fix it.
_SATURATING = Gap("the backward recovers the sigmoid as h_pre - hc_eps (the spec's formula): at saturating gates "
                  "1 - s keeps few bits", components=("dalpha.pre",), tags=("saturating",), ceiling=4.0)

register_backend(Backend(
    operator="mhc_pre", name="tilelang", impl=".wrapper:mhc_pre_tilelang", package=__package__,
    devices=("cuda",), requires=("tilelang",),
    dtypes=("float32", "bfloat16", "float16"),
    # forward: tiles of BLOCK_T tokens x BLOCK_ND flattened features (kernels.plan BT, BK); the dx
    # kernel's tiles are BLOCK_T tokens x (per stream) 64 features for n = 3, 4 (other n: plan.BD)
    blocks={"BLOCK_ND": 64, "BLOCK_T": 64},
    sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
    expected_gaps=(_SATURATING,), deterministic=True, matmul_precision="ieee",
    description="TileLang: forward = per token tile, h_mix on bf16 tensor cores (operands split into "
                "bf16 pieces: float32-accurate products) + sum of squares, coefficients, then h_in "
                "(x read twice); backward = per-token scalars with dh_pre, then dx and dphi partials "
                "per (D slice of all streams, token split), fixed-order reductions; long tensor-core "
                "reductions restart per tile (float32 adds across tiles), products of pieces summed "
                "smallest first; TMA pipelines only where D % 64 == 0 (bwd_col: only where all "
                "its copies can be TMA, as planned bf16 with n = 4; a plain loop elsewhere)"))
