"""The table of diagnoses the fresh mutants get from today's rules, from a report directory of their sweeps
(tests/diagnosis/run_fresh.sh REPORT_DIR): per mutant its failing cells, the hint classes on its failing
components (harness/judge/diagnose.py) and the sweep-level causes (harness/judge/causes.py), graded against
fresh_mutants.TRUE_CAUSE:

  right: the evidence the true cause calls for is there (EVIDENCE below: a hint class, or a sweep-level
         cause naming the feature) and no hint names another cause;
  wrong: a hint names a cause that is not the bug ("no structure found" names none);
  none:  neither.

    python tests/diagnosis/judged_table.py REPORT_DIR > table.md
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

# what names each mutant's true cause: hint classes, and a pattern a sweep-level cause's features match
EVIDENCE: dict[str, tuple[set[str], str | None]] = {
    "fresh-lazy-dtau-batch0": (set(), r"\bB > 1\b"),
    # dbias[:, W-1] comes out zero: "zeros" (never accumulated) names the effect, "tail" the mask
    "fresh-lazy-dbias-mask-w": ({"tail", "zeros"}, None),
    "fresh-lazy-dv-scaled": ({"scale"}, None),
    "fresh-xent-row-grad-ignored": ({"per-slice-scale"}, r"reduction = none"),
    # T < 16: every tile dropped, dbias and dalpha all zeros: "zeros" (never accumulated) names the effect
    "fresh-mhc-dbias-tail-tile": ({"tail", "zeros"}, r"not a multiple of"),
    "fresh-xent-dh-weight-stride": ({"stride"}, r"weight|layout"),
    "fresh-xent-smoothing-uniform-dropped": (set(), r"smoothing"),
}
NAMES_NOTHING = {"none", "needs-rerun"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    report = Path(argv[0]) / "cpu"
    sys.path.insert(0, str(HERE.parent.parent))
    from harness.judge.causes import causes
    from harness.judge.judgement import judge_cell
    from harness.model import registry
    from harness.store.reports import load

    registry.load_plugin(str(HERE / "fresh_mutants.py"))
    mod = next(m for n, m in sys.modules.items() if n.startswith("harness_plugin_fresh_mutants"))
    rows = ["| mutant | true cause | failing cells / cells | hint classes on failing components | sweep-level "
            "causes | grade |", "|---|---|---|---|---|---|"]
    grades = Counter()
    for mid, (cls, detail) in mod.TRUE_CAUSE.items():
        m = next(x for x in registry.mutants() if x.id == mid)
        judged = [judge_cell(c, device_class="cpu") for c in load(report, m.operator)[0]
                  if c.backend == f"mutant:{mid}"]
        failing = [j for j in judged if j.failing]
        hints = Counter(h.cls for j in failing for c in j.failed_components for h in c.hints)
        found = [c for c in causes(judged)]
        want_hints, want_cause = EVIDENCE[mid]
        named = {h for h in hints if h not in NAMES_NOTHING}
        evidence = bool(named & want_hints) or any(
            want_cause and re.search(want_cause, f) for c in found for f in c.features)
        grade = "wrong" if named - want_hints else ("right" if evidence else "none")
        grades[grade] += 1
        hint_text = ", ".join(f"{k} x{v}" for k, v in hints.most_common()) or "—"
        cause_text = "<br>".join(c.text() for c in found) or "—"
        rows.append(f"| {mid} | {cls}: {detail} | {len(failing)}/{len(judged)} | {hint_text} | {cause_text} | "
                    f"{grade} |")
    print("\n".join(rows))
    print(f"\n{grades['right']} right, {grades['wrong']} wrong, {grades['none']} none")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
