"""The zoo's local-error mutants (Mutant.local_only, issue #44): each one's expectations pass the global
criteria alone (the rule before the local one) and fail under the local rule, on this machine."""

from __future__ import annotations

import dataclasses

import pytest

from harness.judge.judgement import judge_cell
from harness.model import registry
from harness.model.records import CellRecord
from harness.run.plan import plan
from harness.run.single import SingleWorker

LOCAL = [m for m in registry.mutants() if m.local_only]


def _without_local(cell: CellRecord) -> CellRecord:
    return dataclasses.replace(cell, components=[dataclasses.replace(f, local=None) for f in cell.components])


@pytest.mark.parametrize("mutant", [m.id for m in LOCAL])
def test_a_local_mutant_passes_the_global_rule_and_fails_the_local_one(mutant: str):
    m = next(x for x in LOCAL if x.id == mutant)
    b = next(x for x in registry.backends(m.operator) if x.name == m.backend)
    runnable = [e for e in m.expect if "cpu" in b.devices and e.dtype in b.dtypes]
    if not runnable:
        pytest.skip(f"{m.backend} does not run {m.operator} on a CPU")
    worker = SingleWorker("cpu", registry.plugins_loaded(), timeout=600)
    try:
        for exp in runnable:
            tasks = plan([m.operator], "smoke", [f"mutant:{m.id}"], [exp.dtype], "cpu", repeats=1,
                         cases={m.operator: [exp.case]}).tasks
            cell = worker.run_one(tasks[0])
            if cell.status.value == "SKIP":
                continue  # a dtype this backend runs on a GPU only
            assert cell.status.ran, (exp.case.name, cell.status, cell.error)
            globally = judge_cell(_without_local(cell))
            assert globally.shown == "PASS", (exp.case.name, exp.dtype, [c.reason for c in globally.failed_components])
            j = judge_cell(cell)
            failed = {c.name: c for c in j.failed_components}
            assert set(exp.fail) <= set(failed), (exp.case.name, exp.dtype, list(failed))
            assert all(failed[n].verdict.kind == "local" for n in exp.fail)
    finally:
        worker.close()
