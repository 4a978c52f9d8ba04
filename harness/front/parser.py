"""The `harness` command line's options: one function per subcommand, each naming the function that runs it
(``fn``). A bad value is one line and exit 2 (harness/front/arguments.py)."""

from __future__ import annotations

import argparse

from ..store.reports import DEFAULT_REPORT_ROOT
from . import check
from .arguments import (
    Parser,
    at_least,
    budget,
    device_arg,
    existing_report,
    fraction,
    growth,
    plugin_arg,
    report_arg,
    seconds,
)
from .commands import cmd_bench, cmd_list, cmd_mutants, cmd_report, cmd_repro
from .minimal import default_seconds
from .run_command import cmd_run

# argparse's object for `harness <cmd>`'s options (add_subparsers' return value, not importable by name)
Subcommands = argparse._SubParsersAction


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="harness", description="Conformance harness for gradient kernels.")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (_run, _list, _report, _mutants, _bench, _check, _repro):  # the order --help lists them in
        add(sub)
    return p


def _common(sp: argparse.ArgumentParser, kernel_default: str | None = None) -> None:
    """The options of the commands that run cells: run, mutants, bench."""
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


def _run(sub: Subcommands) -> None:
    r = sub.add_parser("run", help="run conformance cells and write reports")
    _common(r)
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
    r.add_argument("--shrink-seconds", type=budget, default=default_seconds(), metavar="S",
                   help="seconds to search each failing (operator, backend, dtype)'s smallest failing case, shown "
                        "first in the report (default 60, or $HARNESS_SHRINK_SECONDS; 0: off)")
    r.add_argument("--resume", action="store_true",
                   help="skip cells that already have a result from a run of this code: this commit, or "
                        "another with the same harness, backends, references and cases (a sweep cut short)")
    _compare_options(r)
    r.set_defaults(fn=cmd_run)


def _compare_options(r: argparse.ArgumentParser) -> None:
    """`harness run --compare REF` and how a regression against REF is judged."""
    r.add_argument("--compare", default=None, metavar="REF",
                   help="compare each cell with REF's (a report directory, or a git revision whose committed "
                        "reports are read): a component whose error ratio grew is a REGRESSION (exit 1)")
    r.add_argument("--compare-fail", type=growth, default=1.5, metavar="X",
                   help="growth of a ratio (max or rms) that is a regression (default 1.5)")
    r.add_argument("--compare-require", type=fraction, default=0.9, metavar="F",
                   help="least fraction of the run's cells that must be compared, else exit 2 (default 0.9)")
    r.add_argument("--compare-accept", action="store_true",
                   help="record an intended change: regressions are listed as accepted and do not fail the run")


def _list(sub: Subcommands) -> None:
    ls = sub.add_parser("list", help="operators, backends and whether each can run here")
    ls.add_argument("--device", type=device_arg, default=None)
    ls.add_argument("--plugin", type=plugin_arg, action="append", default=[])
    ls.set_defaults(fn=cmd_list)


def _report(sub: Subcommands) -> None:
    rp = sub.add_parser("report", help="re-render a report folder's markdown/JSON reports and its STATUS.md")
    rp.add_argument("--report", type=report_arg, default=DEFAULT_REPORT_ROOT, metavar="DIR",
                    help=f"the report folder (default: {DEFAULT_REPORT_ROOT}; the project's committed evidence: "
                         "--report reports)")
    rp.add_argument("--plugin", type=plugin_arg, action="append", default=[],
                    help="adapter file or module whose backends' declarations apply when re-judging (repeatable)")
    rp.add_argument("--add", type=existing_report, action="append", default=[], metavar="DIR",
                    help="first merge the cell records of another report folder into --report (repeatable): a "
                         "sweep split over machines, GPUs or CI jobs renders as one report; where both hold a "
                         "cell, the newer run's result wins")
    rp.set_defaults(fn=cmd_report)


def _mutants(sub: Subcommands) -> None:
    m = sub.add_parser("mutants", help="run the bug zoo and report the mutation score")
    _common(m, kernel_default="all")
    m.add_argument("--only", default=None, help="comma-separated mutant ids")
    m.add_argument("--timeout", type=seconds, default=300.0, help="seconds per cell before TIMEOUT")
    m.add_argument("--resume", action="store_true",
                   help="keep the mutants that a run of this code already scored in the report folder (a zoo cut "
                        "short) and run the others")
    m.set_defaults(fn=cmd_mutants)


def _bench(sub: Subcommands) -> None:
    b = sub.add_parser("bench", help="time forward/backward per backend, with rooflines")
    _common(b, kernel_default="all")
    b.add_argument("--backend", default=None)
    b.add_argument("--dtype", default=None)
    b.add_argument("--reps", type=at_least(0), default=0,
                   help="least timed calls per measurement (default 20 on a GPU, 5 elsewhere)")
    b.add_argument("--profile", action="store_true",
                   help="add a per-kernel breakdown of forward+backward (torch.profiler) to the report")
    b.add_argument("--strict", action="store_true",
                   help="exit with status 1 when a declared speed or memory target is missed")
    b.set_defaults(fn=cmd_bench)


def _check(sub: Subcommands) -> None:
    ck = sub.add_parser("check", help="check an adapter on one tiny case per backend, explaining its mistakes")
    check.add_arguments(ck)
    ck.set_defaults(fn=check.run)


def _repro(sub: Subcommands) -> None:
    rr = sub.add_parser("repro", help="replay a saved failure bundle")
    rr.add_argument("bundle", metavar="BUNDLE", help="a bundle's folder (as `harness run` printed it) or its "
                                                     "bundle.json")
    rr.add_argument("--device", type=device_arg, default=None)
    rr.add_argument("--timeout", type=seconds, default=300.0, help="seconds before the replayed cell is a TIMEOUT")
    rr.add_argument("--plugin", type=plugin_arg, action="append", default=[],
                    help="adapter file or module (repeatable)")
    rr.set_defaults(fn=cmd_repro)
