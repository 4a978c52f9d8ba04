"""reports/STATUS.md: operators x backends x dtypes x device classes at a glance."""

from __future__ import annotations

import json
from pathlib import Path

from .bench import target_cells
from .report import atomic_write, latest_run, load, summary


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


def write_status(root: Path) -> Path:
    rows = []
    provenance = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for j in sorted(d.glob("*.jsonl")):
            cells, runs = load(d, j.stem)
            if not cells:
                continue
            latest = latest_run(runs) if runs else {}
            provenance.append(
                f"- `{d.name}`/{j.stem}: {latest.get('device', '?')}, {latest.get('date', '?')}, "
                f"commit `{latest.get('commit', '?')}`"
            )
            for (b, dt), counts in summary(cells).items():
                rows.append((j.stem, b, dt, d.name, counts))
    lines = [
        "# Status",
        "",
        "Each cell: pass / declared gap (a dtype the backend declares behind the floor, e.g. "
        "eager fp16) / fail (fail, shape, error, crash, timeout) / skip counts of conformance cells; the link "
        "goes to the detailed report. Regenerate with `harness report`.",
        "",
        "| operator | backend | dtype | device class | pass | declared gap | fail | skip |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op, b, dt, dc, c in sorted(rows):
        fail = sum(c[s] for s in ("FAIL", "SHAPE", "ERROR", "CRASH", "TIMEOUT"))
        mark = "✅" if fail == 0 and c["PASS"] else ("❌" if fail else ("⚠️" if c["XFAIL"] else "⏭"))
        lines.append(
            f"| {op} | {b} | {dt} | [{dc}]({dc}/{op}.md) | {mark} {c['PASS']} | {c['XFAIL'] or ''} | "
            f"{fail or ''} | {c['SKIP'] or ''} |"
        )
    lines += _target_lines(root)
    lines += ["", "Provenance of the newest run per report:", ""] + provenance
    out = root / "STATUS.md"
    atomic_write(out, "\n".join(lines) + "\n")
    return out
