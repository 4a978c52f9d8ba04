"""<report>/STATUS.md (the committed reports/STATUS.md, or .harness/reports/STATUS.md by default): operators x
backends x dtypes x device classes at a glance."""

from __future__ import annotations

import json
from pathlib import Path

from ..across.compare import load_saved, mark
from ..judge.judgement import counts, judge_cells
from ..model.spec import short_dtype
from ..store.reports import DEFAULT_REPORT_ROOT, atomic_write, latest_run, load, operators_in
from .perf_targets import target_cells


def _target_lines(root: Path) -> list[str]:
    """The declared speed / memory targets as the committed GPU bench reports judged them."""
    rows = []
    for j in sorted(root.glob("bench-*.json")):
        payload = json.loads(j.read_text())
        prov = payload.get("provenance", {})
        for c in payload.get("targets", []):
            rows.append(f"| {payload['operator']} | {c['backend']} | {c['case']} | {target_cells(c)} | "
                        f"[{prov.get('device', '?')}, `{prov.get('commit', '?')}`]({j.stem}.md) |")
    if not rows:
        return []
    return ["", "## Performance targets", "",
            "Each operator's declared targets (its cases module) on the GPU bench shapes, judged on the committed "
            "`harness bench` figures (same-run baselines).", "",
            "| operator | backend | case | target | measured | | bench report |",
            "|---|---|---|---|---|---|---|"] + rows


def _entry(row: dict[str, int]) -> str:
    """One pivot cell: passes over cells run, then what did not pass, counted apart. A green mark only
    where everything that ran passed and nothing is declared behind the floor."""
    fail = row["FAIL"] + row["REGRESSION"] + sum(row[s] for s in ("SHAPE", "ERROR", "CRASH", "TIMEOUT"))
    ran = row["PASS"] + row["XFAIL"] + fail
    if not ran:
        return f"⏭ {row['SKIP']} skip" if row["SKIP"] else ""
    sign = "❌" if fail else ("⚠️" if row["XFAIL"] else "✅")
    parts = [f"{sign} {row['PASS']}/{ran}"]
    if fail - row["REGRESSION"]:
        parts.append(f"{fail - row['REGRESSION']} fail" + (f" ({row['marginal']} marginal)" if row["marginal"] else ""))
    if row["REGRESSION"]:
        parts.append(f"{row['REGRESSION']} regressed")
    if row["XFAIL"]:
        parts.append(f"{row['XFAIL']} declared")
    return ", ".join(parts)


def _regenerate(root: Path) -> str:
    """The command that redraws this folder's STATUS.md (the default folder needs no --report)."""

    return "harness report" if Path(root) == Path(DEFAULT_REPORT_ROOT) else f"harness report --report {root}"


def write_status(root: Path) -> Path:
    table: dict[tuple[str, str], dict[tuple[str, str], dict[str, int]]] = {}
    columns: set[tuple[str, str]] = set()
    provenance = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for op in operators_in(d):
            cells, runs = load(d, op)
            if not cells:
                continue
            latest = latest_run(runs) if runs else {}
            provenance.append(
                f"- `{d.name}`/{op}: {latest.get('device', '?')}, {latest.get('date', '?')}, "
                f"commit `{latest.get('commit', '?')}`"
            )
            judged = judge_cells(cells, d.name)
            mark(judged, load_saved(d, op, cells, runs))  # regressions against a --compare reference
            for (b, dt), row in counts(judged).items():
                table.setdefault((op, b), {})[(d.name, dt)] = row
                columns.add((d.name, dt))
    cols = sorted(columns, key=lambda c: (c[0] != "cpu", c[0], ("float32", "bfloat16", "float16").index(c[1])
                                          if c[1] in ("float32", "bfloat16", "float16") else 9))
    lines = [
        "# Status",
        "",
        "Conformance cells per operator and backend (rows) by device class and dtype (columns): passes over "
        "cells that ran, then failures (of which marginal: every ratio <= 2, no localized structure) and "
        "cells inside a declared precision gap, counted apart. Judged from the stored figures under today's "
        f"rules and declarations; regenerate with `{_regenerate(root)}`. Each operator's report is linked below.",
        "",
        "| operator | backend | " + " | ".join(f"{dc} {short_dtype(dt)}" for dc, dt in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for (op, b), row in sorted(table.items()):
        lines.append(f"| {op} | {b} | " + " | ".join(_entry(row[c]) if c in row else "" for c in cols) + " |")
    reports = sorted({f"[{d.name}/{op}]({d.name}/{op}.md)" for d in root.iterdir() if d.is_dir()
                      for op in operators_in(d)})
    lines += ["", "Reports: " + ", ".join(reports)]
    lines += _target_lines(root)
    lines += ["", "Provenance of the newest run per report:", ""] + provenance
    out = root / "STATUS.md"
    atomic_write(out, "\n".join(lines) + "\n")
    return out
