"""Accuracy regressions across commits: a run's cells compared with a reference run's (``--compare REF``).

No absolute bound sees a kernel whose error doubled and stayed inside it (a weight-gradient partial summed
in bf16). A comparison with the kernel's own earlier run does: with the same seed, inputs and oracle code
the inputs are bit-identical and the oracle the same, so for a deterministic backend a change in its error
is a change in its numerics, not noise. The verdict rule is untouched; REGRESSION is a status of its own.

A cell is matched to REF's cell of the same operator, backend (a mutant to the backend it mutates), case,
dtype, seed and device class; it is comparable where its input digest, oracle code and toolchain (torch,
triton, device class) are REF's too. Per component, a ratio (max, or rms where it applies) that grew by
more than ``fail`` times, to at least ``MIN_RATIO``, on at least ``MIN_ELEMENTS`` elements, by more than
the error spread either run measured over its determinism re-run, is a regression.

The comparison is kept beside the report (``<operator>.compare.json``: REF's matched cells and the
counts), so that ``harness report`` re-renders the "Compared with" section and STATUS counts regressions.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..judge.judgement import judge_cell
from ..model.mutant_builds import resolve as resolve_backend
from ..model.records import CellRecord
from ..model.registry import REPO_ROOT
from ..store import reports
from ..store.reports import atomic_write

DEFAULT_FAIL = 1.5  # --compare-fail: growth of a ratio that is a regression
DEFAULT_REQUIRE = 0.9  # --compare-require: the least fraction of the run's cells that must be compared
MIN_RATIO = 0.25  # a ratio below a quarter of its bound is too far from the bound to call a regression
MIN_ELEMENTS = 16  # the rms criterion's own minimum: fewer elements say too little
TOOLCHAIN = ("torch", "triton")  # versions that change a kernel's numerics (and the device class)


class CompareError(ValueError):
    """REF cannot be read, or too few cells could be compared: a usage error, never a silent pass."""


@dataclass
class Reference:
    """REF's cells of one device class, by match key, with the run headers they came from."""

    label: str
    cells: dict[tuple, CellRecord] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)

    def header(self, cell: CellRecord) -> dict:
        return self.runs.get(cell.run_id or "", {})


def compared_as(cell: CellRecord) -> str:
    """The backend whose earlier cells this one is compared with: a mutant's is the backend it mutates."""

    try:
        origin = resolve_backend(cell.operator, cell.backend).origin
    except KeyError:
        return cell.backend
    if origin.startswith("mutant of "):
        return origin.removeprefix("mutant of ").split("/", 1)[1]
    return cell.backend


def load_reference(ref: str, device_class: str, operators: list[str], repo: Path | None = None) -> Reference:
    """REF as a report directory (``reports`` or ``reports/<device class>``), or a git revision whose
    committed ``reports/<device class>/<operator>.jsonl`` (or ``.jsonl.gz``) are read."""

    out = Reference(ref)
    p = Path(ref)
    if p.is_dir():
        d = p / device_class if (p / device_class).is_dir() else p
        for op in operators:
            cells, runs = reports.load(d, op)
            _add(out, cells, runs)
        if not out.cells:
            raise CompareError(f"--compare {ref}: no {device_class} cells of {', '.join(operators)} in {d}")
        return out
    with tempfile.TemporaryDirectory(prefix="harness-compare-") as tmp:
        for op in operators:
            names = (f"{op}{reports.PACKED}", f"{op}.jsonl")  # packed or not (harness/store/reports.py)
            for name, data in _git_show(ref, [f"reports/{device_class}/{n}" for n in names], repo).items():
                (Path(tmp) / Path(name).name).write_bytes(data)
            cells, runs = reports.load(Path(tmp), op)
            _add(out, cells, runs)
    if not out.cells:
        raise CompareError(f"--compare {ref}: neither a report directory nor a git revision with committed "
                           f"reports/{device_class}/<operator>.jsonl for {', '.join(operators)}")
    return out


def _add(out: Reference, cells: list[CellRecord], runs: dict[str, dict]) -> None:
    out.runs.update(runs)
    for c in cells:
        out.cells[c.id] = c


def _git_show(rev: str, paths: list[str], repo: Path | None) -> dict[str, bytes]:
    """Those of ``paths`` that exist at ``rev``, all from one repository: the current folder's (a user's project,
    where their reports are committed) where it has any of them, else the harness's own checkout (its committed
    evidence). Never some from each: the two hold different cells."""
    for where in ([repo] if repo else [Path.cwd(), REPO_ROOT]):
        found = {}
        for path in paths:
            r = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=where, capture_output=True, timeout=120)
            if r.returncode == 0:
                found[path] = r.stdout
        if found:
            return found
    return {}


@dataclass
class Change:
    """One component's ratio in REF and now."""

    component: str
    metric: str  # "max" | "rms"
    before: float
    after: float

    @property
    def growth(self) -> float:
        return self.after / self.before if self.before > 0 else float("inf")

    def text(self) -> str:
        return f"{self.component} {self.metric} ratio {self.before:.3g} -> {self.after:.3g} ({self.growth:.2f}x)"


@dataclass
class CellComparison:
    """A cell of this run beside its REF cell."""

    cell: CellRecord
    ref: CellRecord | None
    ref_header: dict = field(default_factory=dict)
    why_not: str = ""  # why it could not be compared ("" when it was)
    regressions: list[Change] = field(default_factory=list)
    improvements: list[Change] = field(default_factory=list)
    newly_failing: bool = False

    @property
    def compared(self) -> bool:
        return self.ref is not None and not self.why_not


@dataclass
class Comparison:
    """This run against REF: each cell's comparison and the counts a report and the exit code need."""

    ref: str
    ref_commits: list[str]
    fail: float
    accepted: bool
    cells: list[CellComparison] = field(default_factory=list)

    @property
    def matched(self) -> list[CellComparison]:
        return [c for c in self.cells if c.compared]

    @property
    def unmatched(self) -> list[CellComparison]:
        return [c for c in self.cells if c.ref is None]

    @property
    def not_comparable(self) -> list[CellComparison]:
        return [c for c in self.cells if c.ref is not None and c.why_not]

    @property
    def regressed(self) -> list[CellComparison]:
        return [c for c in self.cells if c.regressions]

    def counts_line(self) -> str:
        accepted = "; accepted as the new reference (--compare-accept)" if self.accepted else ""
        return (f"compared with {self.ref} ({', '.join(self.ref_commits) or '?'}): {len(self.matched)} matched, "
                f"{len(self.unmatched)} unmatched, {len(self.not_comparable)} not comparable; "
                f"{len(self.regressed)} regressed, {sum(1 for c in self.cells if c.improvements)} improved "
                f"(threshold {self.fail:g}x){accepted}")


def _ratios(judged: Any) -> dict[tuple[str, str], tuple[float, Any]]:
    """(component, metric) -> (ratio, figures) of a judged cell, for components with figures."""
    out = {}
    for c in judged.components:
        f, v = c.figures, c.verdict
        if f.kind != "figures" or f.numel < MIN_ELEMENTS:
            continue
        out[(c.name, "max")] = (v.ratio_max, f)
        if v.rms_applies:
            out[(c.name, "rms")] = (v.ratio_rms, f)
    return out


def _why_not(cell: CellRecord, ref: CellRecord, header: dict, ref_header: dict) -> str:
    if not cell.inputs_sha256 or not ref.inputs_sha256:
        return "no input digest recorded" + ("" if cell.inputs_sha256 else " in this run")
    if cell.inputs_sha256 != ref.inputs_sha256:
        return "different inputs (their digests differ)"
    if not cell.oracle_code or cell.oracle_code != ref.oracle_code:
        return f"different oracle code ({ref.oracle_code or 'not recorded'} -> {cell.oracle_code or '?'})"
    for k in TOOLCHAIN:
        a, b = (ref_header.get("versions") or {}).get(k), (header.get("versions") or {}).get(k)
        if a != b:
            return f"different {k} ({a} -> {b})"
    if ref_header.get("device_class") != header.get("device_class"):
        return f"different device class ({ref_header.get('device_class')} -> {header.get('device_class')})"
    return ""


def compare_cell(cell: CellRecord, ref: CellRecord | None, header: dict, ref_header: dict, fail: float,
                 device_class: str) -> CellComparison:
    """One cell against its REF cell: not comparable, or its regressions, improvements, a new failure."""

    out = CellComparison(cell, ref, ref_header)
    if ref is None:
        return out
    out.why_not = _why_not(cell, ref, header, ref_header)
    if out.why_not:
        return out
    judged_ref, judged_now = judge_cell(ref, device_class=device_class), judge_cell(cell, device_class=device_class)
    before, after = _ratios(judged_ref), _ratios(judged_now)
    for key in sorted(before.keys() & after.keys()):
        (r0, f0), (r1, f1) = before[key], after[key]
        change = Change(key[0], key[1], r0, r1)
        # beyond what either run saw between two calls of the same backend on the same inputs
        noise = max(f0.spread or 0.0, f1.spread or 0.0)
        moved = abs(f1.max_err - f0.max_err) > noise
        if r1 >= MIN_RATIO and change.growth > fail and moved:
            out.regressions.append(change)
        elif r0 >= MIN_RATIO and r1 > 0 and r0 / r1 > fail and moved:
            out.improvements.append(change)
    out.newly_failing = not judged_ref.failing and judged_now.failing
    return out


def compare(cells: list[CellRecord], header: dict, reference: Reference, fail: float = DEFAULT_FAIL,
            accepted: bool = False) -> Comparison:
    """This run's cells (SKIPs and cells without a result are not compared) against REF."""
    dc = header.get("device_class", "")
    commits = sorted({reference.header(c).get("commit", "?") for c in reference.cells.values()})
    out = Comparison(reference.label, commits, fail, accepted)
    for c in cells:
        if not c.status.ran:
            continue
        ref = reference.cells.get(c.id.under(compared_as(c)))
        out.cells.append(compare_cell(c, ref, header, reference.header(ref) if ref else {}, fail, dc))
    return out


def require(comparison: Comparison, fraction: float) -> None:
    """Fewer compared cells than ``fraction`` of those that ran is a usage error, never a silent pass."""
    ran = len(comparison.cells)
    n = len(comparison.matched)
    if ran and n < fraction * ran:
        reasons = sorted({c.why_not for c in comparison.not_comparable})[:4]
        raise CompareError(
            f"--compare {comparison.ref}: compared {n} of {ran} cells ({n / ran:.0%}), fewer than "
            f"--compare-require {fraction:.0%}: {len(comparison.unmatched)} have no cell in REF"
            + (f", {len(comparison.not_comparable)} are not comparable ({'; '.join(reasons)})" if reasons else ""))


# -- kept beside the report -----------------------------------------------------------------------------

def save(dir_: Path, comparison: Comparison, header: dict) -> list[Path]:
    """``<operator>.compare.json`` per operator: REF's matched cells (figures, profiles dropped) and the
    rest by key, so that rendering recomputes the comparison under the rules of the day."""

    paths = []
    for op in sorted({c.cell.operator for c in comparison.cells}):
        mine = [c for c in comparison.cells if c.cell.operator == op]
        refs = []
        for c in mine:
            if c.ref is not None:
                r = CellRecord.from_json(c.ref.to_json())
                for f in r.components:
                    f.slices, f.grid = [], None
                refs.append(r.to_json())
        payload = {"ref": comparison.ref, "ref_commits": comparison.ref_commits, "fail": comparison.fail,
                   "accepted": comparison.accepted, "run_id": header.get("run_id"), "ref_cells": refs,
                   # the headers of REF's runs: the toolchain check needs them again when rendering
                   "ref_runs": {c.ref.run_id or "": c.ref_header for c in mine if c.ref is not None}}
        p = dir_ / f"{op}.compare.json"
        atomic_write(p, json.dumps(payload, separators=(",", ":")) + "\n")
        paths.append(p)
    return paths


def load_saved(dir_: Path, op: str, cells: list[CellRecord], runs: dict[str, dict]) -> Comparison | None:
    """The comparison kept beside a report, recomputed for the cells of the run that made it."""
    p = dir_ / f"{op}.compare.json"
    if not p.exists():
        return None
    saved = json.loads(p.read_text())
    header = runs.get(saved.get("run_id") or "")
    if header is None:
        return None  # the run it compared is no longer in the report
    reference = Reference(saved["ref"], runs=saved.get("ref_runs", {}))
    for d in saved.get("ref_cells", []):
        r = CellRecord.from_json(d)
        reference.cells[r.id] = r
    mine = [c for c in cells if c.run_id == saved["run_id"]]
    out = compare(mine, header, reference, saved.get("fail", DEFAULT_FAIL), saved.get("accepted", False))
    out.ref_commits = saved.get("ref_commits", out.ref_commits)
    return out


def mark(judged: list, comparison: Comparison | None) -> None:
    """A cell that passes but regressed (not accepted) is shown as REGRESSION, and fails the run."""
    if comparison is None or comparison.accepted:
        return
    regressed = {id(c.cell) for c in comparison.regressed}
    for j in judged:
        if id(j.record) in regressed and j.shown == "PASS":
            j.shown = "REGRESSION"
