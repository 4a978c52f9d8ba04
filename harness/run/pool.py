"""`harness run`'s executor: a pool of worker processes on this machine (:class:`LocalPool`).

Cells of one (operator, case, dtype) group go to one worker in a row, so the oracle is computed once per
group. Each cell has a timeout; a worker that hangs is killed (TIMEOUT), one that dies is replaced (CRASH),
and the sweep goes on; a backend that hangs twice in a row is given up on (hangs.py). Each worker runs in a
process group of its own, killed as one (with what its kernel started), and the run's watchdog kills them
all should the run's process die (watchdog.py). Workers sharing a GPU start together only groups that fit
in its memory, and a cell that runs out of memory there is run again (memory.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from ..measure.failures import is_oom
from ..model.records import CellRecord, Status
from .executor import Executor, OnCell, report_skipped
from .hangs import DEFAULT_MAX_HANGS, HangGuard
from .memory import MemoryPacker, gpu_budget_mb, requeue_oom
from .plan import Task, order_groups
from .processes import WorkerProcess, exit_status
from .watchdog import Watchdog


@dataclass
class LocalPool(Executor):
    """Worker processes on this machine, one or more per GPU: a crash or hang costs one cell. ``durations``:
    seconds per cell (report.recorded) from earlier runs, to start the longest groups first. ``peaks``: MB
    of GPU memory per cell from earlier runs, so that workers sharing a GPU start together only groups that
    fit in it. ``stats`` gets where the wall time went: ``ready_s`` (the last worker ready), ``cells_s``
    (the last cell of the shared phase done), ``alone_cells`` and ``alone_s`` (cells rerun alone)."""

    plugins: list[str]
    workers: int | None = None
    timeout: float = 300.0
    durations: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    # --max-hangs: a backend's TIMEOUTs in a row before it is given up on (0: never); or the guard of a run
    # this one continues, so that a backend given up on there stays given up on
    max_hangs: int | HangGuard = DEFAULT_MAX_HANGS
    startup_timeout: float = 600.0

    def run(self, tasks: list[Task], on_cell: OnCell) -> None:
        t_run = time.time()
        todo = report_skipped(tasks, on_cell)
        if not todo:
            return
        hangs = self.max_hangs if isinstance(self.max_hangs, HangGuard) else HangGuard(self.max_hangs)
        self._sweep(todo, on_cell, self.workers, hangs, self.stats, t_run)

    def close(self) -> None:
        """Nothing outlives run(): it stops its workers before it returns, or on Ctrl-C."""

    def _sweep(self, todo: list[Task], on_cell: OnCell, workers: int | None, hangs: HangGuard,
               stats: dict[str, float], t_run: float) -> None:
        """The cells on shared workers, then those that need a GPU of their own, one worker per GPU."""
        shared = _PoolRun(self, todo, on_cell, workers, hangs, stats, t_run)
        shared.run()
        stats["cells_s"] = time.time() - t_run
        if shared.alone:
            print(f"{len(shared.alone)} cell(s) to run alone, one worker per GPU", flush=True)
            t_alone = time.time()
            self._sweep(shared.alone, on_cell, len(set(shared.gpus)), hangs, {}, t_alone)
            stats["alone_cells"], stats["alone_s"] = len(shared.alone), time.time() - t_alone


def worker_slots(device: str, workers: int | None) -> tuple[list[int | None], int]:
    """The GPU of each worker (None on CPU) and the torch threads each may use. More workers than GPUs share
    them round-robin: compilation and oracles, which leave a GPU idle, overlap."""
    if device.split(":")[0] == "cuda":
        if ":" in device:
            return [int(device.split(":")[1])], 4
        import torch

        ids = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = [int(x) for x in ids.split(",")] if ids else list(range(torch.cuda.device_count()))
        return [visible[i % len(visible)] for i in range(workers or len(visible))], 4
    nw = workers or min(2, os.cpu_count() or 1)
    return [None] * nw, max(1, (os.cpu_count() or 1) // nw)


class _PoolRun:
    """One phase of a pool's run: its workers, the queue of groups, what each worker holds, until every
    cell of the phase is handed over. ``alone`` collects the cells to run again without neighbours."""

    def __init__(self, pool: LocalPool, todo: list[Task], on_cell: OnCell, workers: int | None,
                 hangs: HangGuard, stats: dict[str, float], t_run: float):
        self.cfg, self.on_cell, self.hangs, self.stats, self.t_run = pool, on_cell, hangs, stats, t_run
        self.device = todo[0].device
        self.gpus, self.threads = worker_slots(self.device, workers)
        self.queue = order_groups(todo, pool.durations or {})
        self.shared = len(self.gpus) > len(set(self.gpus)) and self.gpus[0] is not None
        self.packer = MemoryPacker(pool.peaks or {}, gpu_budget_mb(self.gpus) if self.shared else None)
        # kills every worker's group should this process die by any means (SIGKILL included), and at the end
        # of the run whatever is left of them (a worker whose start Ctrl-C interrupted)
        self.watchdog = Watchdog()
        self.workers: list[WorkerProcess] = []
        self.born: dict[int, float] = {}  # when each slot's current worker was started
        self.alone: list[Task] = self.packer.split_oversized(self.queue)
        if self.alone:
            print(f"{len(self.alone)} cell(s) needed more GPU memory in earlier runs than workers sharing a GPU "
                  f"leave ({self.packer.budget:.0f} MB): they run at the end, one worker per GPU", flush=True)

    def run(self) -> None:
        try:
            for i, g in enumerate(self.gpus):
                self.workers.append(self._start(i, g))
            try:
                self._drive()
            except BaseException:  # Ctrl-C, SIGTERM (cli.py), or the report cannot be written (a full disk): the
                for w in self.workers:  # cells in flight are lost, the finished ones were already handed over
                    w.kill()
                raise
            for w in self.workers:  # tell all to stop first, then wait, so that their exits overlap
                if w.ready:
                    w.ask_to_stop()
            for w in self.workers:
                w.stop()
        finally:
            self.watchdog.close()

    def _start(self, slot: int, gpu: int | None) -> WorkerProcess:
        w = WorkerProcess(slot, self.device, gpu, self.cfg.plugins, self.threads, self.shared, self.watchdog)
        self.born[slot] = time.time()
        return w

    def _drive(self) -> None:
        """Until the queue and every worker's group are empty: feed idle workers, then wait up to a second
        for a message, a timeout or a worker that does not start."""
        while True:
            self._stand_in_for_given_up()
            if not (any(w.task or w.group for w in self.workers) or self.queue):
                return
            for w in self.workers:
                if w.ready and w.task is None:
                    self._feed(w)
            if not [w for w in self.workers if not w.ended() or w.task]:
                return
            ready = wait([w.conn for w in self.workers], timeout=1.0)
            now = time.time()
            for w in list(self.workers):  # a copy: a worker replaced below is not looked at again this round
                if w.conn in ready:
                    self._receive(w)
                elif w.task is not None and now - w.started > self.cfg.timeout:
                    self._finish(w, w.task.failed("TIMEOUT", f"no result after {self.cfg.timeout:.0f} s; worker "
                                                             "killed and restarted"))
                    self._replace(w)
                elif not w.ready and now - self.born[w.slot] > self.cfg.startup_timeout:
                    raise RuntimeError(f"worker {w.slot} did not start within {self.cfg.startup_timeout:.0f} s")

    def _receive(self, w: WorkerProcess) -> None:
        """A worker's message: it is ready, a cell's record, or its pipe closed (it died)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            msg = None
        if msg is None:
            self._died(w)
        elif "ready" in msg:
            w.ready = True
            self.stats["ready_s"] = max(self.stats.get("ready_s", 0.0), time.time() - self.t_run)
        else:
            cell = CellRecord.from_json(msg)
            self._finish(w, cell)
            if cell.status == Status.CRASH:  # the worker's CUDA context is lost: a fresh process for the next
                self._replace(w)

    def _died(self, w: WorkerProcess) -> None:
        """The cell it ran is a CRASH; a worker that cannot even start fails its group instead of being
        restarted for it forever."""
        t = w.task
        how = exit_status(w.proc)
        w.kill()
        if t is not None:
            self._finish(w, t.failed("CRASH", f"worker process died ({how}) while running this cell"))
        elif not w.ready:
            for t2 in w.group:
                self._finish(w, t2.failed("ERROR", f"worker failed to start ({how})"))
            w.group = []
            self.packer.release(w.gpu, w.need)
            w.need = 0.0
        self._replace(w)

    def _finish(self, w: WorkerProcess, cell: CellRecord) -> None:
        """A cell the worker is done with: handed over, or, out of memory beside other workers, requeued."""
        if self.shared and w.task is not None and is_oom(cell):
            t = w.task
            self.packer.learn_oom(t, cell)
            print(f"out of memory on shared gpu{w.gpu}: {t.operator}/{t.backend}/{t.dtype}/{t.case.name} "
                  f"({'again: rerun alone at the end' if t.oom_tries else 'requeued'})", flush=True)
            requeue_oom(t, self.queue, self.alone)
        else:
            cell.worker = w.slot if w.gpu is None else f"gpu{w.gpu}"
            w.cells += 1
            self.hangs.seen(cell)
            self.on_cell(cell)
        w.task = None
        if not w.group:  # its group is done: its memory is free for the next one on this GPU
            self.packer.release(w.gpu, w.need)
            w.need = 0.0

    def _stand_in_for_given_up(self) -> None:
        """The queued cells of backends given up on (hangs.py), reported at once without running: from the
        queue and from the workers' groups, without waiting for a worker (one restarting after a timeout
        takes seconds) to reach them."""
        if not self.hangs.given_up:
            return
        for g in self.queue:
            g[:] = [t for t in g if not self._stood_in(t)]
        self.queue[:] = [g for g in self.queue if g]
        for w in self.workers:
            w.group[:] = [t for t in w.group if not self._stood_in(t)]
            if not w.group and w.task is None and w.need:
                self.packer.release(w.gpu, w.need)
                w.need = 0.0

    def _stood_in(self, t: Task) -> bool:
        cell = self.hangs.stand_in(t)
        if cell is not None:
            self.on_cell(cell)
        return cell is not None

    def _feed(self, w: WorkerProcess) -> None:
        """The worker's next cell: of its group, or of the first queued group that fits its GPU's free memory
        (none fits now: it waits for a group to finish)."""
        if not w.group:
            taken = self.packer.take(self.queue, w.gpu)
            if taken is None:
                return
            w.group, w.need = taken
        w.send(w.group.pop(0))

    def _replace(self, w: WorkerProcess) -> None:
        """A fresh worker in the slot of one killed, dead or hung, taking over its group."""
        w.kill()
        nw = self._start(w.slot, w.gpu)
        nw.group, nw.cells, nw.need = w.group, w.cells, w.need
        self.workers[self.workers.index(w)] = nw
