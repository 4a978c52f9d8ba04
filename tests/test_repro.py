"""Property-based search: a failing drawn case is shrunk, saved as a bundle, and replays in one command."""

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
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "shrunk" in r.stdout
    bundles = re.findall(r"repro: harness repro (\S+)", r.stdout)
    assert bundles
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
