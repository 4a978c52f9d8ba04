"""The short commands of `harness`: list, report, mutants, bench, repro; and the checks of --kernel and
--dtype that `harness run` shares with them. `harness run` is harness/front/run_command.py, `harness check`
harness/front/check.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..judge.judgement import unregistered
from ..model import registry
from ..model.devices import checked_device, default_device
from ..model.errors import UsageError
from ..model.registry import REPO_ROOT
from ..model.spec import as_list, dtype_of
from ..render import report
from ..run.session import load_plugins  # one definition, shared with the pytest plugin
from ..store import reports
from ..store.merge import merge_folder
from ..store.reports import DEFAULT_REPORT_ROOT, ensure_harness_dir
from ..tools.bench import run_bench
from ..tools.bench_report import redraw
from ..tools.mutants import run_zoo
from ..tools.status import write_status
from .replay import replay


def operators_of(kernels: list[str]) -> list[str]:
    """--kernel's operators (after the plugins: a plugin's operator counts); an unknown name is a usage error."""
    try:
        return registry.resolve_kernels(kernels)
    except KeyError as e:
        raise UsageError(str(e.args[0]) if e.args else str(e)) from e


def check_dtypes(names: list[str]) -> None:
    """--dtype's names, each a dtype the harness knows; another is a usage error."""
    for d in names:
        try:
            dtype_of(d)
        except ValueError as e:
            raise UsageError(f"--dtype {d!r}: {e}") from e


def cmd_list(a: argparse.Namespace) -> int:
    device = a.device or default_device()
    load_plugins(a.plugin)
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
    load_plugins(a.plugin)
    root = Path(a.report)
    for src in a.add:
        _add_folder(Path(src), root)
    if not root.is_dir():
        raise UsageError(f"--report {a.report}: no such folder; expected a report folder that `harness run` wrote "
                         f"(by default {DEFAULT_REPORT_ROOT} under the current folder)")
    if not any(any(root.glob(g)) for g in ("*/*.jsonl", "*/*.jsonl.gz", "bench-*.json", "*/bench-*.json",
                                            "*/mutants*.json")):
        raise UsageError(f"--report {a.report}: holds no reports (no <device-class>/<operator>.jsonl, no "
                         "bench-<operator>.json); expected a report folder that `harness run` or `harness bench` wrote")
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for op in reports.operators_in(d):
            try:
                reports.compact(d, op)  # only what the report shows: the history lives in git
                out += report.render(d, op)
            except OSError as e:  # a full disk, a read-only folder: the folder given, not a harness bug
                raise UsageError(f"--report {a.report}: cannot write the report in {d}: {e.strerror or e}") from e
    # bench reports: redrawn from their JSON, the targets judged by the operators' current declarations
    for j in sorted(root.glob("bench-*.json")) + sorted(root.glob("*/bench-*.json")):
        md = redraw(j)
        out += [md] if md else []
    status = write_status(root)
    print("rendered: " + ", ".join(str(p) for p in out + [status] if p.suffix == ".md"))
    if unregistered():
        print(f"note: rendered without the declared gaps and contract exceptions of {', '.join(unregistered())}: "
              "not registered here (load the plugin with --plugin, or install the extra that registers it, e.g. "
              "'.[liger]'); render them where it is", file=sys.stderr)
    return 0


def _add_folder(src: Path, root: Path) -> None:
    """``harness report --add SRC``: SRC's records merged into the report folder ``root`` (store/merge.py)."""
    if src.resolve() == root.resolve():
        raise UsageError(f"--add {src}: is the --report folder itself; expected another report folder")
    ensure_harness_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        got = merge_folder(src, root)
    except reports.FolderBusy as e:
        raise UsageError(f"--add {src}: {e}") from e
    except OSError as e:
        raise UsageError(f"--add {src}: cannot merge into {root}: {e.strerror or e}") from e
    what = ", ".join(f"{k} {n} records" for k, n in got.records.items())
    print(f"added {src}: {what}; {len(got.new_runs)} run(s) new to {root}")
    if got.left:
        print(f"  not merged (each is one run's page; copy it where it is the newer): {', '.join(got.left)}")


def cmd_mutants(a: argparse.Namespace) -> int:
    load_plugins(a.plugin)  # a plugin's mutants (and backends) join the zoo
    kernels = as_list(a.kernel) or ["all"]
    operators_of(kernels)
    device = checked_device(a.device)
    ensure_harness_dir(a.report)
    return run_zoo(
        kernels,
        device,
        a.report,
        a.timeout,
        only=as_list(a.only) or None,
        progress=not a.no_progress,
        resume=a.resume,
    )


def cmd_bench(a: argparse.Namespace) -> int:
    load_plugins(a.plugin)
    kernels = as_list(a.kernel) or ["all"]
    ops = operators_of(kernels)
    backends = as_list(a.backend)
    known = {b.name for o in ops for b in registry.backends(o)}
    unknown = [n for n in backends if n not in known]
    if unknown:
        raise UsageError(f"--backend {','.join(unknown)}: no selected operator has such a backend (" + "; ".join(
            f"{o}: {', '.join(sorted(b.name for b in registry.backends(o))) or '(none)'}" for o in ops) + ")")
    check_dtypes(as_list(a.dtype))
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
    load_plugins(a.plugin)
    return replay(a.bundle, a.device, a.timeout)
