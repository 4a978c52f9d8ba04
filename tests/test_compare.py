"""Accuracy regressions across commits (issue #29): a defect inside the bound, caught by comparing a run with
the backend's committed reports; nothing flagged where nothing changed; too little compared is an error."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_env import inner_pytest_env

from harness.across.compare import CompareError, Reference, compare, require
from harness.model import registry
from harness.model.records import CellRecord

ROOT = Path(__file__).resolve().parent.parent
MUTANT = "mutant:xent-lean-dhidden-half-accum"
# the committed CPU reports hold this cell of the unmutated lean backend, with its input digest and oracle code
CELL = ["--kernel", "fused_linear_xent", "--sizes", "sweep", "--case", "N7-H16-V1025", "--dtype", "float16",
        "--device", "cpu", "--no-progress"]


def harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "run", *CELL, "--report", str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_half_precision_accumulation_passes_the_bound_and_is_a_regression_against_the_committed_reports(
        tmp_path: Path):
    r = harness(tmp_path / "alone", "--backend", MUTANT)
    assert r.returncode == 0 and "1 pass" in r.stdout, r.stdout + r.stderr  # no absolute bound sees it
    r = harness(tmp_path / "cmp", "--backend", MUTANT, "--compare", str(ROOT / "reports"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 matched, 0 unmatched, 0 not comparable; 1 regressed" in out
    m = re.search(rf"REGRESSION fused_linear_xent/{MUTANT}/float16/N7-H16-V1025: (.*)", out)
    assert m, out
    growth = [float(g) for g in re.findall(r"dhidden \w+ ratio \S+ -> \S+ \(([0-9.]+)x\)", m.group(1))]
    # the threshold (1.5x) decides: the growth is real but modest
    assert growth and all(1.5 < g <= 2.5 for g in growth), m.group(1)
    md = (tmp_path / "cmp" / "cpu" / "fused_linear_xent.md").read_text()
    assert "## Compared with" in md and "**Regressions**:" in md and "| dhidden |" in md
    # harness report re-renders the comparison from what was kept beside the report
    (tmp_path / "cmp" / "cpu" / "fused_linear_xent.md").unlink()
    rr = subprocess.run([sys.executable, "-m", "harness", "report", "--report", str(tmp_path / "cmp")], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
    assert rr.returncode == 0, rr.stderr
    assert "**Regressions**:" in (tmp_path / "cmp" / "cpu" / "fused_linear_xent.md").read_text()
    assert "1 regressed" in (tmp_path / "cmp" / "STATUS.md").read_text()


def test_the_unmutated_backend_against_the_committed_reports_and_a_git_revision_shows_no_regression(
        tmp_path: Path):
    r = harness(tmp_path / "a", "--backend", "triton-lean", "--compare", str(ROOT / "reports"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 matched, 0 unmatched, 0 not comparable; 0 regressed" in r.stdout
    r = harness(tmp_path / "b", "--backend", "triton-lean", "--compare", "HEAD")
    assert r.returncode == 0 and "0 regressed" in r.stdout, r.stdout + r.stderr


def test_accepting_records_an_intended_change(tmp_path: Path):
    r = harness(tmp_path, "--backend", MUTANT, "--compare", str(ROOT / "reports"), "--compare-accept")
    assert r.returncode == 0 and "accepted as the new reference" in r.stdout, r.stdout + r.stderr
    assert "  accepted fused_linear_xent/" in r.stdout


def test_a_regressed_pytest_item_fails_with_both_ratios(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kernel",
                        "fused_linear_xent", "--sizes", "sweep", "--harness-dtype", "float16", "--harness-device",
                        "cpu", "--backend", MUTANT, "-k", "N7-H16-V1025", "--harness-compare", str(ROOT / "reports")],
                       cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=inner_pytest_env())
    assert r.returncode == 1, r.stdout[-3000:]
    assert "REGRESSION against" in r.stdout and "dhidden rms ratio" in r.stdout


def test_an_unreadable_reference_and_too_little_compared_are_usage_errors(tmp_path: Path):
    r = harness(tmp_path, "--backend", "triton-lean", "--compare", "no-such-revision-or-folder")
    assert r.returncode == 2 and "--compare no-such-revision-or-folder: neither a report directory" in r.stderr
    empty = tmp_path / "empty"
    (empty / "cpu").mkdir(parents=True)
    (empty / "cpu" / "fused_linear_xent.jsonl").write_text("")
    r = harness(tmp_path / "run", "--backend", "triton-lean", "--compare", str(empty))
    assert r.returncode == 2 and "no cpu cells of fused_linear_xent" in r.stderr, r.stderr


# -- the rule, on records -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cell() -> CellRecord:
    from harness.measure.cell import run_cell
    from harness.model.spec import Case

    registry.discover()
    op = registry.get_operator("softmax_xent")
    c = run_cell(op, registry.get_backend("softmax_xent", "torch"), Case("c", {"N": 16, "V": 40}), "float32", "cpu")
    c.inputs_sha256, c.oracle_code, c.run_id = "d1", "o1", "r1"
    return c


HEADER = {"run_id": "r1", "device_class": "cpu", "versions": {"torch": "2.13.0", "triton": "3.9.0"}, "commit": "c1"}


def _ref(c: CellRecord, **header) -> Reference:
    return Reference("REF", {c.id: c}, {"r1": {**HEADER, **header}})


def _scaled(c: CellRecord, name: str, factor: float) -> CellRecord:
    out = copy.deepcopy(c)
    f = out.component(name)
    f.max_err *= factor
    f.max_excess *= factor
    f.rms_excess *= factor
    return out


def test_growth_below_the_threshold_or_far_below_the_bound_is_not_a_regression(cell: CellRecord):
    ref = _scaled(cell, "dlogits", 2.0)  # dlogits' rms ratio about 0.4: passing, not far below its bound
    assert compare([_scaled(cell, "dlogits", 2.0 * 1.4)], HEADER, _ref(ref)).regressed == []
    got = compare([_scaled(cell, "dlogits", 2.0 * 1.6)], HEADER, _ref(ref)).regressed
    assert {ch.component for c in got for ch in c.regressions} == {"dlogits"}
    # the same growth far below the bound (ratios under 0.25) says nothing
    assert compare([_scaled(cell, "dlogits", 0.8)], HEADER, _ref(_scaled(cell, "dlogits", 0.5))).regressed == []


def test_a_change_within_the_recorded_run_to_run_spread_is_noise(cell: CellRecord):
    ref = _scaled(cell, "dlogits", 2.0)
    now = _scaled(cell, "dlogits", 2.0 * 1.6)
    now.component("dlogits").spread = 1.0  # the backend itself varies more than that between two calls
    assert compare([now], HEADER, _ref(ref)).regressed == []


def test_cells_with_other_inputs_oracle_code_or_toolchain_are_not_comparable(cell: CellRecord):
    other = copy.deepcopy(cell)
    other.inputs_sha256 = "d2"
    assert compare([other], HEADER, _ref(cell)).not_comparable[0].why_not.startswith("different inputs")
    other = copy.deepcopy(cell)
    other.oracle_code = "o2"
    assert "different oracle code" in compare([other], HEADER, _ref(cell)).not_comparable[0].why_not
    got = compare([cell], HEADER, _ref(cell, versions={"torch": "2.12.0", "triton": "3.9.0"}))
    assert got.not_comparable[0].why_not == "different torch (2.12.0 -> 2.13.0)"
    with pytest.raises(CompareError, match="compared 0 of 1 cells"):
        require(got, 0.9)


def test_a_git_revision_of_the_users_own_project_is_read_from_the_current_folder(tmp_path: Path):
    """A user commits their reports in their own repository and compares against it from there, not
    against the harness's checkout."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@localhost", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--case", "tiny",
                               "--backend", "mine", "--plugin", "mine.py", "--dtype", "float32", "--device", "cpu",
                               "--report", "reports", "--no-progress", *extra], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)

    (tmp_path / "mine.py").write_text(
        "from harness import Backend, register_backend\n"
        "from harness.backends.golden.mhc_pre import backward, forward\n"
        "register_backend(Backend(operator='mhc_pre', name='mine', impl=forward, backward=backward,\n"
        "                         devices=('cpu',)))\n")
    git("init", "-q")
    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    git("add", "reports")
    git("commit", "-qm", "evidence")
    again = run("--compare", "HEAD")
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"compared with HEAD \([\w+]+\): [1-9]\d* matched, 0 unmatched", again.stdout), again.stdout
