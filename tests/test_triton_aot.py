"""Every Triton kernel of every backend compiles ahead of time for sm_90, with no GPU present,
and fits its shared memory (a launch would fail with OutOfResources otherwise).

Targets come from ``backends/<impl>/<operator>/aot.py`` (see harness/tools/triton_aot.py). A kernel that
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

from harness.model.registry import interpreted  # noqa: E402
from harness.tools.triton_aot import compile_target, discover_targets, resource_problem  # noqa: E402

# one xdist worker runs this module (pytest --dist loadgroup): its compiles and fixtures once
pytestmark = pytest.mark.xdist_group("compile-triton-aot")

ROOT = Path(__file__).resolve().parent.parent
TARGETS = discover_targets()
IDS = [f"{pkg.split('.', 1)[1]}:{t['name']}" for pkg, t in TARGETS]


@pytest.fixture(scope="module")
def interpreted_results() -> dict[str, str | None]:
    """id -> error (None when it compiled), from a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "harness.tools.triton_aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["id"].split(".", 1)[1]: r["error"] for r in rows}


def test_targets_discovered() -> None:
    assert any(pkg == "harness.backends.triton.mhc_pre" for pkg, _ in TARGETS), "no AOT target in triton/mhc_pre"


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


FINGERPRINT_SCRIPT = """
import importlib.util, json, sys
from harness.tools.triton_aot import code_fingerprint, compile_target
out = {}
for name, path in json.loads(sys.argv[1]).items():
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    target = {"name": name, "kernel": mod._scale, "signature": {"x_ptr": "*fp32", "n": "i32", "B": "constexpr"},
              "constexprs": {"B": 64}}
    out[name] = code_fingerprint(compile_target(target))
print(json.dumps(out))
"""
KERNEL_SOURCE = """import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, n, B: tl.constexpr):
    i = tl.arange(0, B)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)
"""


def _no_interpret_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_code_fingerprint_ignores_moved_lines_not_changed_code(tmp_path: Path) -> None:
    helper = KERNEL_SOURCE.replace("tl.load(x_ptr + i, mask=i < n) * 2.0", "_twice(tl.load(x_ptr + i, mask=i < n))")
    helper = helper.replace("@triton.jit\ndef _scale", "@triton.jit\ndef _twice(v):\n    return v * 2.0\n\n\n"
                            "@triton.jit\ndef _scale")
    sources = {"base": KERNEL_SOURCE, "moved": "# two lines above it now\n\n" + KERNEL_SOURCE, "helper": helper,
               "changed": KERNEL_SOURCE.replace("* 2.0", "* 3.0")}
    paths = {}
    for name, text in sources.items():
        paths[name] = str(tmp_path / f"fp_{name}.py")
        Path(paths[name]).write_text(text)
    proc = subprocess.run([sys.executable, "-c", FINGERPRINT_SCRIPT, json.dumps(paths)], cwd=ROOT,
                          env=_no_interpret_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fp = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fp["base"] == fp["moved"], "moving source lines changed the fingerprint"
    assert fp["base"] == fp["helper"], "moving an expression into an inlined helper changed the fingerprint"
    assert fp["base"]["ptx_sha1"] != fp["changed"]["ptx_sha1"], "a changed constant kept the fingerprint"


def test_compare_exits_1_where_code_differs(tmp_path: Path) -> None:
    target = "lazy_attention:reduce"
    prints = tmp_path / "fp.json"
    run = [sys.executable, "-m", "harness.tools.triton_aot", target]
    first = subprocess.run(run + ["--fingerprints", str(prints)], cwd=ROOT, env=_no_interpret_env(),
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    same = subprocess.run(run + ["--compare", str(prints)], cwd=ROOT, env=_no_interpret_env(),
                          capture_output=True, text=True, timeout=600)
    assert same.returncode == 0 and '"code": "same"' in same.stdout, same.stdout + same.stderr[-2000:]
    doctored = {k: {**v, "ptx_sha1": "0" * 16} for k, v in json.loads(prints.read_text()).items()}
    prints.write_text(json.dumps(doctored))
    differs = subprocess.run(run + ["--compare", str(prints)], cwd=ROOT, env=_no_interpret_env(),
                             capture_output=True, text=True, timeout=600)
    assert differs.returncode == 1 and '"code": "changed"' in differs.stdout, differs.stdout
