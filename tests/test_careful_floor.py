"""Careful floors (issue #44): the float32 floor of the cross-entropy losses computes each row's loss with log1p, as
a careful kernel does (references/softmax_xent.py, careful_cross_entropy). Under the floor it replaced, which formed
it as logsumexp - z_y, a kernel taking log(1 + r) for log1p(r) passed; under the careful one it fails, and the
unmutated Triton kernel, which carries r apart from the max entry's 1, passes."""

from __future__ import annotations

import pytest
import torch

from harness.judge.judgement import judge_cell
from harness.measure import oracle
from harness.measure.cell import run_cell
from harness.model import registry
from harness.model.mutant_builds import mutant_backend
from harness.model.records import CellRecord

OP = registry.get_operator("fused_linear_xent")
MUTANT = next(m for m in registry.mutants("fused_linear_xent") if m.id == "xent-log-not-log1p")
CASE = MUTANT.expect[0].case


def _naive(z: torch.Tensor, z_y: torch.Tensor, eps: float) -> torch.Tensor:
    """The floor's loss before the careful one (45de1a3): logsumexp - (1-eps) z_y - (eps/V) sum z, as formed."""
    return torch.logsumexp(z, dim=1) - (1.0 - eps) * z_y - (eps / z.shape[1]) * z.sum(dim=1)


def _loss_verdict(backend: registry.Backend) -> str:
    oracle.clear_cache()
    cell: CellRecord = run_cell(OP, backend, CASE, "float32", "cpu", repeats=1)
    assert cell.status.ran, (cell.status, cell.error)
    return next(c for c in judge_cell(cell).components if c.name == "loss").verdict.verdict


@pytest.fixture
def naive_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = registry.get_operator("softmax_xent").reference
    monkeypatch.setitem(ref.__globals__, "careful_cross_entropy", _naive)
    yield
    oracle.clear_cache()


def test_log_for_log1p_passes_the_naive_floor(naive_floor: None):
    assert _loss_verdict(mutant_backend(MUTANT.id)) == "PASS"


def test_log_for_log1p_fails_the_careful_floor_and_the_kernel_passes_it():
    assert _loss_verdict(mutant_backend(MUTANT.id)) == "FAIL"
    assert _loss_verdict(registry.get_backend("fused_linear_xent", "triton")) == "PASS"
