"""A backend that hangs is given up on instead of costing the sweep a timeout per cell (issue #41).

Each cell that hangs costs the whole timeout and a worker's restart: a hanging backend cost the 16-cell
smoke 140 s at ``--timeout 10``. The rule, in one place: a backend (an operator/backend pair) whose cells
time out ``max_hangs`` times in a row (default 2; ``harness run --max-hangs N``, 0: never give up) has its
remaining cells in that run reported as TIMEOUT, with the error "not run: the backend hung twice",
without running them. They are TIMEOUT, never SKIP: they fail the run (exit 1) and show as TIMEOUT in the
tables. "In a row" is in the order the results arrive: any other result of the backend (PASS, FAIL,
ERROR, CRASH, ...) ends the row; SKIP cells, which did not run, do not. Once given up on, a backend stays
given up on for the run.

Every executor that feeds a run's many cells asks the same :class:`HangGuard`: the local pool's workers
(pool.py), the single worker (single.py: the pytest plugin's items), and the Ray executor's driver.
"""

from __future__ import annotations

from typing import Protocol

from ..model.records import CellRecord, Status


class Planned(Protocol):
    """What the guard reads of a planned cell (plan.Task), without importing the plan: it needs no more."""

    operator: str
    backend: str
    skip: str | None

    def failed(self, status: str, message: str) -> CellRecord: ...

DEFAULT_MAX_HANGS = 2
NOT_RUN = "not run: the backend hung"


def not_run_message(max_hangs: int) -> str:
    """The error of a cell not run because its backend hung ``max_hangs`` times in a row."""
    times = {1: "once", 2: "twice"}.get(max_hangs, f"{max_hangs} times in a row")
    return f"{NOT_RUN} {times}"


class HangGuard:
    """Counts each backend's TIMEOUT cells in a row (:meth:`seen`) and stands in for the cells of a backend
    given up on (:meth:`stand_in`)."""

    def __init__(self, max_hangs: int = DEFAULT_MAX_HANGS) -> None:
        if max_hangs < 0:
            raise ValueError(f"max_hangs {max_hangs}: expected 0 (never give up) or more")
        self.max_hangs = max_hangs
        self.message = not_run_message(max_hangs)
        self._in_a_row: dict[tuple[str, str], int] = {}
        self.given_up: set[tuple[str, str]] = set()

    def seen(self, cell: CellRecord) -> None:
        """A finished cell: a TIMEOUT adds to its backend's hangs in a row, any other result that ran ends
        the row. SKIP cells and this guard's own stand-ins did not run and count for nothing."""
        if cell.status == Status.SKIP or self.is_stand_in(cell):
            return
        key = (cell.operator, cell.backend)
        hung = cell.status == Status.TIMEOUT
        self._in_a_row[key] = self._in_a_row.get(key, 0) + 1 if hung else 0
        if hung and self.max_hangs and self._in_a_row[key] >= self.max_hangs:
            self.given_up.add(key)

    def stand_in(self, task: Planned) -> CellRecord | None:
        """The TIMEOUT cell reported for ``task`` without running it, when its backend has been given up on;
        None: run it (a planned SKIP is never stood in for)."""
        if task.skip or (task.operator, task.backend) not in self.given_up:
            return None
        return task.failed("TIMEOUT", self.message)

    @staticmethod
    def is_stand_in(cell: CellRecord) -> bool:
        return cell.status == Status.TIMEOUT and cell.error.startswith(NOT_RUN)
