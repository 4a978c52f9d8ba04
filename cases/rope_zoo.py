"""Bug-zoo mutants of the Triton rope backend (backends/triton/rope/) (docs/specs/bug-zoo.md); they run on the
CPU under the interpreter too.

The cases have 2 batches, 9 positions (tiles of 4 under the interpreter: the last one partial), 5 heads (blocks of
2: the last one a single head) and a head dimension of 32 (16 pairs). Positions start at 4095 unless the case says
offset 0, so that no angle is zero (at position 0 every rotation is the identity and hides a wrong pairing).
"""

from __future__ import annotations

from harness.cases.rope import OFFSET, C

from harness import Expectation, Mutant, register_mutant

HALF = C("zoo-B2-S9-H5-D32-half", 2, 9, 5, 32, ("zoo",), offset=OFFSET)
INTERLEAVED = C("zoo-B2-S9-H5-D32-il", 2, 9, 5, 32, ("zoo",), interleaved=True, offset=OFFSET)
NO_OFFSET = C("zoo-B2-S9-H5-D32-half-off0", 2, 9, 5, 32, ("zoo",))

# half-split pairs (p, p + D/2) taken as adjacent pairs (2p, 2p + 1), the interleaved layout's
register_mutant(Mutant(
    id="rope-half-split-as-pairs", operator="rope", backend="triton", seed="issue 47: rope pair layouts",
    description="half-split layout rotates pairs (2p, 2p+1) instead of (p, p + D/2)",
    edits=(("kernels.py", "        i1 = j\n        i2 = j + HALF\n", "        i1 = 2 * j\n        i2 = 2 * j + 1\n"),),
    expect=(Expectation(HALF, "float32", fail=("out", "dx"), where={"out": {"seq": "all", "head": "all"}}),
            Expectation(INTERLEAVED, "float32", passing=("out", "dx"))),
))

# the backward rotates back from position 0: right only where the offset is 0
register_mutant(Mutant(
    id="rope-backward-offset-ignored", operator="rope", backend="triton", seed="issue 47: rope position offset",
    description="the backward's inverse rotation at positions s instead of offset + s",
    edits=(("wrapper.py", "dx = rope_apply(dout, inv, ctx.offset, ctx.interleaved, -1)",
            "dx = rope_apply(dout, inv, 0, ctx.interleaved, -1)"),),
    expect=(Expectation(HALF, "float32", fail=("dx",), passing=("out",), where={"dx": {"head": "all"}}),
            Expectation(NO_OFFSET, "float32", passing=("out", "dx"))),
))

# the head mask one short: the last head of every position is never rotated nor written (NaN poison)
register_mutant(Mutant(
    id="rope-last-head-dropped", operator="rope", backend="triton", seed="issue 47: masks off by one",
    description="head mask h < H - 1: the last head never computed, in the forward and the backward",
    edits=(("kernels.py", "mask = (s < S)[:, None, None] & (h < H)[None, :, None]",
            "mask = (s < S)[:, None, None] & (h < H - 1)[None, :, None]"),),
    expect=(Expectation(HALF, "float32", fail=("out", "dx"), hint="never-written",
                        where={"out": {"head": "last", "seq": "all"}, "dx": {"head": "last"}}),),
))

# cos and sin kept in 16 bits: a relative error of 2^-11 in every rotation, far above a float32 kernel's floor
register_mutant(Mutant(
    id="rope-cos-fp16", operator="rope", backend="triton", seed="issue 47: rope cos/sin precision",
    description="cos of the angles rounded to fp16 before the rotation",
    edits=(("kernels.py", "c = tl.cos(ang)[:, None, :]", "c = tl.cos(ang).to(tl.float16).to(tl.float32)[:, None, :]"),),
    expect=(Expectation(HALF, "float32", fail=("out", "dx"), where={"out": {"head": "all", "batch": "all"}}),),
))
