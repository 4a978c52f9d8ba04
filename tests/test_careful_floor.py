"""Careful floors (issue #44): the float32 floor of the cross-entropy losses computes each row's loss with log1p, as
a careful kernel does (references/softmax_xent.py, careful_cross_entropy). Under the floor it replaced, which formed
it as logsumexp - z_y, a kernel taking log(1 + r) for log1p(r) passed; under the careful one it fails, and the
unmutated Triton kernel, which carries r apart from the max entry's 1, passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# in a process of its own: Triton interpreted (TRITON_INTERPRET before triton is imported), the floor patched there
SCRIPT = """
import json, sys
import torch
from harness.judge.judgement import judge_cell
from harness.measure.cell import run_cell
from harness.model import registry
from harness.model.mutant_builds import mutant_backend

registry.discover()
op = registry.get_operator("fused_linear_xent")
mutant = next(m for m in registry.mutants("fused_linear_xent") if m.id == "xent-log-not-log1p")
if sys.argv[1] == "naive":  # the floor before the careful one (45de1a3): logsumexp - (1-eps) z_y - (eps/V) sum z
    def naive(z, z_y, eps):
        return torch.logsumexp(z, dim=1) - (1.0 - eps) * z_y - (eps / z.shape[1]) * z.sum(dim=1)
    op_ref = registry.get_operator("softmax_xent").reference
    op_ref.__globals__["careful_cross_entropy"] = naive
out = {}
for b in (mutant_backend(mutant.id), registry.get_backend("fused_linear_xent", "triton")):
    cell = run_cell(op, b, mutant.expect[0].case, "float32", "cpu", repeats=1)
    out[b.name] = next(c for c in judge_cell(cell).components if c.name == "loss").verdict.verdict
print(json.dumps(out))
"""


def _loss_verdicts(floor: str) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", SCRIPT, floor], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_log_for_log1p_passes_the_naive_floor_and_fails_the_careful_one_where_the_kernel_passes():
    naive, careful = _loss_verdicts("naive"), _loss_verdicts("careful")
    assert naive == {"mutant:xent-log-not-log1p": "PASS", "triton": "PASS"}
    assert careful == {"mutant:xent-log-not-log1p": "FAIL", "triton": "PASS"}
