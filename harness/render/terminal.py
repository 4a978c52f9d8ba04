"""What a terminal shows of judged cells: a failing cell's component table (a pytest item's failure, `harness
repro`), and a run's closing summary."""

from __future__ import annotations

from typing import Any

from ..judge.causes import causes
from ..judge.judgement import SHOWN, counts, judge_cell, judge_cells
from ..model.records import CellRecord


def fmt(x: Any) -> str:
    if isinstance(x, str):
        return x
    if x is None:
        return ""
    if isinstance(x, float):
        if x == 0:
            return "0"
        if x != x or x in (float("inf"), float("-inf")):
            return str(x)
        return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
    return str(x)


def format_failure(cell: CellRecord, device_class: str = "") -> str:
    """The component table, localization, hints and contracts of a judged cell, for a failing item."""
    j = judge_cell(cell, device_class=device_class)
    sev = f" ({j.severity})" if j.severity else ""
    lines = [f"{cell.operator} / {cell.backend} / {cell.dtype} / {cell.case.name}: {j.shown}{sev}",
             f"case params: {cell.case.params}"]
    if j.gap is not None:
        lines.append(f"declared gap: {j.declared_text()}")
    if cell.error:
        lines.append(cell.error)
        if cell.traceback:
            lines.append(cell.traceback)
    if j.components:
        lines.append(f"{'component':<14} {'verdict':<7} {'max err':>10} {'floor max':>10} {'ratio max':>9} "
                     f"{'ratio rms':>9} {'cos':>7}  where / why")
        for c in j.components:
            f, v = c.figures, c.verdict
            why = ""
            if v.failed:
                why = (c.where + " " if c.where else "") + f"[{c.reason}]"
                if c.hints and j.shown != "XFAIL":
                    why += f" hint: {c.hint_text()}"
            rms = fmt(v.ratio_rms) if v.rms_applies else "n/a"
            lines.append(f"{c.name:<14} {v.verdict:<7} {fmt(f.max_err):>10} {fmt(f.floor_max):>10} "
                         f"{fmt(v.ratio_max):>9} {rms:>9} {f.cosine:>7.4f}  {why}")
    for k, x in j.contracts:
        if not k.ok and x is None:
            lines.append(f"contract {k.name} violated: {k.detail}")
    for n in j.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def terminal_summary(results: list[CellRecord], device_class: str = "") -> str:
    judged = judge_cells(results, device_class)
    out = []
    for op in sorted({j.record.operator for j in judged}):
        out.append(f"{op}:")
        for (b, dt), row in counts([j for j in judged if j.record.operator == op]).items():
            parts = [f"{row[s]} {s.lower()}" for s in SHOWN if row[s]]
            if row["marginal"]:
                parts.append(f"({row['marginal']} of the fails marginal)")
            out.append(f"  {b:<14} {dt:<9} {', '.join(parts)}")
    declared = [j for j in judged if j.shown == "XFAIL"]
    if declared:
        out.append(f"  {len(declared)} cell(s) inside their backend's declared gap ("
                   + "; ".join(sorted({f"{j.record.backend}/{j.record.dtype}: {j.gap.reason}" for j in declared
                                       if j.gap})) + ")")
    skips: dict[str, list[str]] = {}
    for j in judged:
        if j.shown == "SKIP":
            skips.setdefault(j.record.error, []).append(j.record.backend)
    for why, bs in sorted(skips.items()):
        out.append(f"  skipped {len(bs)} cell(s) ({', '.join(sorted(set(bs)))}): {why}")
    for c in causes(judged):
        out.append(f"  cause: {c.text()}")
    bad = sorted((j for j in judged if j.failing), key=lambda j: j.severity == "marginal")
    for j in bad[:20]:
        c = j.record
        what = "; ".join(f"{x.name} {x.verdict.verdict} ({x.where or x.reason})"
                         + (f" hint: {x.hint_text()}" if x.hints else "") for x in j.failed_components[:4])
        what += "; ".join(f" contract {k.name}: {k.detail}" for k, x in j.contracts if not k.ok and x is None)
        sev = f" ({j.severity})" if j.severity else ""
        out.append(f"  ✗ {c.operator}/{c.backend}/{c.dtype}/{c.case.name}: {j.shown}{sev} {what or c.error[:200]}")
    if len(bad) > 20:
        out.append(f"  ... and {len(bad) - 20} more failing cells (see the reports)")
    return "\n".join(out)
