"""The parent's side of a harness worker process (the child's side is worker.py): starting one with the
signals and environment it needs, killing it with what its kernel started, and saying how it ended.

Both executors that run worker processes on this machine use it: the pool (pool.py) and the single worker
(single.py). Each worker runs in a process group of its own, killed as one, and is watched by the run's
watchdog (watchdog.py), which kills every group should the run's process die by any means.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import wait
from typing import Any

from .plan import Task
from .watchdog import Watchdog, kill_group
from .worker import worker_main

HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # the signals that stop a run (cli.py): Ctrl-C, and SIGTERM


def worker_env(device: str, gpu: int | None, shared: bool = False) -> dict[str, str]:
    """What a worker sets before it imports torch or triton (hence spawn, not fork): the interpreter on CPU,
    its one GPU, and whether that GPU is shared (the worker then reports running out of memory differently)."""
    env = {"PYTHONHASHSEED": "0", "HARNESS_GPU_SHARED": "1" if shared else "0"}
    if device.split(":")[0] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


@contextmanager
def sigint_held():
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


class WorkerProcess:
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
        with sigint_held():
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


def exit_status(proc: Any, wait_s: float = 5.0) -> str:
    """How a worker process ended: 'exit code 3', 'killed by signal SIGSEGV', or, for SIGKILL from outside
    (the kernel's OOM killer ends a process so), 'killed by signal 9 (SIGKILL): often the kernel's OOM
    killer; see dmesg'. Its pipe closes a moment before the process ends, so its end is waited for first
    (else the exit code reads None), and read without reaping it: its pid, its process group's id, stay
    its own until WorkerProcess.kill has killed what its kernel left running."""
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
