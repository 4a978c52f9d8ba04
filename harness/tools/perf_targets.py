"""An operator's declared speed / memory targets (``OperatorSpec.perf_targets``) judged on bench rows, and the
cells that bench reports and STATUS.md draw of each verdict."""

from __future__ import annotations

from typing import Any

from ..model.spec import PerfTarget, short_dtype


def _timed_row(timed: list[dict[str, Any]], backend: str, case: str, dtype: str) -> dict[str, Any] | None:
    return next((r for r in timed if (r["backend"], r["case"], r["dtype"]) == (backend, case, dtype)), None)


def _measured(t: PerfTarget, case: str, timed: list[dict[str, Any]]) -> float | None:
    """The target's metric on ``case``: the backend's own figure, or its ratio to the ``versus`` backend's;
    None where either figure is missing (or the divisor is zero)."""
    mine = _timed_row(timed, t.backend, case, t.dtype)
    value = mine.get(t.metric) if mine else None
    if t.versus:
        theirs = _timed_row(timed, t.versus, case, t.dtype)
        other = theirs.get(t.metric) if theirs else None
        value = value / other if value is not None and other else None
    return value


def _spread(t: PerfTarget, case: str, timed: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The range the target's metric takes between the 20th and 80th percentile calls: the backend's own
    spread, or for a ratio the widest one the two spreads allow (its low calls over the other's high ones, and
    the reverse); None where a figure has no spread (memory, bandwidth fractions)."""
    mine = _timed_row(timed, t.backend, case, t.dtype)
    lo_hi = mine.get(t.metric + "_spread") if mine else None
    if not lo_hi:
        return None
    if not t.versus:
        return float(lo_hi[0]), float(lo_hi[1])
    theirs = _timed_row(timed, t.versus, case, t.dtype)
    other = theirs.get(t.metric + "_spread") if theirs else None
    if not other or min(other) <= 0:
        return None
    return float(lo_hi[0]) / float(other[1]), float(lo_hi[1]) / float(other[0])


def check_targets(targets: tuple[PerfTarget, ...], rows: list[dict], gpu: bool) -> list[dict]:
    """Each target on each bench case it names: the measured value and whether it is met (None where the
    run has no figure for it). Targets describe the GPU bench shapes; a CPU run checks none.

    A target whose backend (or ``versus`` backend) has no row at all on that case and dtype was not benched
    by this run (``--backend`` or ``--dtype`` left it out): ``absent`` names what is missing, and the report
    says "not benched" instead of "no figure", which stays for a backend that was benched and gave no
    figure (it failed, was skipped here, or lacks the metric). `harness bench --backend torch,cuda` on an
    H200 printed "no figure" beside the table's figures: those were cuda-inplace's targets (issue #41)."""
    out: list[dict] = []
    if not gpu:
        return out
    timed = [r for r in rows if "fwd_ms" in r]
    benched = {(r.get("backend"), r.get("case"), r.get("dtype")) for r in rows}
    for t in targets:
        cases = [t.case] if t.case else list(dict.fromkeys(r["case"] for r in rows))
        for case in cases:
            value = _measured(t, case, timed)
            check = {"backend": t.backend, "case": case, "dtype": t.dtype, "target": t.describe(),
                     "measured": value, "met": None if value is None else t.judge(value)}
            spread = _spread(t, case, timed) if value is not None else None
            if spread is not None and spread[0] <= t.bound <= spread[1]:
                # the verdict is the medians'; the calls' spread crosses the bound, so another run may differ
                check["undecided"] = [round(spread[0], 3), round(spread[1], 3)]
            absent = [b for b in (t.backend, t.versus) if b and (b, case, t.dtype) not in benched]
            if value is None and absent:
                check["absent"] = absent
            out.append(check)
    return out


def target_lines(checks: list[dict]) -> list[str]:
    """The markdown table of check_targets' results (empty without targets)."""
    if not checks:
        return []
    lines = ["| backend | case | dtype | target | measured | |", "|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['backend']} | {c['case']} | {short_dtype(c['dtype'])} | {target_cells(c)} |")
    return lines


def target_cells(check: dict) -> str:
    """'target | measured | met' cells of one check_targets result (bench reports and STATUS.md)."""
    if check.get("absent"):
        mark = f"not benched: {' and '.join(check['absent'])} not in this run"
    else:
        mark = "no figure" if check["met"] is None else ("✅ met" if check["met"] else "❌ missed")
    if check.get("undecided"):
        lo, hi = check["undecided"]
        mark += f" at the medians; the calls' 20th-80th percentiles give {lo:.3g}-{hi:.3g}, across the bound"
    value = "" if check["measured"] is None else format(check["measured"], ".3g")
    return f"{check['target']} | {value} | {mark}"
