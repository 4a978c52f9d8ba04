"""The bug zoo's mutation score: each mutant (harness/model/mutant_builds.py) run on its cases and judged
against what it expects."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..judge.diagnose import bad_slices
from ..judge.judgement import judge_cell
from ..measure.localize import matches
from ..model import registry
from ..model.mutant_builds import MutantError, check_edits
from ..model.records import CellRecord
from ..model.spec import Expectation
from ..run import runner
from ..store.provenance import device_class, run_provenance
from ..store.reports import atomic_write


def judge_expectation(exp: Expectation, cell: CellRecord) -> tuple[bool, list[str], str]:
    """Was the defect caught as expected in this cell? Returns (caught, problems, localization shown)."""
    problems: list[str] = []
    j = judge_cell(cell)
    comps = {c.name: c for c in j.components}
    status = j.shown
    if exp.status:
        if status not in exp.status.split("|"):
            said = f": {cell.error[:200]}" if cell.error else ""
            problems.append(f"status {status}, expected {exp.status}{said}")
    elif status in ("ERROR", "CRASH", "TIMEOUT", "SKIP"):
        problems.append(f"cell {status}: {cell.error[:200]}")
    for c in exp.fail:
        v = comps[c].verdict.verdict if c in comps else None
        if v not in ("FAIL", "SHAPE"):
            problems.append(f"{c} {v or 'missing'}, expected FAIL")
    for c in exp.passing:
        v = comps[c].verdict.verdict if c in comps else None
        if v != "PASS":
            problems.append(f"{c} {v or 'missing'}, expected PASS")
    for c in exp.zeros:
        if c not in comps or comps[c].verdict.kind != "all-zero":
            problems.append(f"{c} not reported as all zeros")
    contracts = {k.name: k for k, _ in j.contracts}
    for k in exp.contracts:
        if k not in contracts or contracts[k].ok:
            problems.append(f"contract {k} not reported violated")
    shown = []
    for comp, axes in exp.where.items():
        cj = comps.get(comp)
        for axis, pattern in axes.items():
            p = next((x for x in cj.figures.slices if x.axis == axis), None) if cj else None
            if p is None:
                problems.append(f"{comp}: no localization along {axis}")
                continue
            bad = bad_slices(p, cj.verdict)
            if not matches(pattern, bad, p.buckets):
                problems.append(f"{comp}: bad {axis} slices {bad} of {p.buckets}, expected {pattern}")
            else:
                shown.append(f"{comp} {axis}: {pattern}")
    if exp.hint:
        classes = {h.cls for c in j.failed_components for h in c.hints}
        if not classes & set(exp.hint.split("|")):
            problems.append(f"hint class {exp.hint} expected, got {', '.join(sorted(classes)) or 'none'}")
        else:
            shown.append(f"hint {exp.hint}")
    for c in j.failed_components:
        if c.where and not exp.where:
            shown.append(f"{c.name}: {c.where}")
    return not problems, problems, "; ".join(shown[:3])


def run_zoo(
    kernels: list[str],
    device: str,
    report_dir: str,
    timeout: float,
    only: list[str] | None = None,
    progress: bool = True,
) -> int:

    ops = registry.resolve_kernels(kernels)
    zoo = [m for m in registry.mutants() if m.operator in ops and (not only or m.id in only)]
    for m in [m for m in zoo if m.compare_only]:
        # inside the verdict's bound by design: caught by `harness run --compare REF`, not by a verdict
        print(f"{m.id}: compare-only (a defect inside the bound; `harness run --backend mutant:{m.id} --compare "
              f"REF` catches it), not counted")
    zoo = [m for m in zoo if not m.compare_only]
    if only:
        unknown = set(only) - {m.id for m in zoo}
        if unknown:
            print(
                f"harness mutants: error: unknown mutant(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(m.id for m in registry.mutants())}",
                file=sys.stderr,
            )
            return 2
    rows: list[dict[str, Any]] = []
    tasks, index = [], []
    for m in zoo:
        problems = check_edits(m)
        if problems:
            rows.append({"mutant": m.id, "status": "ERROR", "detail": "; ".join(problems), "m": m})
            continue
        plan_ok = True
        for j, exp in enumerate(m.expect):
            for backend in (f"mutant:{m.id}", m.backend):  # the mutant, and its unmutated control
                try:
                    p = runner.plan(
                        [m.operator], "smoke", [backend], [exp.dtype], device, repeats=1, cases={m.operator: [exp.case]}
                    )
                except (KeyError, ValueError, MutantError) as e:
                    rows.append({"mutant": m.id, "status": "ERROR", "detail": str(e), "m": m})
                    plan_ok = False
                    break
                for t in p.tasks:
                    tasks.append(t)
                    index.append((m.id, j, backend))
            if not plan_ok:
                break
    results: dict[tuple, CellRecord] = {}
    t0 = time.time()
    if tasks:
        plan = runner.Plan(tasks=tasks)
        done = runner.run(plan, registry.plugins_loaded(), lambda c: None, timeout=timeout)
        for c in done:
            for k, t in zip(index, tasks, strict=True):
                if t.backend == c.backend and t.case.name == c.case.name and t.dtype == c.dtype:
                    results[k] = c
    for m in zoo:
        if any(r["mutant"] == m.id for r in rows):
            continue
        checks, skipped = [], []
        for j, exp in enumerate(m.expect):
            cell, control = results.get((m.id, j, f"mutant:{m.id}")), results.get((m.id, j, m.backend))
            if cell is None or cell.status.value == "SKIP":
                skipped.append(cell.error or "not run" if cell else "not run")
                continue
            caught, problems, shown = judge_expectation(exp, cell)
            control_ok = control is not None and judge_cell(control).shown == "PASS"
            if control is not None and not control_ok:
                problems.append(f"control (unmutated {m.backend}) is {judge_cell(control).shown} on this case")
                caught = False
            checks.append(
                {
                    "case": exp.case.name,
                    "dtype": exp.dtype,
                    "caught": caught and control_ok,
                    "problems": problems,
                    "shown": shown,
                    "status": judge_cell(cell).shown,
                    "failing": [c.name for c in judge_cell(cell).failed_components],
                    "hints": sorted({h.cls for c in judge_cell(cell).failed_components for h in c.hints}),
                }
            )
        if not checks:
            rows.append({"mutant": m.id, "status": "SKIP", "detail": "; ".join(sorted(set(skipped))), "m": m})
        else:
            ok = all(c["caught"] for c in checks)
            rows.append(
                {
                    "mutant": m.id,
                    "status": "CAUGHT" if ok else "MISSED",
                    "checks": checks,
                    "m": m,
                    "detail": "; ".join(p for c in checks for p in c["problems"]),
                }
            )
    ran = [r for r in rows if r["status"] in ("CAUGHT", "MISSED", "ERROR")]
    caught = [r for r in rows if r["status"] == "CAUGHT"]
    score = len(caught) / len(ran) if ran else 1.0
    lines = [f"{'mutant':<26} {'backend':<22} {'expected':<34} {'result':<7} localization / detail"]
    for r in rows:
        m = r["m"]
        exp = "; ".join(filter(None, [", ".join(e.fail) or (e.status or "") for e in m.expect]))[:34]
        where = "; ".join(c["shown"] for c in r.get("checks", []) if c["shown"]) or r.get("detail", "")
        lines.append(f"{m.id:<26} {m.operator + '/' + m.backend:<22} {exp:<34} {r['status']:<7} {where[:120]}")
    lines.append(
        f"mutation score: {len(caught)}/{len(ran)} caught ({score:.0%}); "
        f"{sum(r['status'] == 'SKIP' for r in rows)} skipped (backend cannot run here); {time.time() - t0:.0f} s"
    )
    print("\n".join(lines))
    prov = run_provenance(device)
    out = Path(report_dir) / device_class(device)
    md = [
        "# Bug zoo",
        "",
        f"Commit `{prov['commit']}`, {prov['date']}, {prov['device']}.",
        "",
        f"**Mutation score: {len(caught)}/{len(ran)} caught ({score:.0%})**; skipped here: "
        f"{sum(r['status'] == 'SKIP' for r in rows)}.",
        "",
        "| mutant | seed | operator / backend | planted defect | case | expected | result | hints | shown |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["m"]
        for c in r.get("checks", [{"case": "—", "shown": r.get("detail", "")}]):
            exp = next((e for e in m.expect if e.case.name == c["case"]), None)
            expected = (
                (
                    ", ".join(exp.fail)
                    + (f" {exp.status}" if exp.status else "")
                    + (f" contracts {','.join(exp.contracts)}" if exp.contracts else "")
                    + (f" hint {exp.hint}" if exp.hint else "")
                )
                if exp
                else ""
            )
            md.append(
                f"| {m.id} | {m.seed} | {m.operator}/{m.backend} | {m.description} | {c['case']} | {expected} | "
                f"{r['status']} | {', '.join(c.get('hints', []))} | "
                f"{c.get('shown') or '; '.join(c.get('problems', [])) or r.get('detail', '')} |"
            )
    atomic_write(out / "mutants.md", "\n".join(md) + "\n")
    atomic_write(
        out / "mutants.json",
        json.dumps(
            {
                "provenance": prov,
                "score": score,
                "caught": len(caught),
                "ran": len(ran),
                "rows": [{k: v for k, v in r.items() if k != "m"} for r in rows],
            },
            indent=1,
            default=str,
        ),
    )
    return 0 if len(caught) == len(ran) else 1
