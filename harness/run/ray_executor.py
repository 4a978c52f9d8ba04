"""`harness run --executor ray`: the cells of a sweep as Ray tasks, past one machine.

Each cell group (operator, case, dtype: the unit the local pool gives one worker) becomes one Ray task
that asks for one GPU, a fraction of one, or a CPU slot, and inside it runs the harness's own worker
process (single.SingleWorker), one cell at a time: a cell's timeout, a worker's exit signal and its crash
record are those of a local run. Tasks run once (``max_retries=0``: a kernel that segfaults is not run
again by Ray). A cell that times out or kills the harness worker costs that cell only: the task starts a
fresh worker for the rest of its group. A Ray task whose own process dies (killed, out of memory, its node
lost) costs the cell it was running (CRASH); the rest of its group is submitted again as a new task, and
the harness worker it had started dies with it (the worker's process group is killed by the task's
watchdog, watchdog.py). The driver submits no more groups than the cluster runs at once; the others wait
on the driver, where a backend that timed out on two cells in a row has its cells not yet submitted
reported as TIMEOUT without running them (hangs.py, ``--max-hangs``).

Cells stream back to the driver as they finish (a Ray generator task yields each one), into the same
report writer as a local run. Each records where it ran (``CellRecord.ran_on``: Ray node, Ray worker,
the harness worker's pid, device class and package versions) and ``worker`` names the node and Ray worker.

Where several groups share one GPU (``--workers N``: at most N groups per GPU), the local pool's
memory-aware packing becomes Ray's resource accounting: a group asks for ``num_gpus`` = its cells' largest
recorded peak memory as a fraction of what a GPU shared by N workers leaves (memory.MemoryPacker's budget),
and at least 1/N; a group recorded to need more runs alone (``num_gpus=1``), and a cell that still runs out of
memory beside others is run again alone.

The project travels to the cluster's workers as Ray's runtime environment (``working_dir``: the checkout
without reports/, .git/ and the local caches); a plugin file outside the checkout travels with its folder
(``py_modules``). Packages (torch, triton, ...) are the cluster's: each cell records the versions it ran
with, and the driver warns when they differ from its own.

Nothing here imports Ray until the executor is constructed; without Ray that is a usage error naming the
extra to install.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..measure.failures import is_oom
from ..model.errors import CannotRunHere, UsageError
from ..model.records import CellRecord
from ..model.registry import REPO_ROOT
from ..model.spec import Case
from ..store import provenance
from .executor import Executor, OnCell, report_skipped
from .hangs import DEFAULT_MAX_HANGS, HangGuard
from .memory import CONTEXT_MB, MemoryPacker
from .plan import Task, order_groups
from .single import SingleWorker

EXTRA = 'pip install "gradient-harness[ray]"'
# what the working_dir upload leaves out (gitignore syntax, anchored at the checkout root; Ray also
# honours the checkout's .gitignore): the reports stay with the driver, which writes them
EXCLUDES = ["/reports/", "/.harness/", "/.git/", "/.device/", "/.whl/", "/.cache/", "/.venv/", "/build/", "/dist/",
            "*.egg-info/", "__pycache__/", "/.pytest_cache/", "/.ruff_cache/", "/.hypothesis/", "/.benchmarks/"]
PLUGIN_DIR_TAG = "@py_modules:"  # a plugin spec naming a file in a folder shipped through py_modules


def import_ray() -> Any:
    """Ray, or a usage error naming the extra that installs it."""
    try:
        import ray
    except ImportError as e:
        raise UsageError(f"--executor ray needs Ray, which is not installed here ({e}); install the extra: "
                         f"{EXTRA}") from e
    return ray


# -- on the cluster ---------------------------------------------------------------------------------------


class _GroupCells(SingleWorker):
    """SingleWorker (timeouts, crashes, a fresh worker after either; the worker in a process group of its
    own, which the executor's watchdog kills when the Ray worker dies) whose worker is also made to die with
    the Ray worker's thread that started it (PR_SET_PDEATHSIG, Linux), as before the watchdog: a Ray worker
    killed mid-cell leaves no orphan still running a hung kernel. Every cell runs: the driver's hang guard
    decides which cells are submitted at all."""

    def __init__(self, device: str, plugins: list[str], timeout: float, threads: int, shared: bool):
        super().__init__(device, plugins, timeout, max_hangs=0)
        self.cells.threads, self.cells.shared, self.cells.deathsig = threads, shared, True

    @property
    def pid(self) -> int | None:
        w = self.cells.w
        return w.proc.pid if w is not None else None


_CLASS: dict[str, str] = {}


def _device_class_here(device: str) -> str:
    """This node's device class, as provenance.device_class names it; for a GPU it is asked of a short
    subprocess (once per Ray worker and GPU), so that this process holds no CUDA context of its own."""
    if not device.startswith("cuda"):
        return "cpu"
    key = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if key not in _CLASS:

        r = subprocess.run([sys.executable, "-c", "from harness.store.provenance import device_class as d; "
                            "print(d('cuda'))"], capture_output=True, text=True, timeout=300)
        _CLASS[key] = (r.stdout.strip().splitlines() or ["unknown"])[-1]
    return _CLASS[key]


def describe_here(device: str) -> dict[str, Any]:
    """A Ray task: the device, device class and package versions of the node it runs on, asked of a short
    subprocess, so that this Ray worker holds no CUDA context of its own."""

    code = ("import json; from harness.store import provenance as p; "
            f"print(json.dumps({{'device': p.device_name({device!r}), 'device_class': p.device_class({device!r}), "
            "'versions': p.versions()}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"could not describe {device} on {socket.gethostname()}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _plugin_here(spec: str) -> str:
    """A plugin spec as this node sees it: a file shipped in a py_modules folder is found on sys.path."""
    if not spec.startswith(PLUGIN_DIR_TAG):
        return spec
    rel = spec[len(PLUGIN_DIR_TAG):]
    for entry in sys.path:
        p = Path(entry or ".") / rel
        if p.is_file():
            return str(p)
    raise FileNotFoundError(f"plugin {rel} did not arrive with the runtime environment (sys.path: {sys.path})")


def run_group(payloads: list[dict], plugins: list[str], device: str, timeout: float, threads: int,
              shared: bool):
    """A Ray generator task: the cells of one group, each yielded (as its record's JSON) when it finishes."""
    import ray


    ctx = ray.get_runtime_context()
    where = {"executor": "ray", "node_id": ctx.get_node_id(), "worker_id": ctx.get_worker_id(),
             "task_id": ctx.get_task_id(), "host": socket.gethostname(), "node_ip": ray.util.get_node_ip_address(),
             "device_class": _device_class_here(device), "versions": provenance.versions()}
    if device.startswith("cuda"):
        where["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
    cells = _cells_for((device, tuple(plugins), timeout, threads, shared, os.environ.get("CUDA_VISIBLE_DEVICES")))
    finished = False
    try:
        for p in payloads:
            t = Task(p["operator"], p["backend"], Case.from_json(p["case"]), p["dtype"], p["device"],
                            p.get("seed", 0), p.get("repeats", 2))
            pid = cells.pid
            cell = cells.run_one(t)
            cell.worker = f"{where['node_id'][:8]}/{where['worker_id'][:8]}"
            cell.ran_on = {**where, "pid": pid or cells.pid}
            yield cell.to_json()
        finished = True
    finally:
        if not finished:  # cancelled (Ctrl-C on the driver) or failed: the harness worker goes with it
            _drop_cells()


# The harness worker outlives its task: the Ray worker process (which Ray keeps for the next task of the same
# run, and ends with the run) hands it the next group, as a local worker takes group after group, so that
# neither the worker's start (torch, triton imports) nor its in-process caches are paid again per group.
_CACHED: list[Any] = []  # [(key, _GroupCells)]


def _cells_for(key: tuple) -> _GroupCells:
    if _CACHED and _CACHED[0][0] == key:
        return _CACHED[0][1]
    _drop_cells()
    device, plugins, timeout, threads, shared, _ = key
    cells = _GroupCells(device, [_plugin_here(p) for p in plugins], timeout, threads, shared)
    _CACHED.append((key, cells))
    return cells


def _drop_cells() -> None:
    while _CACHED:
        _CACHED.pop()[1].close()


# -- on the driver ----------------------------------------------------------------------------------------


def runtime_env(plugins: list[str], root: Path) -> tuple[dict[str, Any], list[str]]:
    """Ray's runtime environment carrying the checkout and the plugins' files to every worker, and the
    plugin specs as the workers will load them (relative to the checkout, or in a shipped folder)."""
    specs, modules = [], []
    for spec in plugins:
        p = Path(spec)
        if not (p.suffix == ".py" or os.sep in spec) or not p.exists():
            specs.append(spec)  # a module name: installed on the cluster like the other packages
            continue
        p = p.resolve()
        try:
            specs.append(str(p.relative_to(root)))  # working_dir is the workers' current directory
        except ValueError:
            if str(p.parent) not in modules:
                modules.append(str(p.parent))
            specs.append(f"{PLUGIN_DIR_TAG}{p.parent.name}/{p.name}")
    env_vars = {k: v for k, v in os.environ.items() if k.startswith("HARNESS_") and k != "HARNESS_GPU_SHARED"}
    env: dict[str, Any] = {"working_dir": str(root), "excludes": EXCLUDES}
    if modules:
        env["py_modules"] = modules
    if env_vars:
        env["env_vars"] = env_vars
    return env, specs


def gpu_fraction(group: list[Task], peaks: dict, per_gpu: int, gpu_mem_mb: float | None) -> float:
    """num_gpus for a group: the whole GPU unless groups share it (per_gpu > 1); then its recorded need as
    a fraction of what per_gpu workers leave of the card (MemoryPacker's budget), at least 1/per_gpu, and
    the whole GPU for a group that needs more than that budget (MemoryPacker.split_oversized)."""
    if per_gpu <= 1:
        return 1.0
    least = math.floor(1e4 / per_gpu) / 1e4  # Ray counts GPU fractions to 1e-4
    if not gpu_mem_mb:
        return least
    budget = 0.9 * gpu_mem_mb - per_gpu * CONTEXT_MB
    need = MemoryPacker(peaks, budget).need(group)
    if budget <= 0 or need > budget:
        return 1.0
    return max(least, min(1.0, math.ceil(need / budget * 1e4) / 1e4))


@dataclass
class _Submitted:
    group: list[Task]
    frac: float
    done: int = 0
    alone: bool = False


@dataclass
class RayExecutor(Executor):
    """Cell groups as Ray tasks on a Ray cluster (``address``: --ray-address, else RAY_ADDRESS, else a
    running cluster on this machine, else a local Ray started for the run)."""

    plugins: list[str]
    device: str | None  # None: cuda where the cluster has a GPU, else cpu
    address: str | None = None
    timeout: float = 300.0
    workers: int | None = None  # on a GPU: the most groups sharing one GPU (default 1); on CPU: unused
    cpus_per_task: int = 1
    durations: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    # a backend that times out on this many cells in a row has its cells not yet submitted reported as
    # TIMEOUT without running them (hangs.py); 0: never give up (and every group submitted at once)
    max_hangs: int = DEFAULT_MAX_HANGS

    def __post_init__(self) -> None:
        self.ray = import_ray()

        self.root = REPO_ROOT
        self.pending: dict[Any, _Submitted] = {}
        self.backlog: list[tuple[list[Task], bool]] = []  # (group, alone) not submitted yet
        self._started_ray = False
        self._connect()

    def _connect(self) -> None:
        ray = self.ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env, self.worker_plugins = runtime_env(self.plugins, self.root)
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        t0 = time.time()
        if not ray.is_initialized():
            try:
                ray.init(address=address, runtime_env=env, logging_level=logging.WARNING,
                         log_to_driver=True, namespace="harness")
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise UsageError(f"--executor ray: cannot connect to the Ray cluster at {address!r}: {e}") from e
            self._started_ray = True
        self.stats["ray_connect_s"] = time.time() - t0
        res = ray.cluster_resources()
        if self.device is None:
            self.device = "cuda" if res.get("GPU", 0) >= 1 else "cpu"
        self.cuda = self.device.startswith("cuda")
        if self.cuda and res.get("GPU", 0) < 1:
            self.close()
            raise CannotRunHere(f"--executor ray --device {self.device}: the Ray cluster has no GPU "
                                f"(resources: {res})")
        if not self.cuda and res.get("CPU", 0) < self.cpus_per_task:
            self.close()
            raise CannotRunHere(f"--executor ray: the Ray cluster has no CPU slot for a task (resources: {res})")
        self.cluster = {"nodes": sum(1 for n in ray.nodes() if n.get("Alive")), "resources": res}
        self.per_gpu = max(1, self.workers or 1) if self.cuda else 1
        self.gpu_mem_mb = self._gpu_mem_mb() if self.cuda and self.per_gpu > 1 else None
        self._remote = ray.remote(max_retries=0)(run_group)

    def describe(self) -> dict[str, Any]:
        """The device, device class and versions of the machines the cells run on (of one of them: each cell
        records its own), for the run's header and the report's folder (RunRequest.elsewhere)."""
        opts: dict[str, Any] = {"num_gpus": 1} if self.cuda else {"num_cpus": 1}
        probe = self.ray.remote(max_retries=0)(describe_here).options(**opts)
        try:
            return self.ray.get(probe.remote("cuda" if self.cuda else "cpu"), timeout=900)
        except Exception as e:
            self.close()
            raise CannotRunHere(f"--executor ray: could not describe the cluster's {self.device}: "
                                f"{_last_line(e)}") from e

    def _gpu_mem_mb(self) -> float | None:
        """A cluster GPU's memory (HARNESS_GPU_MEM_MB overrides), for the fractions of a shared GPU."""
        if os.environ.get("HARNESS_GPU_MEM_MB"):
            return float(os.environ["HARNESS_GPU_MEM_MB"])

        def total() -> float:

            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
            return float(out[0]) if out else 0.0

        try:
            mb = self.ray.get(self.ray.remote(num_gpus=1, max_retries=0)(total).remote(), timeout=300)
        except Exception:
            mb = 0.0
        return mb or None

    def _submit(self, group: list[Task], alone: bool = False) -> None:
        frac = 1.0 if alone else (gpu_fraction(group, self.peaks, self.per_gpu, self.gpu_mem_mb) if self.cuda
                                  else 0.0)
        device = "cuda" if self.cuda else self.device  # a task sees its own GPU(s) only
        payloads = [{**t.payload(), "device": device} for t in group]
        threads = 4 if self.cuda else self.cpus_per_task
        opts: dict[str, Any] = {"num_gpus": frac, "num_cpus": 1} if self.cuda else {"num_cpus": self.cpus_per_task}
        gen = self._remote.options(**opts).remote(payloads, self.worker_plugins, device, self.timeout, threads,
                                                  self.cuda and frac < 1.0)
        self.pending[gen] = _Submitted(group, frac, alone=alone)

    def slots(self) -> int:
        """How many group tasks the cluster runs at once (its CPU slots, or its GPUs times the groups that
        may share one)."""
        res = self.cluster["resources"]
        n = res.get("GPU", 0) * self.per_gpu if self.cuda else res.get("CPU", 0) // self.cpus_per_task
        return max(1, int(n))

    def _top_up(self, hangs: HangGuard, on_cell: OnCell) -> None:
        """Submit groups of the backlog while the cluster has a free slot for them, the cells of a backend
        given up on (hangs.py) reported as TIMEOUT instead: groups wait here rather than in Ray's queue, so
        that the guard still has a say. With max_hangs 0 every group is submitted at once."""
        room = self.slots() if hangs.max_hangs else math.inf
        while self.backlog and len(self.pending) < room:
            group, alone = self.backlog.pop(0)
            left = []
            for t in group:
                stand_in = hangs.stand_in(t)
                if stand_in is None:
                    left.append(t)
                else:
                    on_cell(stand_in)
            if left:
                self._submit(left, alone)

    def run(self, tasks: list[Task], on_cell: OnCell) -> None:
        ray = self.ray
        t_run = time.time()
        todo = report_skipped(tasks, on_cell)
        self.backlog = [(g, False) for g in order_groups(todo, self.durations)] if todo else []
        hangs = HangGuard(self.max_hangs)

        def done(cell: CellRecord) -> None:
            hangs.seen(cell)
            on_cell(cell)


        mine = (provenance.device_class(self.device), provenance.versions())
        elsewhere: set[str] = set()
        try:
            self._top_up(hangs, on_cell)
            while self.pending:
                ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=1.0)
                for gen in ready:
                    self._drain(gen, done, mine, elsewhere)
                self._top_up(hangs, on_cell)
        except KeyboardInterrupt:
            self._cancel()
            raise
        self.stats["cells_s"] = time.time() - t_run
        for w in sorted(elsewhere):
            print(f"warning: {w}", file=sys.stderr)

    def _drain(self, gen: Any, on_cell: OnCell, mine: tuple, elsewhere: set[str]) -> None:
        """What a task yielded since the last look: finished cells, its end, or its death."""
        ray = self.ray
        sub = self.pending[gen]
        while True:
            try:
                if not gen.is_finished() and not gen.next_ready():
                    return  # nothing more yet
                ref = next(gen)
            except StopIteration:
                self.pending.pop(gen, None)
                if sub.done < len(sub.group):  # ended without its cells: submit them again (first)
                    self.backlog.insert(0, (sub.group[sub.done:], sub.alone))
                return
            try:
                cell = CellRecord.from_json(ray.get(ref))
            except ray.exceptions.RayTaskError as e:
                # the task's own code failed (the harness worker could not start): the group's cells are
                # ERROR, as a local worker that cannot start fails its group
                self.pending.pop(gen, None)
                for t in sub.group[sub.done:]:
                    on_cell(t.failed("ERROR", f"Ray task failed: {_last_line(e)}"))
                return
            except ray.exceptions.RayError as e:
                # the Ray worker died (killed, out of memory, its node lost): the cell it was running is a
                # CRASH, the rest of its group runs again as a new task
                self.pending.pop(gen, None)
                if sub.done >= len(sub.group):
                    return  # it died after its last cell
                t, rest = sub.group[sub.done], sub.group[sub.done + 1:]
                cell = t.failed("CRASH", f"Ray worker died ({type(e).__name__}: {_last_line(e)}) while running "
                                         "this cell")
                cell.ran_on = {"executor": "ray", "lost": True}
                on_cell(cell)
                if rest:
                    self.backlog.insert(0, (rest, sub.alone))
                return
            t = sub.group[sub.done]
            sub.done += 1
            if self.cuda and sub.frac < 1.0 and not sub.alone and is_oom(cell):
                print(f"out of memory on a shared GPU: {t.operator}/{t.backend}/{t.dtype}/{t.case.name} "
                      "(rerun alone)", flush=True)
                self.backlog.insert(0, ([t], True))
                continue
            ran = cell.ran_on or {}
            if ran.get("device_class") not in (None, mine[0]):
                elsewhere.add(f"cells ran on device class {ran['device_class']} (node {ran.get('host')}); "
                              f"the report is filed under {mine[0]}")
            for k, v in (ran.get("versions") or {}).items():
                if mine[1].get(k) != v:
                    elsewhere.add(f"node {ran.get('host')} has {k} {v}; this machine has {mine[1].get(k)}")
            on_cell(cell)

    def _cancel(self) -> None:
        self.backlog.clear()
        for gen in list(self.pending):
            try:
                self.ray.cancel(gen)  # KeyboardInterrupt in the task: its finally stops the harness worker
            except Exception:
                pass
        self.pending.clear()

    def close(self) -> None:
        self._cancel()
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._started_ray = False


def _last_line(e: BaseException) -> str:
    """A Ray error's message without its traceback: the last line says what happened."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
