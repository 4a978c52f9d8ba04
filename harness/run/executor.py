"""The one way cells are run: an :class:`Executor` takes planned tasks and hands back each finished cell.

Every door runs cells through one: `harness run` (:class:`~harness.run.pool.LocalPool`, or the Ray executor
with ``--executor ray``), the pytest plugin, `harness check`, `harness repro` and the shrinking of a
hypothesis failure (:class:`~harness.run.single.SingleWorker`), and the bug zoo's score (LocalPool). So a
cell's timeout, crash, SKIP and hang rules are the same whichever door it came through. What differs is
where the worker processes are: a pool on this machine, one worker in a row, or Ray tasks on a cluster.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from ..model.records import CellRecord
from .plan import Task

OnCell = Callable[[CellRecord], None]


class Executor(ABC):
    """Runs tasks and hands each finished cell to ``on_cell`` (SKIP cells included), in any order; the
    workers it started are stopped by :meth:`close`. Usable as a context manager, which closes it."""

    @abstractmethod
    def run(self, tasks: list[Task], on_cell: OnCell) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Stop whatever the executor started (workers); safe to call twice."""

    def run_one(self, task: Task) -> CellRecord:
        """One task's cell (the doors that look at one cell at a time: check, repro, shrinking)."""
        got: list[CellRecord] = []
        self.run([task], got.append)
        return got[-1]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def report_skipped(tasks: list[Task], on_cell: OnCell) -> list[Task]:
    """The planned SKIP cells handed over at once (no worker is needed for them); the tasks left to run."""
    for t in tasks:
        if t.skip:
            on_cell(t.failed("SKIP", t.skip))
    return [t for t in tasks if not t.skip]
