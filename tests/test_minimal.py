"""The minimal failing case of each failing (operator, backend, dtype) of a run (harness/front/minimal.py,
issue #44): searched below the failing case, shown first in the report, with its repro bundle; off with
--shrink-seconds 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.model.spec import Case
from harness.model.strategies import shrink_case

ROOT = Path(__file__).resolve().parent.parent


def test_sizes_are_bisected_and_a_layout_twin_kept_only_where_the_failure_needs_it():
    case = Case("N64-V1100", {"N": 64, "V": 1100, "ignored": 0.2, "twin": "offset"})
    tried: list[str] = []

    def fails(c: Case) -> bool:  # a bug past V = 1024, in the offset layout only
        tried.append(c.name)
        return c.params["V"] > 1024 and c.params.get("twin") == "offset"

    small = shrink_case(case, fails, seconds=30)
    assert small is not None and small.params == {"N": 1, "V": 1025, "ignored": 0.2, "twin": "offset"}
    assert small.name == "N64-V1100-min-N1-V1025~offset" and "shrunk" in small.tags
    assert len(tried) < 40


def test_a_case_nothing_smaller_of_which_fails_gives_none_and_time_bounds_the_search():
    case = Case("N3-V5", {"N": 3, "V": 5})
    assert shrink_case(case, lambda c: False, seconds=30) is None
    assert shrink_case(Case("N99-V99", {"N": 99, "V": 99}), lambda c: True, seconds=0) is None


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("HARNESS_SHRINK_SECONDS", None)
    args = ["run", "--kernel", "rmsnorm", "--backend", "mutant:rmsnorm-dy-read-contiguous", "--sizes", "smoke",
            "--case", "R8-F32-xT-res", "--dtype", "float32", "--device", "cpu", "--no-progress",
            "--report", str(tmp_path / "r"), *extra]
    return subprocess.run([sys.executable, "-m", "harness", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_failing_run_shows_its_minimal_failing_case_first_with_a_bundle(tmp_path: Path):
    p = _run(tmp_path, "--shrink-seconds", "60")
    assert p.returncode == 1, p.stderr[-2000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("minimal failing case: rmsnorm/"))
    md = (tmp_path / "r" / "cpu" / "rmsnorm.md").read_text()
    assert md.index("## Minimal failing cases") < md.index("## Failures")
    found = json.loads((tmp_path / "r" / "cpu" / "rmsnorm.minimal.json").read_text())
    (m,) = found
    assert m["from"] == "R8-F32-xT-res" and m["case"]["name"].startswith("R8-F32-xT-res-min")
    assert m["case"]["params"]["rows"] * m["case"]["params"]["features"] < 8 * 32
    bundle = Path(m["repro"].split()[-1])
    assert (bundle / "bundle.json").exists() and str(bundle) in line
    report = json.loads((tmp_path / "r" / "cpu" / "rmsnorm.json").read_text())
    assert report["minimal"] == found


def test_shrink_seconds_zero_searches_nothing_and_the_report_shows_no_earlier_runs_cases(tmp_path: Path):
    _run(tmp_path, "--shrink-seconds", "60")
    p = _run(tmp_path, "--shrink-seconds", "0")
    assert p.returncode == 1 and "minimal failing case" not in p.stdout
    assert "## Minimal failing cases" not in (tmp_path / "r" / "cpu" / "rmsnorm.md").read_text()
