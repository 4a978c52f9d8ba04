"""Bug-zoo mutants of the Triton fused_linear_xent backend (docs/specs/bug-zoo.md, seed: fused xent log).

Edits apply to a temporary copy of backends/triton/fused_linear_xent/.
"""

from __future__ import annotations

from harness.cases.fused_linear_xent import C

from harness import Expectation, Mutant, register_mutant
from harness.model.twins import twin

SEED = "fused-xent-microbatch-debug.md"

# The seed's first suspect: the dweight running sum across token chunks kept in bfloat16. One
# rounding per chunk; with 128 chunks of the GPU's 2048 tokens the rms error grows ~sqrt(64) times
# a single rounding, well past the floor. bf16 only runs on the GPU (the interpreter's bf16 dot is
# wrong), so this mutant is skipped on CPU. float32 inputs accumulate in float32 either way.
register_mutant(Mutant(
    id="xent-naive-bf16-accum", operator="fused_linear_xent", backend="triton", seed=SEED,
    edits=(("wrapper.py", "dtype=torch.float32, device=h.device)  # dweight: float32 across chunks",
            "dtype=W.dtype, device=h.device)  # dweight: float32 across chunks"),),
    expect=(Expectation(C("zoo-bf16-accum-N262144-H32-V67", 262144, 32, 67, ignored=0.2), "bfloat16",
                        fail=("dweight",), passing=("loss", "dhidden", "dbias"),
                        # H100 (d98c020): none; its error is beyond 3x the bf16-math reference's
                        hint="precision|none"),),
    description="dweight accumulated across token chunks in the input dtype (bf16) instead of float32"))

# The classic microbatch mistake: the wrapper drops the caller's global normalizer, so each
# microbatch divides by its own valid-token count (the parts have unequal counts).
register_mutant(Mutant(
    id="xent-microbatch-mean", operator="fused_linear_xent", backend="triton", seed=SEED,
    edits=(("wrapper.py", "use_norm = normalizer is not None", "use_norm = False"),),
    expect=(Expectation(C("zoo-N24-H16-V67-mb2", 24, 16, 67, microbatches=2), "float32", hint="microbatch-mean",
                        fail=("loss", "dhidden", "dweight", "dbias"), status="FAIL",
                        where={"dhidden": {"token": "all"}}),),
    description="per-microbatch mean instead of the global normalizer"))

# The seed's g_lse path: the LSE's upstream gradient (which carries the z-loss, and the LSE
# output's own gradient) never reaches dZ. Invisible without z-loss and LSE gradient.
register_mutant(Mutant(
    id="xent-lse-grad-dropped", operator="fused_linear_xent", backend="triton", seed=SEED,
    edits=(("kernels.py", "a = coef * (1.0 + 2.0 * lam * lse) + gl", "a = coef"),),
    expect=(
        Expectation(C("zoo-N32-H24-V129-zloss", 32, 24, 129, ignored=0.2, z_loss=1e-2), "float32", hint="none",
                    fail=("dhidden", "dweight"), passing=("loss",)),
        Expectation(C("zoo-N32-H24-V129-lse-sum", 32, 24, 129, ignored=0.2, return_lse=True, reduction="sum"),
                    "float32", fail=("dhidden", "dweight"), passing=("loss", "lse")),
        Expectation(C("zoo-N32-H24-V129-plain", 32, 24, 129, ignored=0.2), "float32",
                    passing=("loss", "dhidden", "dweight", "dbias")),
    ),
    description="g_lse path omitted: z-loss and the LSE output's gradient never reach dZ"))

# Issue 26: no preset gave hidden an innermost stride other than 1 (its only other layout is padded rows), so a
# kernel that assumed one passed every cell. The layout twins (harness/model/twins.py) give it stride 2 and catch it;
# the base case passes, as the last expectation shows.
BASE = C("zoo-N32-H24-V129", 32, 24, 129, ignored=0.2)
register_mutant(Mutant(
    id="xent-hidden-unit-stride", operator="fused_linear_xent", backend="triton", seed="issue 26 (layout twins)",
    edits=(("wrapper.py", "T, V, H, h.stride(0), h.stride(1), W.stride(0)", "T, V, H, h.stride(0), 1, W.stride(0)"),),
    # every logit reads the NaN gaps of hidden's buffer: every component NaN, on every token and hidden block
    expect=(Expectation(twin(BASE, "stride"), "float32", fail=("loss", "dhidden", "dweight", "dbias"),
                        where={"dhidden": {"token": "all", "hidden": "all"}}),
            Expectation(BASE, "float32", passing=("loss", "dhidden", "dweight", "dbias"))),
    description="the logits kernel reads hidden as if its innermost stride were 1"))

# Local errors (issue #44): small against the component's largest values, so the global criteria pass them;
# large against the tiles they sit in, where the local rule (harness/judge/verdict.py) fails them.
#
# One tile of the vocabulary (planted): the probabilities of vocabulary entries 1024-1151 (a tile of the GPU's
# and the interpreter's BLOCK_V = 128) come out 10% high. dweight's rows there are ~1/V of the rows of the
# tokens' targets, which set max|dweight|: 10% of them is under the global max criterion's 2 eps * max|o|.
register_mutant(Mutant(
    id="xent-vocab-tile-scaled", operator="fused_linear_xent", backend="triton",
    seed="issue 44 (one tile of a large V)",
    edits=(("kernels.py", "    p = tl.exp(z - lse[:, None])\n",
            "    p = tl.exp(z - lse[:, None]) * tl.where(cols[None, :] // 128 == 8, 1.1, 1.0)\n"),),
    # 16-bit: float32's bound is tight enough to fail it globally (108x); bfloat16 runs on a GPU only
    expect=(Expectation(C("zoo-N16-H8-V16384", 16, 8, 16384, ignored=0.2), "float16", fail=("dweight",),
                        hint="local"),
            Expectation(C("zoo-N16-H8-V16384", 16, 8, 16384, ignored=0.2), "bfloat16", fail=("dweight",),
                        hint="local")),
    local_only=True,
    description="planted: the probabilities of one vocabulary tile (1024-1151) 10% high"))

# A careful floor (issue #44): a confident token's loss is log1p(r), r ~ 1e-10. The float32 floor used to form it
# as m + log(1 + r) - z_y, which rounds it to 0, so a kernel doing the same passed; the floor now keeps it
# (references/softmax_xent.py, careful_cross_entropy) and tests/test_careful_floor.py shows both verdicts.
CONFIDENT = C("zoo-N16-H64-V67-confident-none", 16, 64, 67, ("confident", "reduction"), confident=1.0,
              reduction="none")
register_mutant(Mutant(
    id="xent-log-not-log1p", operator="fused_linear_xent", backend="triton",
    seed="issue 44 (log instead of log1p)",
    edits=(("kernels.py", "    log_s = _log1p(r)\n", "    log_s = tl.log(1.0 + r)\n"),),
    # in 16 bits the unmutated kernel's dweight is off too there (adapter.py, _DZ_FLUSHED)
    expect=(Expectation(CONFIDENT, "float32", fail=("loss",), passing=("dhidden", "dweight", "dbias")),
            Expectation(CONFIDENT, "float16", fail=("loss",)), Expectation(CONFIDENT, "bfloat16", fail=("loss",))),
    description="the row's log-sum-exp as log(1 + r) instead of log1p(r): a confident token's loss rounds to 0"))
