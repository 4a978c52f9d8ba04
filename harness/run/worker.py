"""Worker process: runs cells for one device; a crash or hang costs only the cell in flight.

The parent (run/processes.py) starts workers with the ``spawn`` method so that environment variables
(TRITON_INTERPRET for CPU runs, CUDA_VISIBLE_DEVICES for one GPU per worker) are set before torch or
triton is imported, and so that a dead CUDA context dies with its process.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any


def worker_main(conn: Connection, env: dict[str, str], plugins: list[str], threads: int,
                parent: int | None = None) -> None:
    # Ctrl-C is the parent's: it stops the workers and reports what completed (run/processes.py spawns this
    # process with SIGINT and SIGTERM blocked, so none arrives before this line; from here on SIGINT is
    # ignored, and SIGTERM, sent to this process itself, ends it as usual)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_group(parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.environ.update(env)
    import torch

    if threads:
        torch.set_num_threads(threads)
    from ..model import registry
    from ..model.spec import Case

    registry.discover()
    for p in plugins:
        registry.load_plugin(p)
    _warm_imports()
    conn.send({"ready": True, "pid": os.getpid()})
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        case = Case.from_json(task["case"])
        cell = _unavailable_here(task, case)  # planned elsewhere (a cluster's driver): judged here
        if cell is None:
            cell = _run(task, case)
        conn.send(cell.to_json())  # the pipe carries the record's JSON (records.py), like the JSONL
        if cell.status.value == "CRASH":
            # the CUDA context is unusable after a device fault: let the parent start a fresh worker
            conn.close()
            sys.exit(3)
        if task["device"].startswith("cuda") and cell.status.value != "SKIP":
            torch.cuda.empty_cache()  # cached blocks would starve other workers sharing this GPU


def _warm_imports() -> None:
    """What every cell imports, imported before the worker says it is ready, so that a cell's timeout counts
    the cell's own work. The floor's dispatch modes (the order draws, TF32) import torch._dynamo on their first
    use: 1.3 s on an idle CPU, more under load, which a fresh worker's first cell paid out of its timeout (a
    2 s timeout in CI's tests/test_worker_lifecycle.py expired before the backend was called)."""
    import torch._dynamo  # noqa: F401

    from ..measure import cell  # noqa: F401


def own_group(parent: int | None) -> None:
    """This worker in a session and process group of its own, before torch or a plugin is imported: the
    processes a kernel starts join it, and the runner, or the run's watchdog (watchdog.py) when the run's
    process dies, kills the group as one. With ``parent`` (the pid of the process that started this one,
    from the thread that will outlive it), Linux also SIGKILLs this worker when that thread dies
    (PR_SET_PDEATHSIG), even where the watchdog was killed with it."""
    try:
        os.setsid()
    except OSError:  # already a group leader (not as run/processes.py starts it)
        pass
    if parent is None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl: no signal will come, and no one waits for us
        os._exit(1)


def _unavailable_here(task: dict, case: Any) -> Any:
    """A SKIP cell for a backend that cannot run on this machine (a package or the GPU missing), or None."""
    from ..measure.failures import error_cell
    from ..model.mutant_builds import resolve as resolve_backend

    try:
        backend = resolve_backend(task["operator"], task["backend"])
    except Exception:  # noqa: BLE001 - _run reports it as the cell's ERROR
        return None
    why = backend.unavailable(task["device"])
    if not why:
        return None
    cell = error_cell(task["operator"], task["backend"], case, task["dtype"], task["device"], task.get("seed", 0),
                      "SKIP", why)
    cell.skip_kind = "unavailable"
    return cell


def _run(task: dict, case: Any) -> Any:
    """One cell in this process; on a GPU with its memory peaks, and CRASH where it left the context lost."""
    from ..measure.cell import safe_run_cell
    from ..measure.device_memory import peak_allocated_mb, peak_reserved_mb, reset_peaks
    from ..measure.failures import error_cell
    from ..model import registry
    from ..model.mutant_builds import resolve as resolve_backend
    from ..model.records import Status

    cuda = task["device"].startswith("cuda")
    if cuda:
        reset_peaks()
    try:
        op = registry.get_operator(task["operator"])
        backend = resolve_backend(task["operator"], task["backend"])
        cell = safe_run_cell(op, backend, case, task["dtype"], task["device"], task.get("seed", 0),
                             task.get("repeats", 2))
    except Exception as e:  # e.g. a mutant whose edit does not apply
        cell = error_cell(task["operator"], task["backend"], case, task["dtype"], task["device"],
                          task.get("seed", 0), "ERROR", f"{type(e).__name__}: {e}", traceback.format_exc(limit=8))
    if cuda:
        lost = _context_lost()
        if lost and cell.status != Status.CRASH:
            # a fault that no call of the cell reported (an asynchronous out-of-bounds access seen only by
            # the next synchronization): the cell did it, and this worker's CUDA context is gone
            cell.status = Status.CRASH
            cell.error = f"device fault after the cell's calls returned: {lost}" + \
                (f" (the cell had said: {cell.error[:300]})" if cell.error else "")
        if not lost:
            # what this cell held on the GPU at most (the runner packs the next sweep's cells by it)
            cell.peak_mem_mb = peak_reserved_mb()
            cell.peak_alloc_mb = peak_allocated_mb()
    return cell


def _context_lost() -> str:
    """Why this process's CUDA context is unusable (a sticky device fault), or "" if it is fine."""
    import torch

    try:
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - any failure to synchronize leaves the context unusable
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
