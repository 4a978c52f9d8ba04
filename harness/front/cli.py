"""`harness` command line: run, list, report, mutants, bench, repro, check."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from ..judge.judgement import judge_cell
from ..model import registry
from ..model.devices import checked_device, default_device, parsed_device
from ..model.errors import CannotRunHere, UsageError
from ..model.records import CellRecord
from ..model.registry import REPO_ROOT
from ..model.spec import as_list, dtype_of
from ..model.strategies import sample_cases, shrink_failure
from ..render import report, terminal
from ..run import runner
from ..run.hangs import HangGuard
from ..run.ray_executor import RayExecutor
from ..run.runner import CellExecutor, per_worker_counts, plan
from ..run.session import LocalPool, RunRequest, RunSession, load_plugins
from ..store import reports
from ..store.reports import DEFAULT_REPORT_ROOT, HARNESS_DIR, ensure_harness_dir
from ..tools.bench import redraw, run_bench
from ..tools.mutants import run_zoo
from ..tools.status import write_status
from . import check
from .arguments import Parser, at_least, device_arg, fraction, growth, plugin_arg, report_arg, seconds
from .replay import replay

log = logging.getLogger("harness")


# one definition of each, shared with the pytest plugin (harness/run/session.py)
_load_plugins = load_plugins

EX_SOFTWARE = 70  # an exception the harness did not expect: a bug in it (sysexits.h), one line and a trace file


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="cell", dynamic_ncols=True, file=sys.stderr)


def _resume(tasks: list, dir_: Path, commit: str) -> tuple[list, list[str]]:
    """The tasks without a result from a run at this commit in ``dir_``, and the ids of those runs."""

    if not commit or commit == "unknown" or commit.endswith("+dirty"):
        raise UsageError(f"--resume: the checkout is at {commit!r}; results can only be reused from a clean "
                         "commit (commit the change, or set HARNESS_COMMIT where the tree has no .git)")
    done: set[tuple] = set()
    used: set[str] = set()
    for op in sorted({t.operator for t in tasks}):
        cells, runs = reports.load(dir_, op)
        for c in cells:
            # a cell not run because its backend hung before is no result: a resumed run tries it
            if runs.get(c.run_id or "", {}).get("commit") == commit and not HangGuard.is_stand_in(c):
                done.add(c.key)
                used.add(c.run_id or "")
    left = []
    for t in tasks:
        case = json.loads(json.dumps(t.case.to_json(), default=str))  # as the report stores it
        key = (t.backend, t.dtype, case["name"], json.dumps(case["params"], sort_keys=True),
               case.get("microbatches", 0))
        if key not in done:
            left.append(t)
    print(f"--resume: {len(tasks) - len(left)} of {len(tasks)} cells already have a result at commit {commit}; "
          f"running {len(left)}")
    return left, sorted(used)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a CI job's stop, `kill`), raised in the main thread and handled as Ctrl-C is:
    workers stopped, the report of what completed, the --resume command; exit 128+15."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _sigterm_as_interrupt():
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


def cmd_run(a: argparse.Namespace) -> int:

    _load_plugins(a.plugin)  # first: a plugin's operators count among --kernel's names and have presets
    if not as_list(a.kernel):
        raise UsageError(f"--kernel {a.kernel!r}: expected an operator id, a family (e.g. mhc) or 'all'")
    for op_name in _operators(as_list(a.kernel)):
        presets = registry.get_operator(op_name).presets
        if a.sizes not in presets:
            raise UsageError(f"--sizes {a.sizes!r}: operator {op_name} has the presets {', '.join(presets)}")
    req = RunRequest(as_list(a.kernel), a.sizes, as_list(a.backend) or None, as_list(a.dtype) or None, a.device,
                     list(a.plugin), a.seed, a.repeats, a.case, a.report,
                     command="harness " + " ".join(shlex.quote(x) for x in sys.argv[1:]), compare=a.compare,
                     compare_fail=a.compare_fail, compare_require=a.compare_require, compare_accept=a.compare_accept)
    extra = (lambda _plan, device: _hypothesis_tasks(a, device)) if a.hypothesis else None
    pool: Any = None
    if a.executor == "ray":
        # the cluster first: its machines, not this one, have the device the cells run on (a driver without
        # a GPU runs a GPU sweep), and they name the report's device class

        pool = RayExecutor(list(a.plugin), parsed_device(a.device), a.ray_address, a.timeout, a.workers,
                           max_hangs=a.max_hangs)
        req.device, req.elsewhere = pool.device, pool.describe()
    try:
        session = RunSession(req, extra_tasks=extra)
        plan, header, device = session.plan, session.header, session.device
        if a.resume:
            plan.tasks, header["resumes"] = _resume(plan.tasks, session.report_dir, header["commit"])
            if not plan.tasks:
                print(f"--resume: every planned cell already has a result at commit {header['commit']}; "
                      "nothing to run")
                return 0
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    try:
        ensure_harness_dir(a.report)
        recorded = _recorded(a.report, device, session.device_class, plan.tasks)
        if pool is None:
            pool = LocalPool(registry.plugins_loaded(), a.workers, a.timeout, **recorded, max_hangs=a.max_hangs)
        else:
            pool.durations.update(recorded["durations"])
            pool.peaks.update(recorded["peaks"])
        session.begin()  # refused where another run holds the report folder: the Ray pool must not leak
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    bar = _progress(len(plan.tasks), not a.no_progress)
    t0 = time.time()

    def on_cell(cell: CellRecord) -> None:
        if bar is not None:
            bar.set_postfix_str(f"{cell.operator}/{cell.backend}/{cell.dtype} {cell.status.value}")
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
    try:
        comparison, too_few = session.compare(), None  # before rendering: the report shows it
    except UsageError as e:  # too few cells compared: the report is still written, then exit 2
        comparison, too_few = session.comparison, e
    t_render = time.time()
    paths = session.render()
    pool.stats["render_s"] = time.time() - t_render
    results = session.results
    print(terminal.terminal_summary(results, session.device_class))
    counts = per_worker_counts(results)
    if len(counts) > 1 or device.startswith("cuda"):
        print("cells per worker: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(
        f"{len(results)} cells in {time.time() - t0:.1f} s; reports: "
        + ", ".join(str(p) for p in paths if p.suffix == ".md")
    )
    print("where the time went: " + time_breakdown(pool.stats))
    busiest = busiest_backends(results)
    if busiest:
        print("cell-seconds by backend (first call / again): " + busiest)
    _save_repros(session)
    if comparison is not None:
        print(comparison_summary(comparison))
    if too_few is not None:
        raise too_few
    code = session.exit_code()
    if code == 3:
        for why in session.not_run():
            print(f"harness run: tested nothing here: {why}", file=sys.stderr)
    return code


def _recorded(root: str, device: str, dev_class: str, tasks: list) -> dict[str, dict]:
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


def comparison_summary(comparison) -> str:
    """The comparison with REF for the terminal: counts, then each regression with both ratios."""
    lines = [comparison.counts_line()]
    for c in comparison.regressed:
        what = "; ".join(ch.text() for ch in c.regressions)
        tag = "accepted" if comparison.accepted else "REGRESSION"
        lines.append(f"  {tag} {c.cell.operator}/{c.cell.backend}/{c.cell.dtype}/{c.cell.case.name}: {what} "
                     f"(REF commit {c.ref_header.get('commit', '?')})")
    for c in comparison.cells:
        if c.newly_failing:
            lines.append(f"  passed in REF, fails now: {c.cell.operator}/{c.cell.backend}/{c.cell.dtype}/"
                         f"{c.cell.case.name}")
    return "\n".join(lines)


def time_breakdown(stats: dict[str, float]) -> str:
    """One line from runner.run's stats: when the workers were ready, the cells done, the report drawn."""
    parts = []
    if "ready_s" in stats:
        parts.append(f"workers ready by {stats['ready_s']:.1f} s")
    if "cells_s" in stats:
        parts.append(f"shared cells done at {stats['cells_s']:.1f} s")
    if stats.get("alone_cells"):
        parts.append(f"{stats['alone_cells']:.0f} cell(s) rerun alone in {stats['alone_s']:.1f} s")
    parts.append(f"report rendered in {stats.get('render_s', 0.0):.1f} s")
    return "; ".join(parts)


def busiest_backends(results: list[CellRecord], top: int = 5) -> str:
    """The backends whose cells took longest in all (compilation included): what to look at when a sweep
    is slow. Where the cells timed both calls of the backend (the determinism check calls it twice),
    their sums follow in parentheses, first call / the same call again: the difference is mostly
    compilation (a cold 2xH100 sweep was bound by the CPU cores that compile, see reports/multi-gpu.md)."""
    total: dict[str, list[float]] = {}
    for c in results:
        if isinstance(c.duration_s, (int, float)):
            t = total.setdefault(f"{c.operator}/{c.backend}", [0.0, 0.0, 0.0, 0])
            t[0] += c.duration_s
            if isinstance(c.backend_again_s, (int, float)):
                t[1] += c.backend_s or 0.0
                t[2] += c.backend_again_s
                t[3] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return ", ".join(f"{k} {v[0]:.0f} s" + (f" ({v[1]:.0f} / {v[2]:.0f})" if v[3] else "") for k, v in ranked)


def _save_repros(session: RunSession) -> None:
    """A bundle per failing cell; failing hypothesis-drawn cells are first shrunk to a minimal case."""

    # a cell not run because its backend hung before has nothing to replay: the cells that hung have bundles
    bad = [c for c in session.results if judge_cell(c, device_class=session.device_class).failing
           and not HangGuard.is_stand_in(c)]
    shrunk: set[tuple] = set()
    for c in bad[:20]:
        key = (c.operator, c.backend, c.dtype)
        if "hypothesis" in c.case.tags and key not in shrunk:
            shrunk.add(key)
            c = _shrink(c, session.device) or c
        print(f"repro: harness repro {session.save_repro(c)}")


def _shrink(cell: CellRecord, device: str) -> CellRecord | None:

    ex = CellExecutor(device, registry.plugins_loaded(), timeout=120)
    last: dict = {}

    def fails(case) -> bool:
        t = plan([cell.operator], "smoke", [cell.backend], [cell.dtype], device, cases={cell.operator: [case]}).tasks[0]
        got = ex.run(t)
        if got.status.value not in ("PASS", "SKIP"):
            last["cell"] = got
            return True
        return False

    try:
        case = shrink_failure(cell.operator, device.split(":")[0], fails)
    finally:
        ex.close()
    if case is not None and "cell" in last:
        print(f"shrunk {cell.case.name} to {case.name}")
        return last["cell"]
    return None


def _hypothesis_tasks(a: argparse.Namespace, device: str) -> list:

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
        sub = runner.plan(
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


def cmd_list(a: argparse.Namespace) -> int:
    device = a.device or default_device()
    _load_plugins(a.plugin)
    ops = registry.operators()
    for name, op in sorted(ops.items()):
        fam = f" (family: {', '.join(op.aliases)})" if op.aliases else ""
        print(f"{name}{fam}: {op.doc}")
        page = REPO_ROOT / "docs" / "specs" / f"{name}.md"
        if page.exists():  # an in-tree operator's spec page (a plugin's operator documents itself)
            print(f"  spec: docs/specs/{name}.md")
        print(f"  components: {', '.join(c.name for c in op.components)}")
        print(
            f"  presets: {', '.join(op.presets)}; dtypes on {device.split(':')[0]}: "
            f"{', '.join(op.dtypes.get(device.split(':')[0], ()))}"
        )
        for b in sorted(registry.backends(name), key=lambda b: b.name):
            why = b.unavailable(device)
            state = "runs here" if not why else f"SKIP: {why}"
            role = "" if b.role == "kernel" else f" [{b.role}]"
            print(f"  - {b.name:<14}{role} {state}; {b.origin}" + (f"; {b.description}" if b.description else ""))
    zoo = registry.mutants()
    if zoo:
        print(f"bug zoo: {len(zoo)} mutants ({', '.join(m.id for m in zoo)})")
    return 0


def cmd_report(a: argparse.Namespace) -> int:

    _load_plugins(a.plugin)
    root = Path(a.report)
    if not root.is_dir():
        raise UsageError(f"--report {a.report}: no such folder; expected a report folder that `harness run` wrote "
                         f"(by default {DEFAULT_REPORT_ROOT} under the current folder)")
    if not any(any(root.glob(g)) for g in ("*/*.jsonl", "bench-*.json", "*/bench-*.json", "*/mutants*.json")):
        raise UsageError(f"--report {a.report}: holds no reports (no <device-class>/<operator>.jsonl, no "
                         "bench-<operator>.json); expected a report folder that `harness run` or `harness bench` wrote")
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for j in sorted(d.glob("*.jsonl")):
            try:
                reports.compact(d, j.stem)  # only what the report shows: the history lives in git
                out += report.render(d, j.stem)
            except OSError as e:  # a full disk, a read-only folder: the folder given, not a harness bug
                raise UsageError(f"--report {a.report}: cannot write the report in {d}: {e.strerror or e}") from e
    # bench reports: redrawn from their JSON, the targets judged by the operators' current declarations
    for j in sorted(root.glob("bench-*.json")) + sorted(root.glob("*/bench-*.json")):
        md = redraw(j)
        out += [md] if md else []
    status = write_status(root)
    print("rendered: " + ", ".join(str(p) for p in out + [status] if p.suffix == ".md"))
    return 0


def cmd_mutants(a: argparse.Namespace) -> int:

    _load_plugins(a.plugin)  # a plugin's mutants (and backends) join the zoo
    kernels = as_list(a.kernel) or ["all"]
    _operators(kernels)
    device = checked_device(a.device)
    ensure_harness_dir(a.report)
    return run_zoo(
        kernels,
        device,
        a.report,
        a.timeout,
        only=as_list(a.only) or None,
        progress=not a.no_progress,
    )


def cmd_bench(a: argparse.Namespace) -> int:

    _load_plugins(a.plugin)
    kernels = as_list(a.kernel) or ["all"]
    ops = _operators(kernels)
    backends = as_list(a.backend)
    known = {b.name for o in ops for b in registry.backends(o)}
    unknown = [n for n in backends if n not in known]
    if unknown:
        raise UsageError(f"--backend {','.join(unknown)}: no selected operator has such a backend (" + "; ".join(
            f"{o}: {', '.join(sorted(b.name for b in registry.backends(o))) or '(none)'}" for o in ops) + ")")
    _dtypes(as_list(a.dtype))
    device = checked_device(a.device)
    ensure_harness_dir(a.report)
    return run_bench(
        kernels,
        backends or None,
        device,
        a.report,
        as_list(a.dtype) or None,
        a.reps,
        profile=a.profile,
        strict=a.strict,
    )


def cmd_repro(a: argparse.Namespace) -> int:

    _load_plugins(a.plugin)
    return replay(a.bundle, a.device, a.timeout)


def _operators(kernels: list[str]) -> list[str]:
    """--kernel's operators (after the plugins: a plugin's operator counts); an unknown name is a usage error."""
    try:
        return registry.resolve_kernels(kernels)
    except KeyError as e:
        raise UsageError(str(e.args[0]) if e.args else str(e)) from e


def _dtypes(names: list[str]) -> None:

    for d in names:
        try:
            dtype_of(d)
        except ValueError as e:
            raise UsageError(f"--dtype {d!r}: {e}") from e


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="harness", description="Conformance harness for gradient kernels.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser, kernel_default: str | None = None) -> None:
        sp.add_argument(
            "--kernel",
            default=kernel_default,
            required=kernel_default is None,
            help="operator id, family alias (e.g. mhc) or 'all'; comma-separated",
        )
        sp.add_argument(
            "--device", type=device_arg, default=None,
            help="cpu, cuda (all visible GPUs) or cuda:N; default: cuda if present"
        )
        sp.add_argument("--plugin", type=plugin_arg, action="append", default=[],
                        help="adapter file or module (repeatable)")
        sp.add_argument("--report", type=report_arg, default=DEFAULT_REPORT_ROOT, metavar="DIR",
                        help=f"report folder (default: {DEFAULT_REPORT_ROOT} under the current folder, which git "
                             "ignores; the project's committed evidence: --report reports)")
        sp.add_argument("--no-progress", action="store_true")

    r = sub.add_parser("run", help="run conformance cells and write reports")
    common(r)
    r.add_argument("--sizes", default="smoke", help="preset: smoke, sweep or full")
    r.add_argument("--backend", default=None, help="comma-separated backend names (default: all)")
    r.add_argument("--dtype", default=None, help="comma-separated dtypes (default: the device's list)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--case", default=None, help="only cases whose name contains this")
    r.add_argument("--timeout", type=seconds, default=300.0, help="seconds per cell before TIMEOUT")
    r.add_argument("--max-hangs", type=at_least(0), default=2, metavar="N",
                   help="a backend that times out on N cells in a row has its other cells reported as TIMEOUT "
                        "(\"not run: the backend hung twice\") without running them (default 2; 0: run every cell)")
    r.add_argument("--workers", type=at_least(1), default=None,
                   help="worker processes (default: GPUs, or 2 on CPU); with --executor ray: the most cell groups "
                        "sharing one GPU (default 1)")
    r.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine (default); ray: each cell group a task on a Ray "
                        "cluster (the extra gradient-harness[ray]; docs/ray.md)")
    r.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --executor ray: the cluster (default: $RAY_ADDRESS, else a cluster running on this "
                        "machine, else a local Ray started for the run)")
    r.add_argument("--repeats", type=at_least(1), default=2, help="backend runs per cell (2 checks determinism)")
    r.add_argument("--hypothesis", type=at_least(0), default=0, metavar="N",
                   help="also run N hypothesis-drawn cases (operators that declare a strategy)")
    r.add_argument("--resume", action="store_true",
                   help="skip cells that already have a result from a run at this commit (a sweep cut short)")
    r.add_argument("--compare", default=None, metavar="REF",
                   help="compare each cell with REF's (a report directory, or a git revision whose committed "
                        "reports are read): a component whose error ratio grew is a REGRESSION (exit 1)")
    r.add_argument("--compare-fail", type=growth, default=1.5, metavar="X",
                   help="growth of a ratio (max or rms) that is a regression (default 1.5)")
    r.add_argument("--compare-require", type=fraction, default=0.9, metavar="F",
                   help="least fraction of the run's cells that must be compared, else exit 2 (default 0.9)")
    r.add_argument("--compare-accept", action="store_true",
                   help="record an intended change: regressions are listed as accepted and do not fail the run")
    r.set_defaults(fn=cmd_run)

    ls = sub.add_parser("list", help="operators, backends and whether each can run here")
    ls.add_argument("--device", type=device_arg, default=None)
    ls.add_argument("--plugin", type=plugin_arg, action="append", default=[])
    ls.set_defaults(fn=cmd_list)

    rp = sub.add_parser("report", help="re-render a report folder's markdown/JSON reports and its STATUS.md")
    rp.add_argument("--report", type=report_arg, default=DEFAULT_REPORT_ROOT, metavar="DIR",
                    help=f"the report folder (default: {DEFAULT_REPORT_ROOT}; the project's committed evidence: "
                         "--report reports)")
    rp.add_argument("--plugin", type=plugin_arg, action="append", default=[],
                    help="adapter file or module whose backends' declarations apply when re-judging (repeatable)")
    rp.set_defaults(fn=cmd_report)

    m = sub.add_parser("mutants", help="run the bug zoo and report the mutation score")
    common(m, kernel_default="all")
    m.add_argument("--only", default=None, help="comma-separated mutant ids")
    m.add_argument("--timeout", type=seconds, default=300.0, help="seconds per cell before TIMEOUT")
    m.set_defaults(fn=cmd_mutants)

    b = sub.add_parser("bench", help="time forward/backward per backend, with rooflines")
    common(b, kernel_default="all")
    b.add_argument("--backend", default=None)
    b.add_argument("--dtype", default=None)
    b.add_argument("--reps", type=at_least(0), default=0,
                   help="least timed calls per measurement (default 20 on a GPU, 5 elsewhere)")
    b.add_argument("--profile", action="store_true",
                   help="add a per-kernel breakdown of forward+backward (torch.profiler) to the report")
    b.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a declared speed or memory target is missed")
    b.set_defaults(fn=cmd_bench)


    ck = sub.add_parser("check", help="check an adapter on one tiny case per backend, explaining its mistakes")
    check.add_arguments(ck)
    ck.set_defaults(fn=check.run)

    rr = sub.add_parser("repro", help="replay a saved failure bundle")
    rr.add_argument("bundle", metavar="BUNDLE", help="a bundle's folder (as `harness run` printed it) or its "
                                                     "bundle.json")
    rr.add_argument("--device", type=device_arg, default=None)
    rr.add_argument("--timeout", type=seconds, default=300.0, help="seconds before the replayed cell is a TIMEOUT")
    rr.add_argument("--plugin", type=plugin_arg, action="append", default=[],
                    help="adapter file or module (repeatable)")
    rr.set_defaults(fn=cmd_repro)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(a.fn(a))
    except UsageError as e:
        print(f"harness {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except CannotRunHere as e:
        print(f"harness {a.cmd}: {e}", file=sys.stderr)
        return 3
    except Exception as e:  # noqa: BLE001 - a bug of the harness (KeyboardInterrupt, SystemExit pass through)
        return internal_error(a.cmd, e, sys.argv[1:] if argv is None else argv)


def internal_error(cmd: str, e: BaseException, argv: list[str] | None = None) -> int:
    """One line on stderr naming the exception and the file that holds its full trace; exit 70."""
    trace = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    command = " ".join(shlex.quote(x) for x in ["harness", *(argv if argv is not None else [cmd])])
    text = (f"harness {cmd}: internal error (a bug in the harness, not in the kernel under test)\n"
            f"command: {command}\ntime: {datetime.now().isoformat(timespec='seconds')}\n\n{trace}")
    path = _write_trace(text)
    msg = " ".join(str(e).split())
    msg = msg if len(msg) <= 300 else msg[:297] + "..."
    what = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    where = f"full trace in {path}" if path else "the full trace could not be written to a file"
    print(f"harness {cmd}: internal error: {what} ({where})", file=sys.stderr)
    return EX_SOFTWARE


def _write_trace(text: str) -> Path | None:
    """``.harness/internal-error-<timestamp>.txt`` under the current folder, else in the temporary folder."""
    name = f"internal-error-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}.txt"
    for folder in (Path(HARNESS_DIR), Path(tempfile.gettempdir())):
        try:
            folder = folder.absolute()  # the current folder may be gone: then the temporary one
            ensure_harness_dir(folder)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
            return folder / name
        except OSError:
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())
