"""The table of hints the fresh mutants got in a report directory (after tests/diagnosis/run_fresh.sh).

    python tests/diagnosis/hint_table.py REPORT_DIR

Per mutant: operator / backend, true cause (fresh_mutants.TRUE_CAUSE), failing cells / cells, the
distinct hints printed on its failing components with counts (one count per failing component of a
failing cell; "(no hint)" where a failing component printed none), the cause classes those hints name,
and a suggested grade:

  right: some hint names the true cause class and no hint names another class;
  wrong: some hint names a class that is not the true cause;
  none:  no failing component printed a hint.

The hint -> class map (CLASS_OF) is written for the hint wording of harness/measure/localize.py at the commit the
table was made at (350e7a5); hints it does not know are listed as "?" and must be graded by hand.
The grade is a suggestion for the table in fresh-mutants-before.md, which is checked by hand.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (pattern, classes the hint names); first match wins, so specific patterns come first
CLASS_OF: list[tuple[str, tuple[str, ...]]] = [
    (r"offsets of later blocks are wrong", ("later-block-offsets",)),
    (r"stride is wrong", ("stride", "never-written")),
    (r"accumulation across .* blocks lost", ("accumulation-lost",)),
    (r"a tail mask or bound", ("tail",)),
    (r"accumulated into slot 0", ("slot-0",)),
    (r"^\S+ [\d, -]+ never written$", ("never-written",)),
    (r"never written: a missing store", ("never-written",)),
    (r"gradient never produced", ("never-written",)),
    (r"NaN/Inf where the oracle is finite", ("never-written", "overflow", "tail")),
    (r"NaN/Inf positions differ", ("overflow",)),
    (r"right direction, wrong magnitude", ("scale",)),
    (r"sign flipped", ("sign",)),
    (r"diffuse error above the floor", ("formula",)),
    (r"uncorrelated with the oracle", ("formula",)),
]


def classes_of(hint: str) -> tuple[str, ...]:
    found: list[str] = []
    for part in (p.strip() for p in hint.split("; ") if p.strip()):
        for pat, cls in CLASS_OF:
            if re.search(pat, part):
                found += [c for c in cls if c not in found]
                break
        else:
            found.append("?")
    return tuple(found)


def grade(true: str, hint_classes: list[tuple[str, ...]]) -> str:
    named = [h for h in hint_classes if h]
    if not named:
        return "none"
    # a hint naming several alternatives names the true cause if one of them is it; it is wrong when
    # none of them is; a "?" (unknown wording) needs a hand grade
    if any("?" in h for h in named):
        return "?"
    if any(true not in h for h in named):
        return "wrong"
    return "right"


class NewSchema(Exception):
    """Cells of record schema >= 2 carry figures only; their hints are derived when a report renders."""


def latest_cells(report: Path) -> dict[str, list[dict]]:
    """backend -> its latest cell per (dtype, case) over every operator JSONL (schema-1 cells: hints stamped
    in at run time, as the harness wrote them up to 350e7a5)."""
    by: dict[tuple, dict] = {}
    for f in sorted((report / "cpu").glob("*.jsonl")):
        for line in f.open():
            d = json.loads(line)
            if "components" not in d and "status" not in d:
                continue
            if int(d.get("schema", 1)) >= 2:
                raise NewSchema(f"{f}: cells of record schema {d['schema']} hold no hints; read the hints from the "
                                f"rendered {f.with_suffix('.md').name} (or derive them with the harness's judgement "
                                "code) instead of this script")
            by[(d["operator"], d["backend"], d["dtype"], d["case"]["name"])] = d
    out: dict[str, list[dict]] = {}
    for (_op, backend, _dt, _case), d in by.items():
        out.setdefault(backend, []).append(d)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    report = Path(argv[0])
    sys.path.insert(0, str(HERE.parent.parent))
    from harness.model import registry

    registry.load_plugin(str(HERE / "fresh_mutants.py"))
    mod = next(m for n, m in sys.modules.items() if n.startswith("harness_plugin_fresh_mutants"))
    true_cause: dict[str, tuple[str, str]] = mod.TRUE_CAUSE
    mutants = {m.id: m for m in registry.mutants() if m.id in true_cause}
    try:
        cells = latest_cells(report)
    except NewSchema as e:
        print(f"hint_table.py: {e}", file=sys.stderr)
        return 3
    times = {}
    tf = report / "fresh-times.tsv"
    if tf.exists():
        for line in tf.read_text().splitlines()[1:]:
            mid, _op, _rc, secs = line.split("\t")
            times[mid] = secs
    rows = ["| mutant | operator / backend | true cause | failing cells / cells | failing on | hints on failing "
            "components (count) | classes named | suggested grade | sweep s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for mid, (cls, _detail) in true_cause.items():
        m = mutants[mid]
        cs = cells.get(f"mutant:{mid}", [])
        failing = [c for c in cs if c["status"] != "PASS"]
        hints: Counter[str] = Counter()
        for c in failing:
            for comp in c.get("components", []):
                if comp["verdict"] != "PASS":
                    hints[comp.get("hint") or "(no hint)"] += 1
            if not c.get("components"):
                hints[f"({c['status']}: {c.get('error', '')[:80]})"] += 1
        named = [classes_of(h) for h in hints if not h.startswith("(")]
        g = grade(cls, named)
        where = sorted({f"{c['case']['name']}" for c in failing})
        dtypes = sorted({c["dtype"] for c in failing})
        htxt = "<br>".join(f"{n}x {h}" for h, n in hints.most_common()) or "—"
        ctxt = ", ".join(sorted({x for h in named for x in h})) or "—"
        rows.append(f"| {mid} | {m.operator}/{m.backend} | {cls} | {len(failing)} / {len(cs)} | "
                    f"{', '.join(where)} ({'/'.join(dtypes)}) | {htxt} | {ctxt} | {g} | {times.get(mid, '')} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
