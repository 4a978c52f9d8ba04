"""Bug-zoo mutants of the Triton lazy_attention backend (docs/specs/bug-zoo.md); they run on CPU too.

Edits apply to a copy of backends/triton/lazy_attention/. The seed bugs only show with H >= 2, and
the dO head-stride bug only when q and dO have different strides: q/k/v are transposed views of a
[B,L,H,Dh] buffer (head stride Dh) while dO is contiguous (head stride L*Dh).
"""

from __future__ import annotations

from harness.cases.lazy_attention import QKV_T, C

from harness import Expectation, register_mutant
from harness.model.spec import Mutant
from harness.model.twins import twin

# L = 33 spans three interpreter blocks of 16; W = 40 > L and > BLOCK
CASE = C("zoo-B2-H3-L33-W40-qkvT-dOcontig", 2, 3, 33, 16, 40, ("zoo",), tau="neg", layout=QKV_T,
         grad_layout="contiguous")
GRADS = ("dq", "dk", "dv", "dbias", "dtau")

register_mutant(Mutant(
    id="lazy-do-head-stride", operator="lazy_attention", backend="triton",
    seed="lazy-attention-multihead-gradient-fix.md",
    description="dO addressed with q's head stride in the Delta+dq and dk/dv kernels",
    edits=(("wrapper.py", "*do.stride(), *o.stride(),", "do.stride(0), q.stride(1), do.stride(2), do.stride(3), "
            "*o.stride(),"),
           ("wrapper.py", "dk, dv, part, *q.stride(), *k.stride(), *v.stride(), *do.stride(),",
            "dk, dv, part, *q.stride(), *k.stride(), *v.stride(), do.stride(0), q.stride(1), do.stride(2), "
            "do.stride(3),")),
    expect=(Expectation(CASE, "float32", fail=GRADS, passing=("o",), hint="stride",
                        where={c: {"head": "all-but-first"} for c in GRADS}),),
))

register_mutant(Mutant(
    id="lazy-head0-atomics", operator="lazy_attention", backend="triton",
    seed="lazy-attention-multihead-gradient-debug.md",
    description="dbias/dtau of every head accumulated into head 0's slot (head 0 holds the sum)",
    edits=(("kernels.py", "dst_h = h", "dst_h = 0"),),
    expect=(Expectation(CASE, "float32", fail=("dbias", "dtau"), passing=("o", "dq", "dk", "dv"), hint="none",
                        where={"dbias": {"head": "all"}, "dtau": {"head": "all"}}),),
))
# L = 160: query blocks with two or more key blocks below their diagonal tile on the CPU (16-key blocks: rows
# from 32 on) and on the GPU (32-key blocks: rows from 64 on). The zoo's CASE (L = 33) has at most one there on
# a GPU, where this mutant changes nothing (missed on an H100 at a9b755e).
LONG = C("zoo-B1-H2-L160-W40-qkvT-dOcontig", 1, 2, 160, 16, 40, ("zoo",), tau="neg", layout=QKV_T,
         grad_layout="contiguous")
register_mutant(Mutant(
    id="lazy-dq-last-key-block", operator="lazy_attention", backend="triton",
    seed="mhc-triton-backward-bugfix-log.md",
    description="the Delta kernel's dq GEMM keeps only the last key block below the diagonal (accumulator not "
                "carried)",
    edits=(("kernels.py", "acc_ds = tl.dot(x.to(k.dtype), k, acc_ds, input_precision=PREC)",
            "acc_ds = tl.dot(x.to(k.dtype), k, input_precision=PREC)"),),
    # the wrong rows start at 32 on the CPU and at 64 on the GPU: no localization pattern holds on both
    expect=(Expectation(LONG, "float32", fail=("dq",), passing=("o", "dk", "dv", "dbias", "dtau")),),
))

# Issue 26: no preset gave q and k different innermost strides, so a kernel that addressed one with the other's
# passed every cell. Caught only by the mixed layout twin (harness/model/twins.py: q, k, v, bias, tau, dO with innermost
# strides 2 ... 7); the stride twin (every innermost stride 2) and the base case pass, as the expectations show.
STRIDE_TWIN, MIXED_TWIN = twin(CASE, "stride"), twin(CASE, "mixed")
register_mutant(Mutant(
    id="lazy-k-with-q-inner-stride", operator="lazy_attention", backend="triton", seed="issue 26 (layout twins)",
    description="the forward LSE pass addresses k with q's innermost stride",
    edits=(("wrapper.py", "q, k, bias, lse, *q.stride(), *k.stride(), bias.stride(0)",
            "q, k, bias, lse, *q.stride(), *k.stride()[:3], q.stride(3), bias.stride(0)"),),
    # "layout": the base case passes, so the NaN it reads is laid to the twin's layout (issue #44), not to memory
    # never written
    expect=(Expectation(MIXED_TWIN, "float32", fail=("o",) + GRADS, hint="layout"),
            Expectation(STRIDE_TWIN, "float32", passing=("o",) + GRADS),
            Expectation(CASE, "float32", passing=("o",) + GRADS)),
))

# Local errors (issue #44), one head of many (planted): the last head's dq 10% high, in a case whose last head is
# dormant (its v 1e-3 of the others', as trained models have heads with near-zero values), so that its dq is ~1e-3
# of max|dq|. The global criteria pass it in 16 bits (tests/test_local_mutants.py); the local rule fails it in that
# head's tiles. With heads of one magnitude the global max criterion is the local one, and fails a head's 10%.
QUIET = C("zoo-B1-H4-L40-W16-quiet", 1, 4, 40, 16, 16, ("zoo",), tau="neg", quiet_head=1e-3)
register_mutant(Mutant(
    id="lazy-last-head-dq-scaled", operator="lazy_attention", backend="triton",
    seed="issue 44 (one head of many)",
    description="planted: the last head's dq 10% high",
    edits=(("kernels.py", "(dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None])",
            "(dq * scale * tl.where(h == H - 1, 1.1, 1.0)).to(DQ.dtype.element_ty), mask=rows[:, None])"),),
    expect=tuple(Expectation(QUIET, dt, fail=("dq",), passing=("o", "dk", "dv", "dbias", "dtau"), hint="local")
                 for dt in ("float16", "bfloat16")),
    local_only=True))
