"""What the local rule (docs/design.md, "The local rule") changes in report folders: every cell whose
verdict differs from the global criteria's alone, every cell that fails, and the worst local ratios of
components outside a declared gap.

    python .ci/local_ratios.py DIR [DIR ...]      # DIR: a --report folder (its device-class folders inside)

Exit 1 when the local rule changed a verdict, so that a false-alarm sweep over seeds reads as one status.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from harness.judge.judgement import judge_cell
from harness.model.records import CellRecord
from harness.store.reports import load, operators_in


def _global_only(c: CellRecord) -> CellRecord:
    return dataclasses.replace(c, components=[dataclasses.replace(f, local=None) for f in c.components])


def _cells(dirs: list[str]):
    for d in dirs:
        for folder in sorted(p for p in Path(d).iterdir() if p.is_dir()):
            for op in operators_in(folder):
                yield from load(folder, op)[0]


def main(dirs: list[str], top: int = 10) -> int:
    cells = changed = 0
    worst: list[tuple[float, float, str]] = []
    for c in _cells(dirs):
        cells += 1
        new, old = judge_cell(c), judge_cell(_global_only(c))
        name = f"{c.operator}/{c.backend}/{c.dtype}/{c.case.name} seed {c.seed}"
        if new.shown != old.shown or new.failing:
            changed += new.shown != old.shown
            why = "; ".join(f"{x.name}: {x.reason}" for x in new.failed_components)
            print(f"{old.shown:>7} -> {new.shown:<7} {name}: {why[:300]}")
        if new.shown == "XFAIL":
            continue
        for x in new.components:
            if x.verdict.ratio_local and x.figures.local is not None:
                worst.append((x.verdict.ratio_local, x.verdict.global_ratio,
                              f"{name} {x.name} @ {x.figures.local.tile_text()}"))
    worst.sort(reverse=True)
    print(f"{cells} cells, {changed} verdicts changed by the local rule; worst local ratios outside declared gaps:")
    for ratio, glob, what in worst[:top]:
        print(f"  {ratio:.3f} (global {glob:.3f}) {what}")
    return 1 if changed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
