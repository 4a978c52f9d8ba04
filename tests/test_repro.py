"""Property-based search: a failing drawn case is shrunk to its minimal failing case (harness/front/minimal.py),
saved as a bundle, and replays in one command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hypothesis_failure_is_shrunk_saved_and_replayed(tmp_path: Path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--kernel",
            "mhc",
            "--case",
            "no-such-case",
            "--hypothesis",
            "8",
            "--backend",
            "lastblock",
            "--plugin",
            "tests/plugins/mhc_lastblock.py",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--report",
            str(tmp_path),
            "--no-progress",
            "--shrink-seconds",
            "120",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    bundles = re.findall(r"minimal failing case: mhc_pre/lastblock/float32: .* harness repro (\S+)", r.stdout)
    assert bundles, r.stdout
    b = json.loads((Path(bundles[0]) / "bundle.json").read_text())
    p = b["case"]["params"]
    # minimal: just past one block of nD, and a single token
    assert 64 < p["n"] * p["D"] <= 128 and p["S"] == 1, p
    assert "dx" in b["failing"]
    again = subprocess.run(
        [sys.executable, "-m", "harness", "repro", bundles[0]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert "dx" in again.stdout and "FAIL" in again.stdout and "nD" in again.stdout


def test_failing_cell_carries_its_input_digest_and_the_bundle_does_not_regenerate_large_inputs(
    tmp_path: Path, monkeypatch
):
    import torch

    from harness.across.repro import MAX_SAVED_BYTES, save_bundle
    from harness.measure import oracle
    from harness.measure.cell import _with_input_digest
    from harness.measure.digests import tensors_digest as _digest
    from harness.model import registry
    from harness.model.records import CellRecord, Status
    from harness.model.spec import Case

    registry.discover()
    op = registry.get_operator("mhc_pre")
    case = Case("tiny-digest", {"B": 1, "S": 3, "n": 2, "D": 8}, ())
    def record(status: str, error: str = "") -> CellRecord:
        return CellRecord("mhc_pre", "golden", "float32", case, "cpu", status=Status(status), error=error)

    cell = record("FAIL")
    _with_input_digest(cell, op, case, "cpu")
    want = _digest(oracle.gen_inputs(op, case, torch.float32, 0, "cpu").tensors)
    assert cell.inputs_sha256 == want and cell.inputs_bytes > 0
    # a passing cell carries it too (a --compare needs the same inputs), a cell that never ran does not
    assert _with_input_digest(record("PASS"), op, case, "cpu").inputs_sha256 == want
    assert _with_input_digest(record("SKIP"), op, case, "cpu").inputs_sha256 is None
    oom = record("ERROR", "OutOfMemoryError in the backend or the harness's checks")
    assert _with_input_digest(oom, op, case, "cpu").inputs_sha256 is None  # rerun by the runner, draws dropped

    # a large cell's bundle takes the worker's digest instead of drawing the inputs again in the parent
    def no_draws(*a, **k):
        raise AssertionError("inputs regenerated for a bundle whose cell carried their digest")

    monkeypatch.setattr(oracle, "gen_inputs", no_draws)
    big = record("FAIL")
    big.inputs_sha256, big.inputs_bytes = "abc123", MAX_SAVED_BYTES + 1
    b = json.loads((save_bundle(big, tmp_path, []) / "bundle.json").read_text())
    assert b["inputs_sha256"] == "abc123" and b["inputs_saved"] is False


def test_a_timeout_bundle_replays_with_a_timeout_from_any_folder(tmp_path: Path):
    root = Path(__file__).resolve().parent.parent
    report = tmp_path / "reports"
    run = subprocess.run([sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--case",
                          "tiny", "--backend", "sleeps", "--plugin", "tests/plugins/misbehaving.py", "--device", "cpu",
                          "--dtype", "float32", "--timeout", "10", "--report", str(report), "--no-progress"],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    (bundle,) = (report / "repro").iterdir()
    plugins = json.loads((bundle / "bundle.json").read_text())["plugins"]
    assert plugins == [str(root / "tests" / "plugins" / "misbehaving.py")]  # absolute: replays anywhere
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "harness", "repro", str(bundle), "--timeout", "5"], cwd=elsewhere,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "TIMEOUT again" in r.stdout, r.stdout + r.stderr


def test_mutants_of_a_plugin_join_the_zoo(tmp_path: Path):
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "harness", "mutants", "--plugin", "tests/diagnosis/fresh_mutants.py",
                        "--only", "fresh-lazy-dv-scaled", "--device", "cpu", "--report", str(tmp_path),
                        "--no-progress"], cwd=root, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fresh-lazy-dv-scaled" in r.stdout and "1/1 caught" in r.stdout
