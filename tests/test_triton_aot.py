"""Every Triton kernel of every backend compiles ahead of time for sm_90, with no GPU present,
and fits its shared memory (a launch would fail with OutOfResources otherwise).

Targets come from ``backends/<impl>/<operator>/aot.py`` (see harness/triton_aot.py). A kernel that
the GPU compiler rejects (dot shapes, layouts, shared memory, ptxas) fails here in CI. Compiling
needs real @triton.jit functions, so under TRITON_INTERPRET=1 the targets are compiled in one
subprocess with the variable unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from harness.registry import interpreted  # noqa: E402
from harness.triton_aot import compile_target, discover_targets, resource_problem  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS = discover_targets()
IDS = [f"{pkg.split('.', 1)[1]}:{t['name']}" for pkg, t in TARGETS]


@pytest.fixture(scope="module")
def interpreted_results() -> dict[str, str | None]:
    """id -> error (None when it compiled), from a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "harness.triton_aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["id"].split(".", 1)[1]: r["error"] for r in rows}


def test_targets_discovered() -> None:
    assert any(pkg == "backends.triton.mhc_pre" for pkg, _ in TARGETS), "no AOT targets of backends/triton/mhc_pre"


@pytest.mark.parametrize("idx", range(len(TARGETS)), ids=IDS)
def test_compiles_for_sm90(idx: int, request: pytest.FixtureRequest) -> None:
    package, target = TARGETS[idx]
    if interpreted():
        results = request.getfixturevalue("interpreted_results")
        assert IDS[idx] in results, f"{IDS[idx]} was not compiled by the subprocess"
        assert results[IDS[idx]] is None, results[IDS[idx]]
        return
    kernel = compile_target(target)
    assert kernel.asm.get("cubin"), f"{package}:{target['name']}: no cubin produced"
    problem = resource_problem(kernel)
    assert problem is None, f"{package}:{target['name']}: {problem}"
