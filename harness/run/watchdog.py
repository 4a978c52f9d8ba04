"""Worker processes die with the run, however the run dies (issue #41).

Each harness worker runs in a process group of its own (worker.worker_main calls setsid before torch or a
plugin is imported), so that killing a worker kills what its kernel started with it: :func:`kill_group`.
A local pool (run/pool.py) or a single worker (run/single.py) keeps one :class:`Watchdog`: a small process,
started on the first worker, reading a pipe whose write end only the run's process holds, and told each worker's process
group as the worker starts. When the run's process dies by any means, SIGKILL included, the kernel closes
that write end; the watchdog reads end-of-file and SIGKILLs every group it was told about, whatever the
workers are doing (a tight Python loop, a blocking C call). The watchdog runs in a session of its own, so
that a signal sent to the run's process group (Ctrl-C on a terminal, `kill -- -PGID`) does not take it down
before it has done its work; it ignores SIGINT, SIGTERM and SIGHUP, and it ends when its pipe does.

This file is also the watchdog's program (``python -I watchdog.py``): it imports the standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of the group ``pgid`` (a worker and the processes its kernel started); no
    error where the group is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Watchdog:
    """The run's watchdog process: :meth:`watch` a worker's pid (its process group's id, once the worker has
    called setsid) as the worker starts, :meth:`forget` it once it has been killed and reaped, :meth:`close`
    at the end of the run (whatever is still watched is then killed). Started on the first :meth:`watch`;
    after :meth:`close`, the next :meth:`watch` starts a new one."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None  # the pipe's write end: this process holds it alone (non-inheritable)
        self._lock = threading.Lock()

    def _start(self) -> int:
        r, w = os.pipe()  # both ends close-on-exec: no worker or other child inherits the write end
        try:
            # SIGINT/SIGTERM/SIGHUP held back while it starts: it inherits them blocked, and then ignores them
            old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
            try:
                self._proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=r,
                                              stdout=subprocess.DEVNULL, start_new_session=True)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._fd = w
        return w

    def _send(self, line: str, start: bool) -> None:
        with self._lock:
            fd = self._fd if self._fd is not None or not start else self._start()
            if fd is None:
                return
            try:
                os.write(fd, line.encode())  # a few bytes: one atomic write
            except OSError:  # the watchdog is gone (killed from outside): the workers still die with the
                pass         # thread that started them (worker.py's PR_SET_PDEATHSIG)

    def watch(self, pid: int) -> None:
        """Kill the process group ``pid`` (and the process ``pid``, should it not have called setsid yet) if
        this process dies, or at :meth:`close`."""
        self._send(f"+{pid}\n", start=True)

    def forget(self, pid: int) -> None:
        """The worker ``pid`` is gone (killed and reaped): its id may be reused, do not kill it later."""
        self._send(f"-{pid}\n", start=False)

    def close(self) -> None:
        """End the watchdog: what is still watched is killed, then it exits (waited for, a few seconds)."""
        with self._lock:
            fd, proc, self._fd, self._proc = self._fd, self._proc, None, None
        if fd is not None:
            os.close(fd)
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _watch() -> None:
    """The watchdog's program: the pids it is told on stdin, until end-of-file; then each one killed."""
    for s in _HELD:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    watched: set[int] = set()
    buf = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            if ln[:1] == b"+":
                watched.add(int(ln[1:]))
            elif ln[:1] == b"-":
                watched.discard(int(ln[1:]))
    for pid in watched:
        kill_group(pid)
        try:  # a worker killed before its setsid is in no group of its own yet
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    _watch()
