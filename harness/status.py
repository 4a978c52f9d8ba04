"""reports/STATUS.md: operators x backends x dtypes x device classes at a glance."""

from __future__ import annotations

from pathlib import Path

from .report import atomic_write, latest_run, load, summary


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
    lines += ["", "Provenance of the newest run per report:", ""] + provenance
    out = root / "STATUS.md"
    atomic_write(out, "\n".join(lines) + "\n")
    return out
