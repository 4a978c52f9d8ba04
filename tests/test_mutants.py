"""The bug zoo on this machine: every mutant whose backend runs here is caught, as expected, localized."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.model import registry
from harness.model.mutant_builds import check_edits

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", [m.id for m in registry.mutants()])
def test_edit_applies_exactly_once(mutant: str):
    m = next(x for x in registry.mutants() if x.id == mutant)
    assert check_edits(m) == []


def test_zoo_catches_every_mutant_that_runs_here(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "harness", "mutants", "--device", "cpu", "--report", str(tmp_path), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    out = json.loads((tmp_path / "cpu" / "mutants.json").read_text())
    missed = [(row["mutant"], row.get("detail")) for row in out["rows"] if row["status"] in ("MISSED", "ERROR")]
    assert not missed, r.stdout
    assert out["ran"] >= 2 and out["caught"] == out["ran"]
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_zoo_stopped_part_way_leaves_the_mutants_it_finished_and_resumes(tmp_path: Path):
    # stopped (SIGTERM, as a call's time limit or `timeout` sends it) as soon as its first caught mutant is
    # printed: the reports hold that mutant, and name those still running; --resume runs the others
    zoo = [sys.executable, "-m", "harness", "mutants", "--kernel", "mhc_pre", "--device", "cpu", "--report",
           str(tmp_path), "--no-progress"]
    p = subprocess.Popen(zoo, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in p.stdout:  # the header, then a line per mutant as it is scored
            lines.append(line)
            if "CAUGHT" in line.split():  # a mutant whose cells ran (not a SKIP, scored at once)
                p.terminate()
                break
        rest, _ = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode != 0, "".join(lines) + rest
    out = json.loads((tmp_path / "cpu" / "mutants.json").read_text())
    first = {r["mutant"] for r in out["rows"]}
    assert out["pending"] and out["caught"] >= 1 and not first & set(out["pending"]), out
    page = (tmp_path / "cpu" / "mutants.md").read_text()
    assert "**Partial**" in page and all(m in page.split("**Partial**")[1].split("\n")[0] for m in out["pending"])
    r = subprocess.run(zoo + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed: {len(first)} mutant(s)" in r.stdout
    ran_again = {line.split()[0] for line in r.stdout.splitlines()[2:] if "CAUGHT" in line.split()}
    assert not ran_again & first, f"resumed mutants were run again: {ran_again & first}"
    done = json.loads((tmp_path / "cpu" / "mutants.json").read_text())
    assert done["pending"] == [] and first <= {r["mutant"] for r in done["rows"]}
    assert done["caught"] == done["ran"] >= out["caught"] + len(ran_again)


def test_a_mutant_whose_edit_does_not_apply_is_an_error():
    from harness import Case, Expectation, Mutant

    m = Mutant(
        "broken-edit",
        "mhc_pre",
        "golden",
        (("mhc_pre.py", "this text is not in the file", "x"),),
        (Expectation(Case("c", {"B": 1, "S": 2, "n": 2, "D": 3})),),
    )
    problems = check_edits(m)
    assert problems and "occurs 0 times" in problems[0]
