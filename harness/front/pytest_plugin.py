"""pytest wiring: harness options, and conformance cells collected as test items when one is given.

Installed with the distribution (entry point ``pytest11``), so it is active in every pytest run of the
environment; it therefore changes nothing unless asked:

- Options: ``--harness-backend``, ``--harness-kernel``, ``--harness-sizes``, ``--harness-plugin`` (and
  ``--harness-device``, ``--harness-dtype``, ``--harness-report``, ``--harness-timeout``,
  ``--harness-bench``) always exist; the short names ``--backend``, ``--kernel``, ``--sizes`` and
  ``--plugin`` are added too, each only where no other plugin or conftest has taken it.
- Without a harness option nothing is collected and nothing is configured (no Hypothesis profile).
- With one, the plugin collects the conformance items by itself (harness/front/pytest_items.py, node id
  ``harness``) and only those run: ``pytest --backend=mine --plugin my_adapter.py`` works in a folder with
  no harness test file. Paths given explicitly on the command line are still collected.

Cells are planned, recorded and judged by the same run session as `harness run` (harness/run/session.py),
each executed in a worker process (a crashing kernel fails its item, not the session).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

# Nothing of the harness (torch, triton) is imported until a harness option is given: installed, this
# plugin loads in every pytest run of the environment, and must cost an unrelated project nothing.

# canonical option -> the short name the README uses, registered where it is free
SHORT_NAMES = {"--harness-backend": "--backend", "--harness-kernel": "--kernel", "--harness-sizes": "--sizes",
               "--harness-plugin": "--plugin", "--harness-compare": "--compare"}
# options whose presence turns the session into a conformance run (dest names)
HARNESS_OPTIONS = ("harness_backend", "harness_kernel", "harness_sizes", "harness_plugin", "harness_device",
                   "harness_dtype", "harness_report", "harness_bench", "harness_compare")
_STATE: dict[str, Any] = {}


def _option_specs() -> dict[str, dict[str, Any]]:
    return {
        "--harness-backend": dict(dest="harness_backend", default=None,
                                  help="comma-separated backends to judge (default: all that run here)"),
        "--harness-kernel": dict(dest="harness_kernel", default=None,
                                 help="operator id or family alias, comma-separated (default: all)"),
        "--harness-sizes": dict(dest="harness_sizes", default=None,
                                help="case preset: smoke, sweep or full (default: smoke)"),
        "--harness-plugin": dict(dest="harness_plugin", action="append", default=[],
                                 help="adapter file or module (repeatable)"),
        "--harness-compare": dict(dest="harness_compare", default=None, metavar="REF",
                                  help="compare each item's cell with REF's (a report directory or a git revision): "
                                       "a component whose error ratio grew fails the item as a regression"),
    }


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    g = parser.getgroup("harness", "gradient-kernel conformance (any of these collects the conformance items)")
    for name, spec in _option_specs().items():
        g.addoption(name, **spec)
    g.addoption("--harness-device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    g.addoption("--harness-dtype", default=None, help="comma-separated dtypes (default: the device's list)")
    g.addoption("--harness-report", default=None, help="also write cells to this report directory")
    g.addoption("--harness-timeout", type=float, default=300.0, help="seconds per cell")
    g.addoption("--harness-max-hangs", type=int, default=2, metavar="N",
                help="a backend whose items time out N times in a row has its other items reported TIMEOUT "
                     "without running them (default 2; 0: run every item)")
    g.addoption("--harness-compare-fail", type=float, default=1.5, metavar="X",
                help="growth of an error ratio that is a regression (default 1.5)")
    g.addoption("--harness-bench", action="store_true", default=None,
                help="collect pytest-benchmark items instead: forward+backward of each backend on its "
                     "operator's bench cases (smoke-sized on CPU); keep history with --benchmark-autosave")
    _STATE["parser"] = parser
    if _loaded_by_conftest(pluginmanager):
        # loaded through a conftest's pytest_plugins: the conftests that could take a short name are in
        add_short_names(parser)


def _loaded_by_conftest(pm: pytest.PytestPluginManager) -> bool:
    return any(str(getattr(p, "__file__", "") or "").endswith("conftest.py") for p in pm.get_plugins())


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Installed (entry point), the plugin registers before any conftest: the short names are added once the
    initial conftests have added theirs, so that a project defining its own --backend keeps it."""
    before = set(_option_owners(parser))
    result = yield
    add_short_names(parser, by_conftest=set(_option_owners(parser)) - before)
    return result


def _option_owners(parser: pytest.Parser) -> dict[str, str]:
    """Each option name registered so far -> its dest."""
    return {n: str(getattr(opt, "dest", "") or "") for grp in getattr(parser, "_groups", []) for opt in grp.options
            for n in opt.names()}


def add_short_names(parser: pytest.Parser, by_conftest: set[str] | None = None) -> list[str]:
    """Register each short name no other plugin or conftest has taken; returns those added. The names taken
    by others are kept (``_STATE["shadowed"]``, short -> (canonical, who took it)) for the one line that names
    the harness's own option where the harness runs nevertheless (see shadowed_lines). ``by_conftest``: the
    names the initial conftests registered (None where that is unknown)."""
    owners = _option_owners(parser)
    g = parser.getgroup("harness")
    added = []
    shadowed: dict[str, tuple[str, str]] = {}
    for canonical, short in SHORT_NAMES.items():
        spec = {**_option_specs()[canonical], "help": f"same as {canonical}"}
        who = ("a conftest or another plugin" if by_conftest is None else
               "this project's conftest" if short in by_conftest else "another pytest plugin")
        if short in owners:
            if owners[short] != spec["dest"]:  # not the harness's own short name, added by an earlier call
                shadowed[short] = (canonical, who)
            continue
        try:
            g.addoption(short, **spec)
        except (ValueError, argparse.ArgumentError):  # taken where we could not see it
            shadowed[short] = (canonical, "a conftest or another plugin")
            continue
        added.append(short)
    _STATE["shadowed"] = shadowed
    return added


# what a harness run does where the canonical option is not given (for the line of shadowed_lines)
_UNGIVEN = {"--harness-backend": "every backend runs", "--harness-kernel": "every operator runs",
            "--harness-sizes": "the smoke cases run", "--harness-plugin": "no adapter is loaded",
            "--harness-compare": "nothing is compared"}


def shadowed_lines(config: pytest.Config) -> list[str]:
    """One line per short name that a conftest or another plugin took, in a session the harness runs (another
    harness option was given): ``pytest --backend=x --plugin a.py`` in a project with its own --backend hands
    --backend to the project, and the harness runs every backend, without a word otherwise (issue #41)."""
    if not harness_mode(config):
        return []
    lines = []
    for short, (canonical, who) in _STATE.get("shadowed", {}).items():
        value = config.getoption(_option_specs()[canonical]["dest"], None)
        given = (f"given: {', '.join(map(str, value)) if isinstance(value, list) else value}"
                 if value not in (None, []) else f"it was not given: {_UNGIVEN[canonical]}")
        lines.append(f"harness: {short} belongs to {who}; the harness's own option is {canonical} ({given})")
    return lines


def pytest_report_header(config: pytest.Config) -> list[str]:
    return shadowed_lines(config)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The lines of shadowed_lines where no header shows them (-q, --no-header)."""
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None or hasattr(session.config, "workerinput"):
        return
    if getattr(tr, "showheader", False) and not getattr(tr, "no_header", False):
        return  # pytest_report_header put them in the header
    for line in shadowed_lines(session.config):
        tr.write_line(line, yellow=True)


def harness_mode(config: pytest.Config) -> bool:
    """Whether a harness option was given (only then are conformance items collected)."""
    return any(config.getoption(d, None) not in (None, [], False) for d in HARNESS_OPTIONS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a harness cell (operator x backend x dtype x case)")
    if not harness_mode(config) or config.getoption("harness_bench"):
        return
    from . import pytest_run  # the harness itself, only now (see the top of this module)

    pytest_run.start(config, _pytest_names)


def _pytest_names(msg: str) -> str:
    """The session names the CLI's options; under pytest the device and dtype options are --harness-*."""
    return msg.replace("--device", "--harness-device").replace("--dtype", "--harness-dtype")


def pytest_unconfigure(config: pytest.Config) -> None:
    if harness_mode(config):
        from . import pytest_run

        pytest_run.close(config)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With a harness option, only the conformance items run: nothing else is collected from folders."""
    return True if harness_mode(config) else None


class _HarnessModule(pytest.Module):
    """harness/front/pytest_items.py, collected as node ``harness`` whatever the project's collection settings."""

    def istestfunction(self, obj: object, name: str) -> bool:
        return name == ("test_benchmark" if self.config.getoption("harness_bench") else "test_conformance")

    def istestclass(self, obj: object, name: str) -> bool:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not harness_mode(config):
        return
    from . import pytest_items

    mod = _HarnessModule.from_parent(session, path=Path(pytest_items.__file__), name="harness", nodeid="harness")
    mine = [x for x in session.genitems(mod)]
    for item in mine:
        t = getattr(getattr(item, "callspec", None), "params", {}).get("harness_cell")
        if t is not None:
            item.user_properties.append(("harness_backend", t.backend))
    items[:0] = mine


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Which backends' items ran (here or in an xdist worker): a session whose named or plugin backend ran
    none, or in which no item ran at all, fails at the end (pytest_sessionfinish)."""
    backend = dict(report.user_properties).get("harness_backend")
    if backend is None:
        return
    ran = _STATE.setdefault("ran", {}).setdefault(backend, [0, set()])
    if report.skipped and not hasattr(report, "wasxfail"):
        why = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        ran[1].add(why.removeprefix("Skipped: "))
    elif report.when == "call":
        ran[0] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A CI job that tested nothing must not go green: exit 3 with the reasons."""
    if not harness_mode(session.config):
        return
    from . import pytest_run

    run = pytest_run.current(session.config)
    if run is None or exitstatus not in (0, pytest.ExitCode.OK) or hasattr(session.config, "workerinput"):
        return  # an xdist worker saw part of the items: the controller decides
    if run.session.reference is not None and run.session.results:
        error = pytest_run.compare(run)  # kept beside the report (--harness-report); too few compared: exit 4
        if error:
            _STATE["compare_error"] = error
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
    ran = _STATE.get("ran", {})
    if not ran:
        return
    named = [*(run.session.plan.explicit or []), *run.session.plugin_backends()]
    msgs = [f"backend {b} ran no item: {'; '.join(sorted(ran[b][1])) or 'every item was skipped'}"
            for b in dict.fromkeys(named) if b in ran and ran[b][0] == 0]
    if not any(r[0] for r in ran.values()):
        msgs.append("no harness item ran: every item was skipped")
    if msgs:
        _STATE["tested_nothing"] = msgs
        session.exitstatus = 3


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _STATE.get("compare_error"):
        terminalreporter.write_sep("=", "harness: too few cells compared (exit 4)", red=True)
        terminalreporter.write_line(f"harness: {_STATE['compare_error']}", red=True)
    msgs = _STATE.get("tested_nothing")
    if msgs:
        terminalreporter.write_sep("=", "harness: tested too little (exit 3)", red=True)
        for m in msgs:
            terminalreporter.write_line(f"harness: {m}", red=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    cfg = metafunc.config
    if "harness_bench_cell" in metafunc.fixturenames:
        from . import pytest_run

        params, ids = pytest_run.bench_params(cfg)
        metafunc.parametrize("harness_bench_cell", params, ids=ids)
    elif "harness_cell" in metafunc.fixturenames:
        from . import pytest_run

        plan = pytest_run.run_session(cfg).session.plan
        # a declared gap is judged on the cell's figures (its scope and ceiling), not at collection
        params = [pytest.param(t, marks=[pytest.mark.conformance]) for t in plan.tasks]
        ids = [f"{t.operator}-{t.backend}-{t.dtype}-{t.case.name}" for t in plan.tasks]
        metafunc.parametrize("harness_cell", params, ids=ids)
