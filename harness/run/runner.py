"""The runner: plans cells (operator x case x dtype x backend) and runs them in worker processes.

Cells of one (operator, case, dtype) group go to one worker in a row, so the oracle is computed once
per group. Each cell has a timeout; a worker that hangs is killed (TIMEOUT), one that dies is
replaced (CRASH), and the sweep goes on; a backend that hangs twice in a row is given up on (hangs.py).
Every finished cell is appended to the report's JSONL at once, so a killed sweep keeps what it did.
Each worker runs in a process group of its own, killed as one (with what its kernel started), and the
run's watchdog kills them all should the run's process die (watchdog.py).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from ..judge.judgement import judge_cell
from ..measure.cell import error_cell, is_oom
from ..model import registry
from ..model.mutant_builds import resolve as resolve_backend
from ..model.records import CellRecord, Status
from ..model.spec import Case, as_list, dtype_name, dtype_of
from ..store.reports import duration_key
from .hangs import DEFAULT_MAX_HANGS, HangGuard
from .watchdog import Watchdog, kill_group
from .worker import worker_main

INTERPRETER_BF16 = "bf16 tl.dot is wrong in the Triton interpreter; bf16 is judged on the GPU"


@dataclass
class Task:
    operator: str
    backend: str
    case: Case
    dtype: str
    device: str
    seed: int = 0
    repeats: int = 2
    skip: str | None = None
    skip_kind: str = ""  # "unavailable" (backend cannot run here) or "unsupported" (this cell only)
    oom_tries: int = 0  # times this cell ran out of memory on a shared GPU

    def record_key(self) -> tuple[str, str]:
        """This cell's key in the report's records of earlier runs (report.recorded)."""

        return duration_key(self.operator, self.backend, self.dtype, self.case.name)

    def failed(self, status: str, message: str) -> CellRecord:
        """The cell for this task when it produced no result of its own (SKIP, TIMEOUT, CRASH, ...)."""
        cell = error_cell(self.operator, self.backend, self.case, self.dtype, self.device, self.seed, status, message)
        if status == "SKIP":
            cell.skip_kind = self.skip_kind
        return cell

    def payload(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "backend": self.backend,
            "case": self.case.to_json(),
            "dtype": self.dtype,
            "device": self.device,
            "seed": self.seed,
            "repeats": self.repeats,
        }


@dataclass
class Plan:
    tasks: list[Task] = field(default_factory=list)
    explicit: list[str] = field(default_factory=list)  # backends the user named


def plan(
    kernels: list[str],
    sizes: str,
    backends: list[str] | None,
    dtypes: list[str] | None,
    device: str,
    seed: int = 0,
    repeats: int = 2,
    cases: dict[str, list[Case]] | None = None,
    case_filter: str | None = None,
    here: bool = True,
) -> Plan:
    """Expand the request into tasks; unknown names raise KeyError/ValueError with the valid ones. Without
    ``here`` the cells run on other machines, which judge a backend's packages and GPU themselves (worker.py)."""

    ops = registry.resolve_kernels(kernels)
    dev = device.split(":")[0]
    p = Plan(explicit=list(backends or []))
    if backends:
        # a name no selected operator knows (a typo: "trtion") is an error, not a quietly smaller run
        known_any = {b.name for op_name in ops for b in registry.backends(op_name)}
        unknown = [n for n in backends if n not in known_any and not n.startswith("mutant:")]
        if unknown:
            listing = "; ".join(f"{o}: {', '.join(sorted(b.name for b in registry.backends(o))) or '(none)'}"
                                for o in ops)
            raise KeyError(f"--backend {','.join(unknown)}: no selected operator has such a backend ({listing})")
    for op_name in ops:
        op = registry.get_operator(op_name)
        all_b = [b for b in registry.backends(op_name) if b.role != "speed-reference"]
        if backends:
            known = {b.name for b in registry.backends(op_name)}
            chosen = [b for b in all_b if b.name in backends]
            chosen += [resolve_backend(op_name, n) for n in backends if n.startswith("mutant:")]
            missing = [n for n in backends if n not in known and not n.startswith("mutant:")]
            if missing and len(ops) == 1:
                raise KeyError(
                    f"--backend {','.join(missing)}: operator {op_name!r} has backends "
                    f"{', '.join(sorted(known)) or '(none)'}"
                )
        else:
            chosen = all_b
        case_list = cases[op_name] if cases and op_name in cases else op.cases(sizes, dev)
        if case_filter:
            case_list = [c for c in case_list if case_filter in c.name]
        want = [dtype_name(dtype_of(d)) for d in dtypes] if dtypes else list(op.dtypes.get(dev, ("float32",)))
        for case in case_list:
            allowed = case.params.get("dtypes")
            for dt in want:
                if allowed and dt not in allowed:
                    continue
                for b in chosen:
                    t = Task(op_name, b.name, case, dt, device, seed, repeats)
                    reason = b.unavailable(device, here)
                    if reason:
                        t.skip, t.skip_kind = reason, "unavailable"
                    elif dt not in b.dtypes:
                        t.skip, t.skip_kind = f"backend declares dtypes {', '.join(b.dtypes)} only", "unsupported"
                    elif b.interpret and dev == "cpu" and dt == "bfloat16":
                        # measured: triton 3.9's interpreter computes bf16 tl.dot wrongly on CPU
                        t.skip, t.skip_kind = INTERPRETER_BF16, "unsupported"
                    elif b.skip is not None and (r := b.skip(case, dt, dev)):
                        t.skip, t.skip_kind = r, "unsupported"
                    p.tasks.append(t)
    return p


def worker_env(device: str, gpu: int | None, shared: bool = False) -> dict[str, str]:
    env = {"PYTHONHASHSEED": "0", "HARNESS_GPU_SHARED": "1" if shared else "0"}
    if device.split(":")[0] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # the signals that stop a run (cli.py): Ctrl-C, and SIGTERM


@contextmanager
def _sigint_held():
    """SIGINT and SIGTERM held back (blocked) while a worker is spawned and handed to the watchdog. The worker
    inherits the blocked signals and then ignores SIGINT (worker_main), so Ctrl-C on the terminal reaches
    the parent alone, which stops the workers, instead of a traceback from every worker. A Ctrl-C or
    SIGTERM that arrives meanwhile stays pending and reaches the parent once the worker has started and
    is watched; ignoring SIGINT in the parent during the spawn, as before, dropped it
    (tests/test_interrupts.py)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Worker:
    """A worker process (worker.worker_main) in a process group of its own, watched by ``watchdog``.
    ``deathsig``: the worker is also killed by Linux when the thread starting it dies (PR_SET_PDEATHSIG);
    by default only where that is the main thread, which lives as long as the process."""

    def __init__(self, slot: int, device: str, gpu: int | None, plugins: list[str], threads: int,
                 shared: bool = False, watchdog: Watchdog | None = None, deathsig: bool | None = None):

        self.slot, self.gpu, self.shared, self.watchdog = slot, gpu, shared, watchdog
        if deathsig is None:
            deathsig = threading.current_thread() is threading.main_thread()
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(child, worker_env(device, gpu, shared), plugins, threads,
                                      os.getpid() if deathsig else None), daemon=True
        )
        # Ctrl-C and SIGTERM are the parent's to handle: the worker starts with them held back, and one that
        # arrives meanwhile interrupts the parent only once the watchdog knows the worker
        with _sigint_held():
            self.proc.start()
            if watchdog is not None:
                watchdog.watch(self.proc.pid)
        child.close()
        self.reaped = False  # killed and reaped by kill(): its pid is no longer its own
        self.ready = False
        self.task: Task | None = None
        self.started = 0.0
        self.group: list[Task] = []
        self.need = 0.0  # MB of GPU memory its group is expected to hold (MemoryPacker)
        self.cells = 0

    def send(self, task: Task) -> None:
        self.task, self.started = task, time.time()
        payload = task.payload()
        if self.gpu is not None:
            payload["device"] = "cuda"  # the worker sees only its own GPU
        self.conn.send(payload)

    def kill(self) -> None:
        """SIGKILL to the worker and to every process of its group (what its kernel started, which would
        outlive it), then the worker reaped. Its pid stays its own until then (exit_status does not reap),
        so that the group killed is this worker's. Once it is reaped, killing it again does nothing."""
        pid = self.proc.pid
        if pid is None or self.reaped:
            return
        try:
            kill_group(pid)
            self.proc.kill()  # should it not have called setsid yet
            self.proc.join(5)
        except Exception:
            pass
        if self.proc.exitcode is not None:
            self.reaped = True
            if self.watchdog is not None:
                self.watchdog.forget(pid)

    def stop(self, wait_s: float = 10.0) -> None:
        """End a worker at the end of a run: asked to (after its cell, if any), waited for up to ``wait_s``
        (one still starting is not waited for), then killed with its group: a clean exit leaves what its
        kernel started running, which must not outlive the run."""
        if self.ready:
            wait([self.proc.sentinel], timeout=wait_s)  # its end, without reaping it (exitcode would)
        self.kill()

    def ended(self) -> bool:
        """Whether the worker process has ended (without reaping it, as is_alive would)."""
        return bool(wait([self.proc.sentinel], timeout=0))

    def ask_to_stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass


def run(
    p: Plan,
    plugins: list[str],
    on_cell: Callable[[CellRecord], None],
    workers: int | None = None,
    timeout: float = 300.0,
    startup_timeout: float = 600.0,
    durations: dict[tuple[str, str], float] | None = None,
    stats: dict[str, float] | None = None,
    peaks: dict[tuple[str, str], float] | None = None,
    max_hangs: int | HangGuard = DEFAULT_MAX_HANGS,
) -> list[CellRecord]:
    """Run the plan; calls ``on_cell`` for each finished cell (SKIP cells included). ``max_hangs``: a backend
    that times out on that many cells in a row has its other cells reported as TIMEOUT without running
    them (hangs.py; 0: never give up; or the HangGuard of a run this one continues). ``durations``:
    seconds per cell (report.recorded) from earlier runs, to start the longest groups first.
    ``peaks``: MB of GPU memory per cell from earlier runs, so that workers sharing a GPU start together
    only groups that fit in it. ``stats``, if given, gets where the wall time went: ``ready_s`` (the
    last worker ready), ``cells_s`` (the last cell of the shared phase done), ``alone_cells`` and
    ``alone_s`` (cells rerun alone)."""
    results: list[CellRecord] = []
    t_run = time.time()
    stats = {} if stats is None else stats
    hangs = max_hangs if isinstance(max_hangs, HangGuard) else HangGuard(max_hangs)
    for t in p.tasks:
        if t.skip:
            cell = t.failed("SKIP", t.skip)
            results.append(cell)
            on_cell(cell)
    todo = [t for t in p.tasks if not t.skip]
    if not todo:
        return results
    device = todo[0].device
    gpus: list[int | None]
    if device.split(":")[0] == "cuda":
        ids = os.environ.get("CUDA_VISIBLE_DEVICES")
        if ":" in device:
            gpus = [int(device.split(":")[1])]
        else:
            import torch

            n = torch.cuda.device_count()
            visible = [int(x) for x in ids.split(",")] if ids else list(range(n))
            # more workers than GPUs share them round-robin (compilation and oracles overlap)
            gpus = [visible[i % len(visible)] for i in range(workers or len(visible))]
        threads = 4
    else:
        nw = workers or min(2, os.cpu_count() or 1)
        gpus = [None] * nw
        threads = max(1, (os.cpu_count() or 1) // nw)
    queue = order_groups(todo, durations or {})
    # Out of memory while other workers share the GPU says little about the backend: such a cell goes
    # back to the end of the queue once (its neighbours then are others, mostly small cells), and if it
    # runs out again it is run at the end, one worker per GPU; only the last result is reported.
    shared = len(gpus) > len(set(gpus)) and gpus[0] is not None
    packer = MemoryPacker(peaks or {}, _gpu_budget_mb(gpus) if shared else None)
    # kills every worker's group should this process die by any means (SIGKILL included), and at the end
    # of the run whatever is left of them (a worker whose start Ctrl-C interrupted)
    watchdog = Watchdog()
    pool: list[_Worker] = []
    retry: list[Task] = packer.split_oversized(queue)
    if retry:
        print(f"{len(retry)} cell(s) needed more GPU memory in earlier runs than workers sharing a GPU leave "
              f"({packer.budget:.0f} MB): they run at the end, one worker per GPU", flush=True)

    def finish(w: _Worker, cell: CellRecord) -> None:
        if shared and w.task is not None and is_oom(cell):
            packer.learn_oom(w.task, cell)
            print(f"out of memory on shared gpu{w.gpu}: {w.task.operator}/{w.task.backend}/{w.task.dtype}/"
                  f"{w.task.case.name} ({'again: rerun alone at the end' if w.task.oom_tries else 'requeued'})",
                  flush=True)
            requeue_oom(w.task, queue, retry)
            w.task = None
        else:
            cell.worker = w.slot if w.gpu is None else f"gpu{w.gpu}"
            w.cells += 1
            hangs.seen(cell)
            results.append(cell)
            on_cell(cell)
            w.task = None
        if not w.group:  # its group is done: its memory is free for the next one on this GPU
            packer.release(w.gpu, w.need)
            w.need = 0.0

    def stand_in_for_given_up() -> None:
        """The queued cells of backends given up on (hangs.py), reported at once without running: from the
        queue and from the workers' groups, without waiting for a worker (one restarting after a timeout
        takes seconds) to reach them."""
        if not hangs.given_up:
            return
        for g in queue:
            g[:] = [t for t in g if not _stood_in(t)]
        queue[:] = [g for g in queue if g]
        for w in pool:
            w.group[:] = [t for t in w.group if not _stood_in(t)]
            if not w.group and w.task is None and w.need:
                packer.release(w.gpu, w.need)
                w.need = 0.0

    def _stood_in(t: Task) -> bool:
        cell = hangs.stand_in(t)
        if cell is not None:
            results.append(cell)
            on_cell(cell)
        return cell is not None

    def feed(w: _Worker) -> bool:
        if not w.group:
            taken = packer.take(queue, w.gpu)
            if taken is None:
                return False  # nothing fits this GPU's free memory now: wait for a group to finish
            w.group, w.need = taken
        w.send(w.group.pop(0))
        return True

    def replace(w: _Worker) -> _Worker:
        w.kill()
        nw = _Worker(w.slot, device, w.gpu, plugins, threads, w.shared, watchdog)
        nw.group, nw.cells, nw.need = w.group, w.cells, w.need
        pool[pool.index(w)] = nw
        return nw

    born: dict[int, float] = {}

    def drive() -> None:
        while True:
            stand_in_for_given_up()
            if not (any(w.task or w.group for w in pool) or queue):
                break
            for w in pool:
                if w.ready and w.task is None:
                    feed(w)
            live = [w for w in pool if not w.ended() or w.task]
            if not live:
                break
            ready = wait([w.conn for w in pool], timeout=1.0)
            now = time.time()
            for w in list(pool):
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg is None:
                        t = w.task
                        how = exit_status(w.proc)
                        w.kill()
                        if t is not None:
                            finish(w, t.failed("CRASH", f"worker process died ({how}) while running this cell"))
                        elif not w.ready:
                            # a worker that cannot even start: fail its group instead of looping forever
                            for t2 in w.group:
                                finish(w, t2.failed("ERROR", f"worker failed to start ({how})"))
                            w.group = []
                            packer.release(w.gpu, w.need)
                            w.need = 0.0
                        new = replace(w)
                        born[new.slot] = time.time()
                    elif "ready" in msg:
                        w.ready = True
                        stats["ready_s"] = max(stats.get("ready_s", 0.0), time.time() - t_run)
                    else:
                        cell = CellRecord.from_json(msg)
                        finish(w, cell)
                        if cell.status == Status.CRASH:
                            new = replace(w)
                            born[new.slot] = time.time()
                elif w.task is not None and now - w.started > timeout:
                    t = w.task
                    finish(w, t.failed("TIMEOUT", f"no result after {timeout:.0f} s; worker killed and restarted"))
                    new = replace(w)
                    born[new.slot] = time.time()
                elif not w.ready and now - born[w.slot] > startup_timeout:
                    raise RuntimeError(f"worker {w.slot} did not start within {startup_timeout:.0f} s")

    try:
        for i, g in enumerate(gpus):
            pool.append(_Worker(i, device, g, plugins, threads, shared, watchdog))
            born[i] = time.time()
        try:
            drive()
        except BaseException:  # Ctrl-C, SIGTERM (cli.py), or the report cannot be written (a full disk): the
            for w in pool:     # cells in flight are lost, the finished ones were already handed over
                w.kill()
            raise
        for w in pool:  # tell all to stop first, then wait, so that their exits overlap
            if w.ready:
                w.ask_to_stop()
        for w in pool:
            w.stop()
    finally:
        watchdog.close()
    stats["cells_s"] = time.time() - t_run
    if retry:
        print(f"{len(retry)} cell(s) to run alone, one worker per GPU", flush=True)
        t_alone = time.time()
        results += run(Plan(tasks=retry), plugins, on_cell, len(set(gpus)), timeout, startup_timeout, durations,
                       peaks=peaks, max_hangs=hangs)
        stats["alone_cells"], stats["alone_s"] = len(retry), time.time() - t_alone
    return results


def exit_status(proc: Any, wait_s: float = 5.0) -> str:
    """How a worker process ended: 'exit code 3', 'killed by signal SIGSEGV', or, for SIGKILL from outside
    (the kernel's OOM killer ends a process so), 'killed by signal 9 (SIGKILL): often the kernel's OOM
    killer; see dmesg'. Its pipe closes a moment before the process ends, so its end is waited for first
    (else the exit code reads None), and read without reaping it: its pid, its process group's id, stay
    its own until _Worker.kill has killed what its kernel left running."""
    code = _exit_code(proc, wait_s)
    return "still running when its pipe closed" if code is None else describe_exit(code)


def describe_exit(code: int) -> str:
    """A process's exit code as multiprocessing gives it (-N: killed by signal N), in words."""
    if code >= 0:
        return f"exit code {code}"
    if -code == signal.SIGKILL:
        return "killed by signal 9 (SIGKILL): often the kernel's OOM killer; see dmesg"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _exit_code(proc: Any, wait_s: float) -> int | None:
    """The exit code of an ended child process (-N: killed by signal N), waited for up to ``wait_s``, and
    left unreaped where os.waitid can say it (Linux); else it is reaped (joined)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None or proc.pid is None:
        proc.join(wait_s)
        return proc.exitcode
    deadline = time.monotonic() + wait_s
    while True:
        try:
            r = waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:  # reaped already
            return proc.exitcode
        if r is not None:
            return r.si_status if r.si_code == os.CLD_EXITED else -r.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def order_groups(todo: list[Task], durations: dict[tuple[str, str], float]) -> list[list[Task]]:
    """Cells grouped by (operator, case, dtype): one worker runs a group (its inputs are drawn once).

    With recorded durations the groups run longest first, so that the long ones do not start last and
    leave the other workers idle at the end (a group never seen before counts as the median group).
    Without them, operators are interleaved, so that a sweep cut short still has cells of each."""
    groups: dict[tuple, list[Task]] = {}
    for t in todo:
        groups.setdefault((t.operator, t.case.name, repr(sorted(t.case.params.items())), t.dtype), []).append(t)
    if durations:
        known = sorted(durations.values())
        typical = known[len(known) // 2]

        def cost(g: list[Task]) -> float:
            return sum(durations.get(t.record_key(), typical) for t in g)

        return sorted(groups.values(), key=cost, reverse=True)  # stable: ties keep the plan's order
    by_op: dict[str, list[list[Task]]] = {}
    for g in groups.values():
        by_op.setdefault(g[0].operator, []).append(g)
    return [g for i in range(max(map(len, by_op.values()))) for gs in by_op.values() if i < len(gs) for g in [gs[i]]]


# Memory a worker process holds on its GPU outside torch's allocator (CUDA context, cuBLAS workspace,
# loaded kernels), which a cell's recorded peak (torch's max reserved) does not include.
CONTEXT_MB = 700.0


def _gpu_budget_mb(gpus: list[int | None]) -> float | None:
    """MB that the cells of the workers sharing one GPU may hold together: 90% of the card, less each
    worker's context. HARNESS_GPU_MEM_MB overrides the card's size."""
    env = os.environ.get("HARNESS_GPU_MEM_MB")
    if env:
        total = float(env)
    else:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory / 2**20
    per_gpu = max(gpus.count(g) for g in set(gpus))
    return 0.9 * total - per_gpu * CONTEXT_MB


class MemoryPacker:
    """Which queued group a worker on a shared GPU starts next: the first (longest) one whose expected
    memory fits beside the groups already running on that GPU, so that big cells do not meet and run
    out of memory. A group's expected memory is its cells' largest recorded peak, or what a cell of it
    was found to need when it ran out of memory in this run; a group with no record counts as zero, and
    a GPU with nothing known running takes any group (a big one then runs beside small ones)."""

    def __init__(self, peaks: dict[tuple[str, str], float], budget_mb: float | None):
        self.peaks, self.budget = dict(peaks), budget_mb
        self.held: dict[int | None, float] = {}

    def need(self, group: list[Task]) -> float:
        return max((self.peaks.get(t.record_key(), 0.0) for t in group), default=0.0)

    def take(self, queue: list[list[Task]], gpu: int | None) -> tuple[list[Task], float] | None:
        if not queue:
            return None
        held = self.held.get(gpu, 0.0)
        for i, g in enumerate(queue):
            n = self.need(g) if self.budget is not None else 0.0
            if self.budget is None or held == 0.0 or held + n <= self.budget:
                self.held[gpu] = held + n
                return queue.pop(i), n
        return None

    def split_oversized(self, queue: list[list[Task]]) -> list[Task]:
        """Take out of the queue the groups whose recorded need exceeds what workers sharing a GPU leave
        (a [128, 128256] x 4096 cross-entropy's float64 oracle: 79 GB of an 80 GB H100): shared, they
        could only run out of memory; their cells are run alone at the end."""
        if self.budget is None:
            return []
        big = [g for g in queue if self.need(g) > self.budget]
        queue[:] = [g for g in queue if self.need(g) <= self.budget]
        return [t for g in big for t in g]

    def release(self, gpu: int | None, need: float) -> None:
        self.held[gpu] = max(0.0, self.held.get(gpu, 0.0) - need)

    def learn_oom(self, t: Task, cell: CellRecord) -> None:
        """What the cell held when it ran out, plus the allocation that failed (from torch's message)."""
        m = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB)", cell.error)
        tried = float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1) if m else 0.0
        key = t.record_key()
        self.peaks[key] = max(self.peaks.get(key, 0.0), float(cell.peak_mem_mb or 0.0) + tried)


def requeue_oom(t: Task, queue: list[list[Task]], alone: list[Task]) -> None:
    """A cell that ran out of memory on a shared GPU: the first time back to the end of the queue, where
    its neighbours are other cells; the second time to the cells run at the end, one worker per GPU."""
    t.oom_tries += 1
    if t.oom_tries == 1:
        queue.append([t])
    else:
        alone.append(t)


def per_worker_counts(results: list[CellRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in results:
        if c.worker is not None:
            out[str(c.worker)] = out.get(str(c.worker), 0) + 1
    return out


def exit_code(results: list[CellRecord], explicit: list[str], device_class: str = "",
              plugin_backends: list[str] | None = None) -> int:
    """1 when a cell fails the run (judged under today's rules and declarations; a marginal FAIL too);
    3 when nothing ran at all, or a backend named with --backend or loaded by --plugin ran no cell (a
    run that tested nothing never exits 0); else 0. SKIPs of in-tree backends nobody named are fine."""

    if any(judge_cell(c, device_class=device_class).failing for c in results):
        return 1
    return 3 if not_run(results, explicit, plugin_backends) else 0


def not_run(results: list[CellRecord], explicit: list[str], plugin_backends: list[str] | None = None) -> list[str]:
    """Why the run tested too little: no cell ran, or these named / plugin backends ran none."""
    if results and all(c.status == Status.SKIP for c in results):
        return ["no cell ran: every cell was skipped"]
    out = []
    for name in dict.fromkeys([*as_list(explicit), *(plugin_backends or [])]):
        mine = [c for c in results if c.backend == name]
        if mine and all(c.status == Status.SKIP for c in mine):
            reasons = sorted({c.error for c in mine})
            out.append(f"backend {name} ran no cell: " + "; ".join(reasons))
    return out


class CellExecutor:
    """One persistent worker process running cells one at a time (the pytest plugin, `harness check`,
    `harness repro`, a Ray task), watched by a watchdog of its own (watchdog.py): the worker dies with
    the process that uses this. ``max_hangs``: where it runs a run's many cells (the pytest plugin), a
    backend that timed out on that many cells in a row has its later cells reported as TIMEOUT without
    running them (hangs.py); 0 (the default): every cell is run."""

    def __init__(self, device: str, plugins: list[str], timeout: float = 300.0, gpu: int | None = None,
                 max_hangs: int = 0):
        self.device, self.plugins, self.timeout, self.gpu = device, plugins, timeout, gpu
        self.threads = 0 if device.startswith("cuda") else max(1, os.cpu_count() or 1)
        self.shared = False  # on a GPU shared with other workers (HARNESS_GPU_SHARED)
        self.deathsig: bool | None = None  # _Worker's: None, where the thread starting it is the main thread
        self.hangs = HangGuard(max_hangs)
        self.watchdog = Watchdog()
        self.w: _Worker | None = None

    def _start(self) -> _Worker:
        w = _Worker(0, self.device, self.gpu, self.plugins, self.threads, self.shared, self.watchdog, self.deathsig)
        if not w.conn.poll(600):
            w.kill()
            raise RuntimeError("harness worker did not start within 600 s")
        try:
            msg = w.conn.recv()
        except (EOFError, OSError) as e:
            how = exit_status(w.proc)
            w.kill()
            raise RuntimeError(f"harness worker failed to start ({how})") from e
        w.ready = bool(msg.get("ready"))
        return w

    def run(self, t: Task) -> CellRecord:
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
            w.kill()
            self.w = None
            return t.failed("TIMEOUT", f"no result after {self.timeout:.0f} s; worker killed")
        try:
            cell = CellRecord.from_json(w.conn.recv())
        except (EOFError, OSError):
            how = exit_status(w.proc)
            w.kill()
            self.w = None
            return t.failed("CRASH", f"worker process died ({how}) while running this cell")
        if cell.status == Status.CRASH:
            w.kill()
            self.w = None
        return cell

    def close(self) -> None:
        """The worker asked to stop, then killed with its process group (what its kernel started), and the
        watchdog ended; safe to call twice, and the executor can run cells again after it."""
        if self.w is not None:
            self.w.ask_to_stop()
            self.w.stop()
            self.w = None
        self.watchdog.close()
