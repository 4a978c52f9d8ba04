"""One executor interface (harness/run/executor.py): every way the harness runs cells is an Executor, with
run(tasks, on_cell) and close(); a SKIP cell needs no worker; the pool and the single worker judge a cell alike."""

from __future__ import annotations

from harness.judge.judgement import judge_cell
from harness.model import registry
from harness.model.records import CellRecord
from harness.run.executor import Executor, report_skipped
from harness.run.plan import Task, plan
from harness.run.pool import LocalPool
from harness.run.ray_executor import RayExecutor
from harness.run.single import SingleWorker


def test_every_executor_is_one():
    for cls in (LocalPool, SingleWorker, RayExecutor):
        assert issubclass(cls, Executor), cls


class _Echo(Executor):
    """Each task's cell at once, as a PASS without figures."""

    def __init__(self) -> None:
        self.closed = 0

    def run(self, tasks: list[Task], on_cell) -> None:
        for t in report_skipped(tasks, on_cell):
            on_cell(t.failed("PASS", ""))

    def close(self) -> None:
        self.closed += 1


def _tasks(backends: list[str], dtypes: list[str] | None = None) -> list[Task]:
    registry.discover()
    return plan(["mhc_pre"], "smoke", backends, dtypes or ["float32"], "cpu", repeats=1).tasks


def test_run_one_and_the_context_manager():
    t = _tasks(["golden"])[0]
    with _Echo() as ex:
        cell = ex.run_one(t)
        assert (cell.backend, cell.status.value) == ("golden", "PASS")
    assert ex.closed == 1


def test_skipped_cells_are_handed_over_without_a_worker():
    tasks = _tasks(["cuda", "golden"])
    assert {t.skip_kind for t in tasks} == {"unavailable", ""}
    seen: list[CellRecord] = []
    left = report_skipped(tasks, seen.append)
    assert [t.backend for t in left] == ["golden"] * len(left)
    assert all(c.status.value == "SKIP" and c.skip_kind == "unavailable" for c in seen)
    skips = [t for t in tasks if t.skip]
    for ex in (LocalPool([]), SingleWorker("cpu", [])):
        got: list[CellRecord] = []
        with ex:
            ex.run(skips, got.append)
        assert [(c.backend, c.status.value, c.error) for c in got] == [(t.backend, "SKIP", t.skip) for t in skips]
    assert ex.cells.w is None  # the single worker never started one


def test_the_pool_and_the_single_worker_judge_a_cell_alike():
    registry.discover()
    case = next(c for c in registry.get_operator("mhc_pre").cases("smoke", "cpu") if c.name == "tiny-n2")
    t = plan(["mhc_pre"], "smoke", ["golden"], ["float32"], "cpu", repeats=1, cases={"mhc_pre": [case]}).tasks[0]
    pooled: list[CellRecord] = []
    with LocalPool([], workers=1, timeout=120) as pool:
        pool.run([t], pooled.append)
    with SingleWorker("cpu", [], timeout=120) as one:
        single = one.run_one(t)
    [cell] = pooled
    assert (judge_cell(cell).shown, judge_cell(single).shown) == ("PASS", "PASS")
    assert [c.name for c in cell.components] == [c.name for c in single.components]
    assert [c.max_err for c in cell.components] == [c.max_err for c in single.components]  # same seed, same cell
