"""One persistent worker process running cells one at a time: :class:`SingleWorker`, the executor of the
doors that take one cell at a time (a pytest item per cell, `harness check`, `harness repro`, the shrinking
of a hypothesis failure) and, inside each Ray task, of a group's cells (ray_executor.py).

The worker is started on the first cell that runs (a SKIP needs none), and again after a cell that timed
out or crashed it, so that one cell's fault costs that cell only.
"""

from __future__ import annotations

import os

from ..model.records import CellRecord, Status
from .executor import Executor, OnCell
from .hangs import DEFAULT_MAX_HANGS, HangGuard
from .plan import Task
from .processes import WorkerProcess, exit_status
from .watchdog import Watchdog

STARTUP_S = 600.0  # a worker imports torch and triton, and loads every backend and plugin


class CellWorker:
    """The worker process behind a :class:`SingleWorker`, watched by a watchdog of its own (watchdog.py): the
    worker dies with the process that uses this. ``max_hangs``: where it runs a run's many cells (the pytest
    plugin), a backend that timed out on that many cells in a row has its later cells reported as TIMEOUT
    without running them (hangs.py); 0: every cell is run."""

    def __init__(self, device: str, plugins: list[str], timeout: float = 300.0, gpu: int | None = None,
                 max_hangs: int = 0):
        self.device, self.plugins, self.timeout, self.gpu = device, plugins, timeout, gpu
        self.threads = 0 if device.startswith("cuda") else max(1, os.cpu_count() or 1)
        self.shared = False  # on a GPU shared with other workers (HARNESS_GPU_SHARED)
        self.deathsig: bool | None = None  # WorkerProcess's: None, where the thread starting it is the main thread
        self.hangs = HangGuard(max_hangs)
        self.watchdog = Watchdog()
        self.w: WorkerProcess | None = None

    def _start(self) -> WorkerProcess:
        w = WorkerProcess(0, self.device, self.gpu, self.plugins, self.threads, self.shared, self.watchdog,
                          self.deathsig)
        if not w.conn.poll(STARTUP_S):
            w.kill()
            raise RuntimeError(f"harness worker did not start within {STARTUP_S:.0f} s")
        try:
            msg = w.conn.recv()
        except (EOFError, OSError) as e:
            how = exit_status(w.proc)
            w.kill()
            raise RuntimeError(f"harness worker failed to start ({how})") from e
        w.ready = bool(msg.get("ready"))
        return w

    def run(self, t: Task) -> CellRecord:
        """The task's cell: its planned SKIP, the hang guard's stand-in, or what the worker made of it."""
        if t.skip:
            return t.failed("SKIP", t.skip)
        cell = self.hangs.stand_in(t)
        if cell is None:
            cell = self._run(t)
            self.hangs.seen(cell)
        return cell

    def _run(self, t: Task) -> CellRecord:
        if self.w is not None and self.w.ended():  # died between cells (killed from outside)
            self.w.kill()
            self.w = None
        if self.w is None:
            self.w = self._start()
        w = self.w
        w.send(t)
        if not w.conn.poll(self.timeout):
            self._drop()
            return t.failed("TIMEOUT", f"no result after {self.timeout:.0f} s; worker killed")
        try:
            cell = CellRecord.from_json(w.conn.recv())
        except (EOFError, OSError):
            how = exit_status(w.proc)
            self._drop()
            return t.failed("CRASH", f"worker process died ({how}) while running this cell")
        if cell.status == Status.CRASH:  # its CUDA context is lost: the next cell gets a fresh worker
            self._drop()
        return cell

    def _drop(self) -> None:
        """The worker killed with its process group; the next cell starts another."""
        if self.w is not None:
            self.w.kill()
            self.w = None

    def close(self) -> None:
        """The worker asked to stop, then killed with its process group (what its kernel started), and the
        watchdog ended; safe to call twice, and cells can run again after it."""
        if self.w is not None:
            self.w.ask_to_stop()
            self.w.stop()
            self.w = None
        self.watchdog.close()


class SingleWorker(Executor):
    """One persistent worker process running one cell at a time, in the order given. ``max_hangs``: a
    backend's TIMEOUTs in a row before its later cells are stood in for (hangs.py; 0: every cell runs, as
    check and repro want: each of their cells is asked for on its own)."""

    def __init__(self, device: str, plugins: list[str], timeout: float = 300.0, gpu: int | None = None,
                 max_hangs: int = DEFAULT_MAX_HANGS):
        self.cells = CellWorker(device, plugins, timeout, gpu=gpu, max_hangs=max_hangs)

    def run(self, tasks: list[Task], on_cell: OnCell) -> None:
        for t in tasks:
            on_cell(self.cells.run(t))

    def run_one(self, task: Task) -> CellRecord:
        return self.cells.run(task)

    def close(self) -> None:
        self.cells.close()
