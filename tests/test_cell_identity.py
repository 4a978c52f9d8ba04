"""One cell identity (harness/model/records.py CellId): the plan, the records, --resume, --compare and repro
bundles key on it, and the committed reports are matched as they were before it (issue #42)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from harness.across.compare import compare, load_reference
from harness.front.run_command import resume
from harness.model.records import CellId, CellRecord
from harness.model.spec import Case
from harness.run.plan import plan
from harness.store.reports import load

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "reports" / "cpu"
# What the code before the one identity (70a97ad, the reports as committed at 45de1a3) made of the committed CPU
# reports: the tasks its sweep plans, how many --resume at the report's commit counted as done, and how many
# of the report's cells --compare against the report itself matched. Measured with that commit's own code. The
# two cross-entropy reports were run again at f00e877 (careful floors, issue #44), and mhc_pre's at 382845b (golden
# computes from a contiguous x since 43ee75a; its sweep now has the issue #44 twins), then every CPU report at b9cacc3
# (the floor's first order draw takes GEMMs one K step at a time: every oracle digest changed; lazy_attention's
# sweep now has its twins, softmax_xent's the Gluon backends): one run each, every planned cell resumed, every cell
# that ran matched (the CUDA, Gluon and TileLang cells are skips on a CPU).
BEFORE = {
    "fused_linear_xent": {"tasks": 222, "resumed": 222, "matched": 222},
    "lazy_attention": {"tasks": 112, "resumed": 112, "matched": 112},
    "mhc_pre": {"tasks": 240, "resumed": 240, "matched": 120},
    "softmax_xent": {"tasks": 600, "resumed": 600, "matched": 120},
}


@pytest.mark.parametrize("op", sorted(BEFORE))
def test_resume_and_compare_match_the_committed_reports_as_before(op: str):
    cells, runs = load(CPU, op)
    header = list(runs.values())[-1]
    tasks = plan([op], header["sizes"], None, None, "cpu", seed=header.get("seed") or 0).tasks
    # cases added to the preset after the report's run (the offset, unaligned and expand twins of issue #44 after
    # the mhc_pre and lazy_attention reports): the figures are of the cells planned then
    then = set(header["planned"][op] if isinstance(header["planned"], dict) else header["planned"])
    tasks = [t for t in tasks if t.id.planned in then]
    with contextlib.redirect_stdout(io.StringIO()):
        left, _ = resume(tasks, CPU, header["commit"])
    comparison = compare(cells, header, load_reference(str(CPU.parent), "cpu", [op]))
    got = {"tasks": len(tasks), "resumed": len(tasks) - len(left), "matched": len(comparison.matched)}
    assert got == BEFORE[op]
    assert not comparison.not_comparable


def test_a_task_and_the_record_it_produces_have_one_identity():
    case = Case("N3-V5", {"N": 3, "V": 5, "z_loss": 1e-4}, microbatches=2)
    (task,) = [t for t in plan(["softmax_xent"], "smoke", ["torch"], ["float32"], "cpu", seed=7,
                               cases={"softmax_xent": [case]}).tasks]
    rec = task.failed("ERROR", "x")
    assert task.id == rec.id == CellId.of("softmax_xent", "torch", "float32", case, 7)
    assert CellRecord.from_json(rec.to_json()).id == rec.id  # read back from a report
    assert rec.id.planned == "torch|float32|N3-V5"  # as a run's header lists it


def test_the_identity_tells_cells_apart_by_every_field():
    case = Case("c", {"N": 3})
    base = CellId.of("op", "b", "float32", case, 0)
    others = [CellId.of("op2", "b", "float32", case, 0), CellId.of("op", "b2", "float32", case, 0),
              CellId.of("op", "b", "float16", case, 0), CellId.of("op", "b", "float32", Case("c2", {"N": 3}), 0),
              CellId.of("op", "b", "float32", Case("c", {"N": 4}), 0),
              CellId.of("op", "b", "float32", Case("c", {"N": 3}, microbatches=2), 0),
              CellId.of("op", "b", "float32", case, 1)]
    assert len({base, *others}) == 1 + len(others)
    assert base.under("golden") == CellId.of("op", "golden", "float32", case, 0)
