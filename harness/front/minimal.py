"""The minimal failing case of each failing (operator, backend, dtype) of a `harness run` (issue #44).

After the cells, before the report is drawn: for each failing triple, its smallest failing case is searched
below the case that failed (harness/model/strategies.py, shrink_case: the layout twin dropped, layouts made
contiguous, sizes bisected), one cell at a time on a worker of this machine, bounded by ``--shrink-seconds``
(default 60, ``HARNESS_SHRINK_SECONDS``; 0 turns it off). What it finds is saved as a repro bundle, printed,
and kept beside the report as ``<op>.minimal.json``, which the report shows before its failures.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..judge.judgement import CellJudgement, judge_cell, judge_cells
from ..model import registry
from ..model.records import CellRecord
from ..model.spec import Case
from ..model.strategies import shrink_case
from ..run.hangs import HangGuard
from ..run.plan import plan
from ..run.session import RunSession
from ..run.single import SingleWorker
from ..store.reports import atomic_write, minimal_path

DEFAULT_SECONDS = 60.0
SHRUNK = ("FAIL", "SHAPE")  # what is shrunk: a crash or a hang is not re-run dozens of times


def default_seconds() -> float:
    """--shrink-seconds' default: HARNESS_SHRINK_SECONDS where set (a test suite sets 0), else 60."""
    raw = os.environ.get("HARNESS_SHRINK_SECONDS", "")
    try:
        return float(raw) if raw else DEFAULT_SECONDS
    except ValueError:
        return DEFAULT_SECONDS


@dataclass
class Minimal:
    """The smallest failing case found below a failing cell, and its bundle."""

    original: CellRecord
    cell: CellRecord
    bundle: Path
    device_class: str  # the run's: a gap scoped to a device class reads here as in the report

    def judged(self) -> CellJudgement:
        return judge_cell(self.cell, device_class=self.device_class)

    def to_json(self, run_id: str) -> dict:
        j = self.judged()
        return {"run_id": run_id, "backend": self.cell.backend, "dtype": self.cell.dtype,
                "case": self.cell.case.to_json(), "from": self.original.case.name, "status": j.shown,
                "failing": [f"{c.name}: {c.reason}" for c in j.failed_components],
                "repro": f"harness repro {self.bundle}"}

    def line(self) -> str:
        c = self.cell
        failing = ", ".join(x.name for x in self.judged().failed_components)
        return (f"minimal failing case: {c.operator}/{c.backend}/{c.dtype}: {c.case.name} "
                f"{json.dumps(c.case.params, sort_keys=True)} (from {self.original.case.name}; {failing}); "
                f"harness repro {self.bundle}")


def shrink_failures(session: RunSession, seconds: float) -> list[Minimal]:
    """The minimal failing case of each failing triple of the run, within ``seconds`` each; written beside
    the report (an operator of this run without any gets its file removed) and printed."""
    if seconds <= 0 or session.req.elsewhere is not None or session.writer is None:
        return []  # off, or the cells ran on a cluster whose device this machine may not have
    found: list[Minimal] = []
    firsts = _first_failures(judge_cells(session.results, session.device_class))
    if firsts:
        worker = SingleWorker(session.device, registry.plugins_loaded(), timeout=max(30.0, seconds), max_hangs=0)
        try:
            for j in firsts:
                m = _shrunk(j, worker, session, seconds)
                if m is not None:
                    print(m.line())
                    found.append(m)
        finally:
            worker.close()
    _write(session, found)
    return found


def _first_failures(judged: list[CellJudgement]) -> list[CellJudgement]:
    """Per failing (operator, backend, dtype), its failing cell of the smallest case."""
    best: dict[tuple[str, str, str], CellJudgement] = {}
    for j in judged:
        c = j.record
        if j.shown not in SHRUNK or HangGuard.is_stand_in(c):
            continue
        key = (c.operator, c.backend, c.dtype)
        if key not in best or _size(c.case) < _size(best[key].record.case):
            best[key] = j
    return list(best.values())


def _size(case: Case) -> int:
    return math.prod(v for v in case.params.values() if isinstance(v, int) and not isinstance(v, bool))


def _shrunk(j: CellJudgement, worker: SingleWorker, session: RunSession, seconds: float) -> Minimal | None:
    """The smallest case below j's that fails the same way (same status, its first failing component
    failing again), as a cell with its bundle; None where none smaller fails."""
    cell = j.record
    first = j.failed_components[0].name if j.failed_components else None
    last: dict[str, CellRecord] = {}

    def fails(case: Case) -> bool:
        try:
            tasks = plan([cell.operator], "smoke", [cell.backend], [cell.dtype], session.device, seed=cell.seed,
                         repeats=1, cases={cell.operator: [case]}).tasks
        except (ValueError, KeyError):
            return False  # a case the plan refuses
        if not tasks:
            return False
        got = worker.run_one(tasks[0])
        g = judge_cell(got, device_class=session.device_class)
        if g.shown != j.shown or (first is not None and first not in {c.name for c in g.failed_components}):
            return False
        last[case.name] = got
        return True

    t0 = time.monotonic()
    case = shrink_case(cell.case, fails, seconds)
    if case is None or case.name not in last:
        print(f"minimal failing case: {cell.operator}/{cell.backend}/{cell.dtype}: {cell.case.name} itself (no "
              f"smaller case fails the same way; {time.monotonic() - t0:.0f} s)")
        return None
    small = last[case.name]
    return Minimal(cell, small, session.save_repro(small), session.device_class)


def _write(session: RunSession, found: list[Minimal]) -> None:
    assert session.writer is not None
    run_id = session.header.get("run_id", "")
    for op in {t.operator for t in session.plan.tasks}:
        path = minimal_path(session.writer.dir, op)
        mine = [m.to_json(run_id) for m in found if m.cell.operator == op]
        if mine:
            atomic_write(path, json.dumps(mine, indent=1, default=str) + "\n")
        elif path.exists():
            path.unlink()  # an earlier run's: this run found none
