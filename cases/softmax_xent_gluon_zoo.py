"""Bug-zoo mutants of the Gluon softmax_xent backend (issue 45): the failure modes its machinery adds.

Edits apply to backends/gluon/softmax_xent/ (a temporary copy). They run on a GPU (sm_90) only.
"""

from __future__ import annotations

from harness.cases.softmax_xent import C

from harness import Expectation, Mutant, register_mutant

SEED = "project: Gluon TMA ring (issue 45)"
# 64 rows of 32000 bf16 logits: 4 ring slots per row (the last partial), rows 16-byte aligned (TMA); 20% of
# targets ignored
_RING = C("zoo-N64-V32000", 64, 32000, ignored=0.2)
# the same rows padded by 8 columns: a row stride of 32008 elements, still 16-byte aligned, so TMA reads them
_PADDED = C("zoo-N64-V32000-pad8", 64, 32000, ("non-contiguous",), ignored=0.2, layout="pad:8")
# one partial slot per row (V = 5000 of 8192 columns), aligned rows; and rows of whole slots (4 x 8192)
_TAIL = C("zoo-N16-V5000", 16, 5000, ignored=0.2)
_WHOLE = C("zoo-N64-V32768", 64, 32768, ignored=0.2)
# about eight rows per program (1000 rows, 132 programs on an H100 or H200) of three slots per pass: a slot
# refilled early receives another row's chunk. In zoo-N64-V32000 each program has one row whose 8 stream
# items are its 4 chunks twice, so a refill four items early brings back the very chunk it replaces.
_ROWS = C("zoo-N1000-V20000", 1000, 20000, ignored=0.2)

# A barrier's phase off by one: each wait asks for the phase before the one the copy completes, which has
# already completed, so it returns at once and the slot is read before (or while) its chunk lands. The
# producer and consumers then fall out of step: wrong values, or a wait that never returns.
register_mutant(Mutant(
    id="gluon-xent-barrier-phase", operator="softmax_xent", backend="gluon", seed=SEED,
    edits=(("kernels.py", "mbarrier.wait(ready.index(slot), (item // STAGES) & 1)",
            "mbarrier.wait(ready.index(slot), ((item // STAGES) & 1) ^ 1)"),),
    expect=(Expectation(_RING, "bfloat16", status="FAIL|TIMEOUT"),),
    description="mbarrier wait on the wrong phase parity: ring slots read before their TMA copy lands"))

# A ring slot reused before it is read: the producer warp does not wait for the consumers to release a slot,
# so it refills slots with chunks further down the stream while earlier ones are unread, and the ready
# barriers' phases run ahead of the consumers. On zoo-N64-V32000 this passed on an H200 (033b8d5): there a
# refill brings back the same chunk (_ROWS above); docs/kernels/gluon-softmax_xent.md. On _ROWS (e3af7ec, an
# H200) the launch died ("unspecified launch failure"; which access faulted was not traced). A wrong answer,
# a hang and a device fault each keep the cell from passing, so each catches it.
register_mutant(Mutant(
    id="gluon-xent-slot-reused-early", operator="softmax_xent", backend="gluon", seed=SEED,
    edits=(("kernels.py", "mbarrier.wait(empty.index(slot), ((item // STAGES) & 1) ^ 1)",
            "slot = item % STAGES  # mutant: the wait for the consumers' release removed"),),
    expect=(Expectation(_ROWS, "bfloat16", status="FAIL|TIMEOUT|CRASH"),),
    description="the producer warp refills ring slots without waiting for the consumers to release them"))

# The descriptor built from the shape instead of the strides: right for contiguous rows, wrong for padded
# ones (row r is read from r * V instead of r * (V + 8)).
register_mutant(Mutant(
    id="gluon-xent-descriptor-stride", operator="softmax_xent", backend="gluon", seed=SEED,
    edits=(("wrapper.py", "list(t.shape), list(t.stride()), [1, block_v]",
            "list(t.shape), [t.shape[1], 1], [1, block_v]"),),
    expect=(Expectation(_PADDED, "bfloat16", fail=("loss", "dlogits")),
            Expectation(_RING, "bfloat16", passing=("loss", "dlogits"))),
    description="TMA descriptor with the row stride taken from the shape: padded rows read from the wrong place"))

# The last slot of a row taken unmasked: TMA fills the columns past V with zeros, and the statistics count
# them as logits equal to 0 (the seed's "only the blocks before the last are right", inverted).
register_mutant(Mutant(
    id="gluon-xent-tail-zeros-counted", operator="softmax_xent", backend="gluon", seed=SEED,
    edits=(("kernels.py", "m_l, r_l, z_l = _lane_stats(x, m_l, r_l, z_l, cols < V, True, SMOOTH, PRECISE)",
            "m_l, r_l, z_l = _lane_stats(gl.where(cols < V, x, 0.0), m_l, r_l, z_l, offs < V, False, SMOOTH, "
            "PRECISE)"),),
    expect=(Expectation(_TAIL, "bfloat16", fail=("loss", "dlogits")),
            Expectation(_WHOLE, "bfloat16", passing=("loss", "dlogits"))),
    description="the zero fill past V counted as logits in the row statistics when V is not a multiple of the slot"))
