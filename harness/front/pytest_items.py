"""The harness's pytest items: one conformance cell per item, or one pytest-benchmark measurement.

The pytest plugin (harness/pytest_plugin.py) collects this module by itself, under the node id
``harness``, whenever a harness option is given (``--harness-backend`` / ``--backend``, ``--kernel``,
``--sizes``, ``--plugin``, ...): no test file of the user's has to import anything.
"""

from __future__ import annotations

import pytest

from ..judge.judgement import judge_cell
from ..model import registry  # imported only once a harness option asked for these items
from ..model.spec import dtype_of
from ..render.terminal import format_failure
from ..run.plan import Task
from ..store.provenance import device_class
from ..tools.bench import bench_calls, cpu_interpret
from ..tools.bench_timing import sync_device
from .pytest_run import run_session


def test_conformance(harness_cell: Task, request: pytest.FixtureRequest) -> None:
    """One conformance cell; fails with the component table, the hint and the repro command; a failure
    inside the backend's declared gap is an xfail with the gap's reason and figures."""

    t = harness_cell
    run = run_session(request.config)
    cell = run.run_cell(t)
    if t.skip:
        pytest.skip(f"{t.backend}: {t.skip}")
    j = judge_cell(cell, device_class=run.session.device_class)
    if j.shown == "XFAIL":
        pytest.xfail(f"declared: {j.declared_text()}")
    if j.failing:
        msg = format_failure(cell, run.session.device_class)
        bundle = run.save_repro(cell)
        if bundle is not None:
            msg += f"\nrepro: harness repro {bundle}"
        pytest.fail(msg, pytrace=False)
    cmp = run.compare_cell(cell)
    if cmp is not None and cmp.regressions:
        ref = run.session.reference.label
        pytest.fail(f"{cell.operator} / {cell.backend} / {cell.dtype} / {cell.case.name}: REGRESSION against "
                    f"{ref} (commit {cmp.ref_header.get('commit', '?')}), inside the bound but worse than "
                    f"{run.session.req.compare_fail:g}x:\n" + "\n".join("  " + ch.text() for ch in cmp.regressions),
                    pytrace=False)


def test_benchmark(harness_bench_cell: tuple, benchmark) -> None:
    """pytest-benchmark item: one forward+backward (forward only without gradients) per round, synced.

    In-process (the benchmark fixture times this process), so a crashing kernel ends the session:
    run conformance first. Shapes, dtypes and backends follow `harness bench`.
    """

    op_name, backend, case, dtype, device = harness_bench_cell
    cpu_interpret(device)
    calls = bench_calls(registry.get_operator(op_name), registry.get_backend(op_name, backend), case,
                        dtype_of(dtype), device)
    fn = calls["fwd_bwd"] or calls["forward"]

    def once() -> None:
        fn()
        sync_device()

    benchmark.extra_info.update(operator=op_name, backend=backend, case=case.name, dtype=dtype,
                                device_class=device_class(device),
                                timed="forward+backward" if calls["fwd_bwd"] else "forward")
    benchmark(once)
    calls["clear"]()
