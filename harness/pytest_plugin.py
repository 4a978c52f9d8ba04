"""pytest wiring: options, hypothesis profiles, and conformance cells as test items.

Thin by design: cells are planned by runner.plan and executed by runner.CellExecutor (a worker
process, so a crashing kernel fails its item, not the session). A test module opts in with::

    from harness.pytest_plugin import test_conformance  # noqa: F401
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from . import registry, runner
from .records import CellRecord
from .spec import as_list

_STATE: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("harness", "gradient-kernel conformance")
    g.addoption("--backend", default=None, help="comma-separated backends to judge (default: all that run here)")
    g.addoption("--kernel", default="all", help="operator id or family alias, comma-separated (default: all)")
    g.addoption("--sizes", default="smoke", help="case preset: smoke, sweep or full (default: smoke)")
    g.addoption("--harness-device", default=None, help="cpu or cuda (default: cuda if present)")
    g.addoption("--harness-dtype", default=None, help="comma-separated dtypes (default: the device's list)")
    g.addoption("--harness-report", default=None, help="also write cells to this report directory")
    g.addoption("--harness-plugin", action="append", default=[], help="adapter file or module (repeatable)")
    g.addoption("--harness-timeout", type=float, default=300.0, help="seconds per cell")
    g.addoption("--harness-bench", action="store_true",
                help="collect pytest-benchmark items: forward+backward of each backend on its operator's "
                     "bench cases (smoke-sized on CPU); keep history with --benchmark-autosave")


def _register_hypothesis_profiles() -> None:
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # pragma: no cover
        return
    # CI: derandomized (replayable), bounded; on demand: --hypothesis-profile=random
    for name, derandomize, examples in (("ci", True, 20), ("random", False, 100)):
        settings.register_profile(name, derandomize=derandomize, max_examples=examples, deadline=None,
                                  print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HARNESS_HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    _register_hypothesis_profiles()
    config.addinivalue_line("markers", "conformance: a harness cell (operator x backend x dtype x case)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Which named backends' items ran: a session whose named backend ran none fails (pytest_sessionfinish)."""
    outcome = yield
    rep = outcome.get_result()
    t = getattr(getattr(item, "callspec", None), "params", {}).get("harness_cell")
    if t is not None and rep.when in ("setup", "call"):
        ran = _STATE.setdefault("ran", {}).setdefault(t.backend, [0, set()])
        if rep.skipped:
            why = str(rep.longrepr[-1]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            ran[1].add(why.removeprefix("Skipped: "))
        elif rep.when == "call":
            ran[0] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A named backend (--backend) that ran no item makes the session fail, with the reasons: a CI job that
    tested nothing must not go green."""
    named = as_list(session.config.getoption("--backend"))
    ran = _STATE.get("ran", {})
    idle = [(b, ran[b][1]) for b in named if b in ran and ran[b][0] == 0]
    if not idle or exitstatus not in (0, pytest.ExitCode.OK):
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    for b, why in idle:
        msg = f"harness: backend {b} ran no item: {'; '.join(sorted(why)) or 'every item was skipped'}"
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(msg, red=True)
    session.exitstatus = 3


def _device(config: pytest.Config) -> str:
    d = config.getoption("--harness-device")
    if d:
        return d
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _gpu_for_xdist_worker() -> int | None:
    """pytest -n <gpus>: worker gwK runs its cells on GPU K (mod the visible count)."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not wid.startswith("gw"):
        return None
    import torch

    n = torch.cuda.device_count()
    return int(wid[2:]) % n if n else None


def _bench_params(cfg: pytest.Config) -> tuple[list, list[str]]:
    """(operator, backend, case, dtype, device) per pytest-benchmark item, as `harness bench` picks them."""
    from .bench import cases_for

    device = _device(cfg)
    gpu = device.startswith("cuda")
    wanted = as_list(cfg.getoption("--backend")) or None
    dtypes = as_list(cfg.getoption("--harness-dtype")) or ["bfloat16" if gpu else "float32"]
    params, ids = [], []
    for op_name in registry.resolve_kernels(as_list(cfg.getoption("--kernel"))):
        op = registry.get_operator(op_name)
        cases = cases_for(op, device)
        for b in registry.backends(op_name):
            if wanted and b.name not in wanted:
                continue
            for case in cases:
                for dt in dtypes:
                    why = b.unavailable(device) or (None if dt in b.dtypes else f"dtype {dt} not supported")
                    marks = [pytest.mark.skip(reason=f"{b.name}: {why}")] if why else []
                    params.append(pytest.param((op_name, b.name, case, dt, device), marks=marks))
                    ids.append(f"{op_name}-{b.name}-{dt}-{case.name}")
    return params, ids


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_bench_cell" in metafunc.fixturenames:
        cfg = metafunc.config
        if not cfg.getoption("--harness-bench"):
            off = pytest.param(None, marks=pytest.mark.skip(reason="benchmarks run with --harness-bench"))
            metafunc.parametrize("harness_bench_cell", [off], ids=["off"])
            return
        for p in cfg.getoption("--harness-plugin"):
            registry.load_plugin(p)
        params, ids = _bench_params(cfg)
        metafunc.parametrize("harness_bench_cell", params, ids=ids)
        return
    if "harness_cell" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    for p in cfg.getoption("--harness-plugin"):
        registry.load_plugin(p)
    backends = as_list(cfg.getoption("--backend")) or None
    plan = runner.plan(
        as_list(cfg.getoption("--kernel")),
        cfg.getoption("--sizes"),
        backends,
        as_list(cfg.getoption("--harness-dtype")) or None,
        _device(cfg),
    )
    params, ids = [], []
    for t in plan.tasks:
        # a declared gap is judged on the cell's figures (its scope and ceiling), not at collection
        params.append(pytest.param(t, marks=[pytest.mark.conformance]))
        ids.append(f"{t.operator}-{t.backend}-{t.dtype}-{t.case.name}")
    metafunc.parametrize("harness_cell", params, ids=ids)


@pytest.fixture(scope="session")
def harness_executor(request: pytest.FixtureRequest):
    cfg = request.config
    ex = runner.CellExecutor(
        _device(cfg), registry.plugins_loaded(), cfg.getoption("--harness-timeout"), gpu=_gpu_for_xdist_worker()
    )
    yield ex
    ex.close()
    w = _STATE.get("writer")
    if w is not None:
        w.render()


def _writer(cfg: pytest.Config, device: str):
    root = cfg.getoption("--harness-report")
    if not root:
        return None
    if "writer" not in _STATE:
        import uuid

        from .provenance import device_class, run_provenance
        from .report import ReportWriter

        header = {**run_provenance(device), "run_id": uuid.uuid4().hex[:10], "command": "pytest (harness plugin)"}
        _STATE["writer"] = ReportWriter(root, device_class(device), header)
    return _STATE["writer"]


def format_failure(cell: CellRecord, device_class: str = "") -> str:
    """The component table, localization, hints and contracts of a judged cell, for a failing item."""
    from .judgement import judge_cell
    from .report import _fmt

    j = judge_cell(cell, device_class=device_class)
    sev = f" ({j.severity})" if j.severity else ""
    lines = [f"{cell.operator} / {cell.backend} / {cell.dtype} / {cell.case.name}: {j.shown}{sev}",
             f"case params: {cell.case.params}"]
    if j.gap is not None:
        lines.append(f"declared gap: {j.declared_text()}")
    if cell.error:
        lines.append(cell.error)
        if cell.traceback:
            lines.append(cell.traceback)
    if j.components:
        lines.append(f"{'component':<14} {'verdict':<7} {'max err':>10} {'floor max':>10} {'ratio max':>9} "
                     f"{'ratio rms':>9} {'cos':>7}  where / why")
        for c in j.components:
            f, v = c.figures, c.verdict
            why = ""
            if v.failed:
                why = (c.where + " " if c.where else "") + f"[{c.reason}]"
                if c.hints and j.shown != "XFAIL":
                    why += f" hint: {c.hint_text()}"
            rms = _fmt(v.ratio_rms) if v.rms_applies else "n/a"
            lines.append(f"{c.name:<14} {v.verdict:<7} {_fmt(f.max_err):>10} {_fmt(f.floor_max):>10} "
                         f"{_fmt(v.ratio_max):>9} {rms:>9} {f.cosine:>7.4f}  {why}")
    for k, x in j.contracts:
        if not k.ok and x is None:
            lines.append(f"contract {k.name} violated: {k.detail}")
    for n in j.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def test_conformance(
    harness_cell: runner.Task, harness_executor: runner.CellExecutor, request: pytest.FixtureRequest
) -> None:
    """One conformance cell; fails with the component table and localization; a failure inside the
    backend's declared gap is an xfail with the gap's reason and figures."""
    from .judgement import judge_cell
    from .provenance import device_class

    t = harness_cell
    if t.skip:
        pytest.skip(f"{t.backend}: {t.skip}")
    cell = harness_executor.run(t)
    w = _writer(request.config, t.device)
    if w is not None:
        w.append(cell)
    j = judge_cell(cell, device_class=device_class(t.device))
    if j.shown == "XFAIL":
        pytest.xfail(f"declared: {j.declared_text()}")
    if j.failing:
        pytest.fail(format_failure(cell, device_class(t.device)), pytrace=False)


def test_benchmark(harness_bench_cell: tuple, benchmark) -> None:
    """pytest-benchmark item: one forward+backward (forward only without gradients) per round, synced.

    In-process (the benchmark fixture times this process), so a crashing kernel ends the session:
    run conformance first. Shapes, dtypes and backends follow `harness bench`.
    """
    from .bench import _sync, bench_calls, cpu_interpret
    from .provenance import device_class
    from .spec import dtype_of

    op_name, backend, case, dtype, device = harness_bench_cell
    cpu_interpret(device)
    calls = bench_calls(registry.get_operator(op_name), registry.get_backend(op_name, backend), case,
                        dtype_of(dtype), device)
    fn = calls["fwd_bwd"] or calls["forward"]

    def once() -> None:
        fn()
        _sync()

    benchmark.extra_info.update(operator=op_name, backend=backend, case=case.name, dtype=dtype,
                                device_class=device_class(device),
                                timed="forward+backward" if calls["fwd_bwd"] else "forward")
    benchmark(once)
    calls["clear"]()
