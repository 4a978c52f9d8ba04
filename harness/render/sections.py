"""Sections of an operator's report that read what the run kept beside its cells: the comparison with an
earlier run (--compare) and the minimal failing cases (harness/front/minimal.py)."""

from __future__ import annotations

import json

from ..across.compare import Comparison
from .terminal import fmt


def compared_section(comparison: Comparison | None) -> list[str]:
    """Regressions first (with both ratios and both commits), then new failures, improvements and what
    could not be compared."""
    if comparison is None:
        return []
    lines = [f"## Compared with `{comparison.ref}`", "", comparison.counts_line() + ".", ""]
    rows = [(c, ch) for c in comparison.regressed for ch in c.regressions]
    if rows:
        lines += ["**Regressions**" + (" (accepted)" if comparison.accepted else "") + ":", "",
                  "| case | backend | dtype | component | ratio | before | now | growth | commits |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c, ch in rows:
            lines.append(f"| `{c.cell.case.name}` | {c.cell.backend} | {c.cell.dtype} | {ch.component} | "
                         f"{ch.metric} | {fmt(ch.before)} | {fmt(ch.after)} | {ch.growth:.2f}x | "
                         f"`{c.ref_header.get('commit', '?')}` -> this run |")
        lines.append("")
    new = [c for c in comparison.cells if c.newly_failing]
    if new:
        lines += ["Passed in REF and fail now: " + ", ".join(
            f"`{c.cell.backend}/{c.cell.dtype}/{c.cell.case.name}`" for c in new) + ".", ""]
    better = [(c, ch) for c in comparison.cells for ch in c.improvements]
    if better:
        lines += ["Improved: " + "; ".join(f"`{c.cell.backend}/{c.cell.dtype}/{c.cell.case.name}` {ch.text()}"
                                           for c, ch in better[:20])
                  + (f"; and {len(better) - 20} more" if len(better) > 20 else "") + ".", ""]
    why: dict[str, int] = {}
    for c in comparison.not_comparable:
        why[c.why_not] = why.get(c.why_not, 0) + 1
    if why:
        lines += ["Not comparable: " + "; ".join(f"{n} cell(s): {w}" for w, n in sorted(why.items())) + ".", ""]
    return lines


def minimal_section(minimal: list[dict]) -> list[str]:
    """The smallest failing case the run found for each failing (backend, dtype) (harness/front/minimal.py)."""
    if not minimal:
        return []
    lines = ["## Minimal failing cases", "",
             "The smallest case found below each failing (backend, dtype)'s smallest failing case, failing the "
             "same way (start here):", ""]
    for m in minimal:
        case = m.get("case", {})
        lines.append(f"- **{m.get('backend')} / {m.get('dtype')} / {case.get('name')}** "
                     f"`{json.dumps(case.get('params', {}), sort_keys=True)}` (from {m.get('from')}): "
                     f"{m.get('status')}; `{m.get('repro')}`")
        lines += [f"  - {f}" for f in m.get("failing", [])]
    return lines + [""]
