"""`harness run`: the request checked, the cells planned (with --hypothesis and --resume), the pool
started, the cells run under a progress bar (Ctrl-C and SIGTERM stop them alike), then the report, the
terminal's summary and the repro bundles (harness/front/run_summary.py)."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..judge.judgement import judge_cell
from ..model import registry
from ..model.devices import parsed_device
from ..model.errors import UsageError
from ..model.records import CellId, CellRecord
from ..model.spec import as_list
from ..model.strategies import sample_cases
from ..run import pool as run_pool
from ..run.executor import Executor
from ..run.hangs import HangGuard
from ..run.plan import Task, plan
from ..run.ray_executor import RayExecutor
from ..run.session import RunRequest, RunSession, load_plugins
from ..store import reports
from ..store.provenance import same_code
from ..store.reports import ensure_harness_dir
from .commands import operators_of
from .minimal import shrink_failures
from .run_summary import comparison_summary, print_summary, save_repros


def cmd_run(a: argparse.Namespace) -> int:
    req = checked_request(a)
    extra = (lambda _plan, device: hypothesis_tasks(a, device)) if a.hypothesis else None
    pool = ray_pool(a, req)
    try:
        session = RunSession(req, extra_tasks=extra)
        if a.resume and not resumed(session):
            return 0
        pool = ready_pool(a, session, pool)
        session.begin()  # refused where another run holds the report folder: the Ray pool must not leak
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    t0 = time.time()
    stopped = execute(session, pool, progress=not a.no_progress)
    if stopped is not None:
        return stopped
    return conclude(session, pool, t0)


def checked_request(a: argparse.Namespace) -> RunRequest:
    """The run `harness run`'s options ask for, its operators and their --sizes preset checked."""
    load_plugins(a.plugin)  # first: a plugin's operators count among --kernel's names and have presets
    if not as_list(a.kernel):
        raise UsageError(f"--kernel {a.kernel!r}: expected an operator id, a family (e.g. mhc) or 'all'")
    for op_name in operators_of(as_list(a.kernel)):
        presets = registry.get_operator(op_name).presets
        if a.sizes not in presets:
            raise UsageError(f"--sizes {a.sizes!r}: operator {op_name} has the presets {', '.join(presets)}")
    return RunRequest(as_list(a.kernel), a.sizes, as_list(a.backend) or None, as_list(a.dtype) or None, a.device,
                      list(a.plugin), a.seed, a.repeats, a.case, a.report,
                      command="harness " + " ".join(shlex.quote(x) for x in sys.argv[1:]), compare=a.compare,
                      compare_fail=a.compare_fail, compare_require=a.compare_require,
                      compare_accept=a.compare_accept, shrink_seconds=a.shrink_seconds)


def ray_pool(a: argparse.Namespace, req: RunRequest) -> RayExecutor | None:
    """With --executor ray, the cluster's pool, connected before the run is planned: its machines, not this
    one, have the device the cells run on (a driver without a GPU runs a GPU sweep), and they name the
    report's device class (set on ``req``)."""
    if a.executor != "ray":
        return None
    pool = RayExecutor(list(a.plugin), parsed_device(a.device), a.ray_address, a.timeout, a.workers,
                       max_hangs=a.max_hangs)
    req.device, req.elsewhere = pool.device, pool.describe()
    return pool


def resumed(session: RunSession) -> bool:
    """--resume: the plan without the cells that already have a result; False when none is left to run."""
    plan, header = session.plan, session.header
    plan.tasks, header["resumes"] = resume(plan.tasks, session.report_dir, header["commit"], header)
    if not plan.tasks:
        print(f"--resume: every planned cell already has a result from this code (commit {header['commit']}); "
              "nothing to run")
        return False
    return True


def ready_pool(a: argparse.Namespace, session: RunSession, pool: RayExecutor | None) -> Executor:
    """The pool that runs the cells (the local workers unless Ray's is given), told the cells' earlier
    timings and memory peaks so that it can order and pack them."""
    ensure_harness_dir(a.report)
    recorded = recorded_costs(a.report, session.device, session.device_class, session.plan.tasks)
    if pool is None:
        return run_pool.LocalPool(registry.plugins_loaded(), a.workers, a.timeout, **recorded, max_hangs=a.max_hangs)
    pool.durations.update(recorded["durations"])
    pool.peaks.update(recorded["peaks"])
    return pool


def execute(session: RunSession, pool: Executor, progress: bool) -> int | None:
    """Run the planned cells; None when they all ran, else the exit status of the interrupted run."""
    bar = _progress(len(session.plan.tasks), progress)

    def on_cell(cell: CellRecord) -> None:
        if bar is not None:
            shown = judge_cell(cell, device_class=session.device_class).shown
            bar.set_postfix_str(f"{cell.operator}/{cell.backend}/{cell.dtype} {shown}")
            bar.update(1)

    try:
        with _sigterm_as_interrupt():
            session.execute(pool, on_cell)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated): the same stop, the same report
        if bar is not None:
            bar.close()
        if isinstance(e, Terminated):
            print("harness run: terminated (SIGTERM)", file=sys.stderr)
        code = session.interrupted()
        return 128 + e.signum if isinstance(e, Terminated) else code
    if bar is not None:
        bar.close()
    return None


def conclude(session: RunSession, pool: Any, t0: float) -> int:
    """After the cells: the comparison, the report, the terminal's summary, the bundles; the exit status."""
    try:
        comparison, too_few = session.compare(), None  # before rendering: the report shows it
    except UsageError as e:  # too few cells compared: the report is still written, then exit 2
        comparison, too_few = session.comparison, e
    shrink_failures(session, session.req.shrink_seconds)  # before the report: it shows them first
    t_render = time.time()
    paths = session.render()
    pool.stats["render_s"] = time.time() - t_render
    print_summary(session, pool.stats, time.time() - t0, paths)
    save_repros(session)
    if comparison is not None:
        print(comparison_summary(comparison))
    if too_few is not None:
        raise too_few
    code = session.exit_code()
    if code == 3:
        for why in session.not_run():
            print(f"harness run: tested nothing here: {why}", file=sys.stderr)
    return code


def _progress(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr, or None when turned off (--no-progress) or tqdm is not installed."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="cell", dynamic_ncols=True, file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a CI job's stop, `kill`), raised in the main thread and handled as Ctrl-C is:
    workers stopped, the report of what completed, the --resume command; exit 128+15."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated while the cells run (in the main thread; elsewhere it is left alone); the
    runner holds it back, as it does SIGINT, while it starts a worker. A second SIGTERM, while the
    interrupted run is being reported, ends the process as SIGTERM does."""

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, _frame: Any) -> None:
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def resume(tasks: list[Task], dir_: Path | None, commit: str,
           header: dict[str, Any] | None = None) -> tuple[list[Task], list[str]]:
    """The tasks without a result in ``dir_`` from a run at this commit or, given this run's ``header``, from a
    run of the same code (provenance.code_digest), package versions and backend files; and those runs' ids."""

    if not commit or commit == "unknown" or commit.endswith("+dirty"):
        raise UsageError(f"--resume: the checkout is at {commit!r}; results can only be reused from a clean "
                         "commit (commit the change, or set HARNESS_COMMIT where the tree has no .git)")
    done: set[CellId] = set()
    used: set[str] = set()
    for op in sorted({t.operator for t in tasks}):
        cells, runs = reports.load(dir_, op)
        for c in cells:
            # a cell not run because its backend hung before is no result: a resumed run tries it
            if _reusable(runs.get(c.run_id or "", {}), header or {"commit": commit}, f"{c.operator}/{c.backend}") \
                    and not HangGuard.is_stand_in(c):
                done.add(c.id)
                used.add(c.run_id or "")
    left = [t for t in tasks if t.id not in done]
    print(f"--resume: {len(tasks) - len(left)} of {len(tasks)} cells already have a result from this code "
          f"(commit {commit}); running {len(left)}")
    return left, sorted(used)


def _reusable(run: dict[str, Any], now: dict[str, Any], backend: str) -> bool:
    """Did ``run`` measure this backend's cells with the code of this run (``now``, its header): the same commit,
    or the same code (provenance.same_code) and the same files of this backend (a plugin's are not in the digest)?"""
    same_files = run.get("backends", {}).get(backend) == now.get("backends", {}).get(backend)
    return same_code(run, now) and (run.get("commit") == now.get("commit") or same_files)


def recorded_costs(root: str, device: str, dev_class: str, tasks: list[Task]) -> dict[str, dict]:
    """The report's earlier timings and GPU memory peaks of these cells on this device class: the longest
    groups start first, and workers sharing a GPU start together only groups that fit in it."""

    ops = sorted({t.operator for t in tasks})
    fields = ("duration_s", "peak_mem_mb")
    rec = reports.recorded(Path(root) / dev_class, ops, fields)
    if device.startswith("cuda"):
        # first run on this GPU class: another GPU class's records still rank the groups and size them
        for d in sorted(Path(root).glob("*/")):
            if all(rec.values()):
                break
            if d.name not in ("cpu", dev_class):
                other = reports.recorded(d, ops, fields)
                rec = {f: rec[f] or other[f] for f in fields}
    return {"durations": rec["duration_s"], "peaks": rec["peak_mem_mb"]}


def hypothesis_tasks(a: argparse.Namespace, device: str) -> list[Task]:
    """--hypothesis N: the tasks of N cases drawn by each operator's strategy, added to the plan."""
    ops = registry.resolve_kernels(as_list(a.kernel))
    # an operator without a strategy would quietly run without the drawn cases: refused instead
    without = [o for o in ops if registry.get_operator(o).strategy is None]
    if without:
        having = sorted(n for n, op in registry.operators().items() if op.strategy is not None)
        raise UsageError(f"--hypothesis {a.hypothesis}: no hypothesis strategy for operator(s) {', '.join(without)} "
                         "(OperatorSpec.strategy draws the cases); operators with one: "
                         f"{', '.join(having) or '(none)'}; leave out --hypothesis or narrow --kernel to those")
    extra = []
    for op_name in ops:
        cases = sample_cases(op_name, device.split(":")[0], a.hypothesis, a.seed)
        sub = plan(
            [op_name],
            a.sizes,
            as_list(a.backend) or None,
            as_list(a.dtype) or None,
            device,
            a.seed,
            a.repeats,
            cases={op_name: cases},
        )
        extra += sub.tasks
    return extra
