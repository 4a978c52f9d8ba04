"""The records of two report folders compared cell by cell (.ci/same-figures): the same figures, contracts and
judged status, timings and run ids aside. Exit 1 where any cell differs or is missing."""

import sys
from pathlib import Path

from harness.judge.judgement import judge_cell
from harness.store.reports import load, operators_in

old_root, new_root = Path(sys.argv[1]), Path(sys.argv[2])
SKIP = {"duration_s", "reference_s", "backend_s", "backend_again_s", "run_id", "worker", "peak_mem_mb",
        "backend_peak_mb", "peak_alloc_mb", "status", "ran_on", "schema"}
total = same = 0
diffs = []
for od in sorted(p for p in old_root.iterdir() if p.is_dir()):
    nd = new_root / od.name
    for op in operators_in(od):
        old = {c.id: c for c in load(od, op)[0]}
        new = {c.id: c for c in load(nd, op)[0]}
        if set(old) != set(new):
            diffs.append(f"{op}: cells differ: {len(old)} vs {len(new)}")
        for k in sorted(set(old) & set(new)):
            a, b = old[k].to_json(), new[k].to_json()
            fa = {x: v for x, v in a.items() if x not in SKIP}
            fb = {x: v for x, v in b.items() if x not in SKIP}
            total += 1
            ja, jb = judge_cell(old[k], device_class=od.name).shown, judge_cell(new[k], device_class=od.name).shown
            if fa == fb and ja == jb:
                same += 1
            else:
                keys = [x for x in set(fa) | set(fb) if fa.get(x) != fb.get(x)]
                diffs.append(f"{op} {k.backend} {k.dtype} {k.case}: {ja} vs {jb}; differ in {sorted(keys)}")
print(f"{same} of {total} cells: the same figures, contracts and judged status in both runs")
print("\n".join(diffs[:40]))
sys.exit(1 if diffs else 0)
