"""Registers the two Triton backends of ``fused_linear_xent`` (no triton import here)."""

from harness import Backend, Gap, register_backend
from harness.model.registry import interpreted

_DIR = "backends/triton/fused_linear_xent/"
# both modes form dZ in the GEMM dtype: a token whose every probability is ~1e-10 (cases tagged confident, each
# token's gradient its own under reduction none) has a dZ below float16's smallest subnormal (6e-8), flushed to 0,
# so its dweight is 0 where the floor's is not (CPU smoke N6-H64-V40-confident-none); bfloat16 keeps float32's
# range, and float16 training's loss scaling lifts dZ back into range
_DZ_FLUSHED = Gap("dZ is rounded to float16 for the GEMMs: a confident token's dZ (~1e-10) is below float16's "
                  "range and flushes to 0", dtypes=("float16",), components=("dweight",), tags=("confident",),
                  ceiling=1e7, range_errors=True)
# token tile, vocabulary tile of the LSE partials, hidden tile of dweight: the
# logits and dweight GEMM tiles of wrapper.INTERPRETER / wrapper.GPU (tests check they agree)
BLOCKS = {"BLOCK_N": 16, "BLOCK_V": 128, "BLOCK_H": 16} if interpreted() else \
    {"BLOCK_N": 128, "BLOCK_V": 128, "BLOCK_H": 256}


for _name, _impl, _desc in (
    ("triton", "fused_linear_xent_fast",
     "Triton, fast mode: float32 logits with online-LSE partials (float16 offsets from each tile's max for "
     "bf16). Where the batch's logits take no more memory than the chunked design below (N*V*2 <= V*H*4 + "
     "chunk*V*2), the forward keeps them and the backward forms dZ once with the real upstream gradient and "
     "finishes dhidden = dZ W and dweight = dZ^T h in one float32-accumulated GEMM each (cuBLAS with float32 "
     "reductions for bf16 on a GPU, Triton otherwise): 6*N*H*V FLOPs for every reduction. Larger batches run "
     "token chunks: dZ once per chunk in place over its logits, dweight += dZ^T h into a float32 [V, H] "
     "buffer, 6*N*H*V for mean/sum without an LSE output (gradients formed in the forward, scaled by g/D in "
     "the backward), 8*N*H*V otherwise. Extra memory ~ min(N*V*2, V*H*4 + chunk*V*2)."),
    ("triton-lean", "fused_linear_xent_lean",
     "Triton, lean mode: vocabulary outer; forward LSE pass (logits never stored), backward per "
     "vocabulary slab recomputes the logits of all tokens into dZ, finishes that dweight slab in one "
     "float32 GEMM over all tokens, adds dZ W_slab to a float32 [N, H] accumulator. The accumulator and "
     "most slabs' dZ live in dweight rows not yet written; the accumulator's own slabs go first for "
     "dhidden and are recomputed last for dweight: (8 + 4N/V)*N*H*V FLOPs for 16-bit inputs, extra memory "
     "about N*slab*2 beside the gradients, no V*H float32 buffer."),
):
    register_backend(Backend(
        operator="fused_linear_xent", name=_name, impl=f".wrapper:{_impl}", package=__package__,
        devices=("cuda", "cpu"), interpret=True, requires=("triton",),
        dtypes=("float32", "bfloat16", "float16"), blocks=dict(BLOCKS),
        sources=tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py")),
        expected_gaps=(_DZ_FLUSHED,),
        deterministic=True, matmul_precision="ieee", description=_desc))
