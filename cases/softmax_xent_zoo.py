"""Bug-zoo mutants of the raw CUDA softmax_xent backend (docs/specs/bug-zoo.md); they run on a GPU only.

Edits apply to backends/cuda/softmax_xent/ (a temporary copy; the mutated .cu gets its own build).
"""

from __future__ import annotations

from harness.cases.softmax_xent import C

from harness import Expectation, Mutant, register_mutant

SEED = "cuda-softmax-xent-kahan-fix.md"

# The seed's first kernel: one thread per vocabulary entry. For V > 1024 the launch is an invalid
# configuration and nothing runs; the launcher returns that error and the wrapper raises. For
# V <= 1024 the grid-stride loops and the partial-warp reductions keep it correct (the real kernel
# uses 256 threads there; V = 1000 gives a last warp of 8 threads).
register_mutant(Mutant(
    id="xent-block-eq-vocab", operator="softmax_xent", backend="cuda", seed=SEED,
    edits=(("softmax_xent.cu", "return V * es >= 128 * 1024 ? 512 : 256;", "return (int)V;"),),
    expect=(
        Expectation(C("zoo-N8-V1025", 8, 1025, ignored=0.2), "float32", status="CRASH|ERROR"),
        Expectation(C("zoo-N8-V1024", 8, 1024, ignored=0.2), "float32", passing=("loss", "dlogits")),
        Expectation(C("zoo-N8-V1000", 8, 1000, ignored=0.2), "bfloat16", passing=("loss", "dlogits")),
    ),
    description="blockDim = V: launch fails for V > 1024 (raised, not silent); correct for V <= 1024"))

# The vectorization remainder: the scalar tail after the last 16-byte vector of a row is dropped.
# fp32 rows of V = 1025 end in 0-3 tail elements (rows are 4100 bytes, so the alignment shifts by
# row): the loss misses their exp terms and dlogits keeps the NaN poison in columns 1022-1024 (the
# last vocab blocks of BLOCK_V); the missing exp terms shift every row's LSE, so every block is wrong
# (measured on an H200 with BLOCK_V = 512: vocab blocks 0-2 of 3 bad). V = 1024 fp32 rows are whole
# vectors.
register_mutant(Mutant(
    id="xent-vector-tail-dropped", operator="softmax_xent", backend="cuda",
    seed="project: vectorized row loops",
    edits=(("softmax_xent.cu", "s.tail_hi = part == parts - 1 ? V : s.tail_lo;", "s.tail_hi = s.tail_lo;"),),
    expect=(
        Expectation(C("zoo-N8-V1025", 8, 1025, ignored=0.2), "float32", fail=("loss", "dlogits"), hint="never-written",
                    where={"dlogits": {"vocab": "all"}}),
        Expectation(C("zoo-N8-V1024", 8, 1024, ignored=0.2), "float32", passing=("loss", "dlogits")),
    ),
    description="scalar tail after the last aligned vector of a row never read nor written"))

# A 32-bit row offset: row * ls truncated to int. Rows past 2^31 / V elements then read their logits
# (and the forward, for an upstream gradient of one, writes their dlogits) 2^32 elements before their own
# place: out of the buffer, a fault or garbage. Identical to the real kernel wherever (N-1)*V < 2^31, so
# every smoke and sweep case passes; only the full preset's 64-bit case (issue #26) reaches it.
register_mutant(Mutant(
    id="xent-row-offset-32bit", operator="softmax_xent", backend="cuda",
    seed="project: 64-bit offsets",
    edits=(("softmax_xent.cu", "return base + row * ls;  // 64-bit: N*V exceeds 2^31 in the full preset",
            "return base + (int)(row * ls);"),),
    expect=(
        Expectation(C("N16385-V131073-int64", 16385, 131073, ("64-bit-offsets",), ignored=0.2), "bfloat16",
                    status="CRASH|FAIL"),
        Expectation(C("zoo-N8-V1025", 8, 1025, ignored=0.2), "float32", passing=("loss", "dlogits")),
    ),
    description="row offsets in 32 bits: rows past 2^31 elements read outside the logits"))
