"""The bug zoo's mutation score: each mutant (harness/model/mutant_builds.py) run on its cases and judged
against what it expects."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..judge.diagnose import bad_slices
from ..judge.judgement import CellJudgement, judge_cell, judge_cells
from ..measure.localize import matches
from ..model import registry
from ..model.mutant_builds import MutantError, check_edits
from ..model.records import CellRecord
from ..model.spec import Expectation, Mutant
from ..run.plan import Task, plan
from ..run.pool import LocalPool
from ..store.provenance import device_class, run_provenance, same_code
from ..store.reports import atomic_write


def judge_expectation(exp: Expectation, cell: CellRecord, judged: CellJudgement | None = None
                      ) -> tuple[bool, list[str], str]:
    """Was the defect caught as expected in this cell? Returns (caught, problems, localization shown).
    ``judged``: the cell judged among the mutant's other cells (a layout twin's hint needs its base cell)."""
    problems: list[str] = []
    j = judged or judge_cell(cell)
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
    resume: bool = False,
) -> int:
    """Run each mutant and its unmutated control on the mutant's cases, score the catches, print the table
    and write ``mutants.md`` / ``mutants.json``; 0 when every counted mutant was caught, 1 if not, 2 for an
    unknown mutant in ``only``. Each mutant is scored, printed and written to the reports as soon as its cells
    are done, so a zoo stopped part way (a call's time limit, Ctrl-C) leaves the mutants it finished, with the
    report saying how many were still running; ``resume`` keeps the mutants that a run of this code (this commit,
    or the same code digest and versions: harness/store/provenance.py) already scored in that report and runs the
    others."""
    zoo = _counted_mutants(registry.resolve_kernels(kernels), only)
    if only:
        unknown = set(only) - {m.id for m in zoo}
        if unknown:
            print(
                f"harness mutants: error: unknown mutant(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(m.id for m in registry.mutants())}",
                file=sys.stderr,
            )
            return 2
    done = _resumed(zoo, device, report_dir) if resume else {}  # mutant id -> its scored row
    if resume:
        print(f"resumed: {len(done)} mutant(s) already scored by a run of this code; {len(zoo) - len(done)} to run")
    errors, tasks, index = _plan_zoo([m for m in zoo if m.id not in done], device)
    t0 = time.time()
    done.update({r["mutant"]: r for r in errors})
    to_score = [m for m in zoo if m.id not in done]
    needs = {m.id: {k for k in index if k[0] == m.id} for m in to_score}
    print("\n".join(_table(errors)), flush=True)

    def in_zoo_order() -> list[dict[str, Any]]:
        return [done[m.id] for m in zoo if m.id in done]

    def score_finished(results: dict[tuple, CellRecord]) -> None:
        fresh = [m for m in to_score if m.id not in done and needs[m.id] <= results.keys()]
        if not fresh:
            return
        done.update({m.id: _score(m, results) for m in fresh})
        # written before it is printed: what the terminal shows is on disk when the run is stopped
        _write_reports(in_zoo_order(), device, report_dir, pending=[m.id for m in zoo if m.id not in done])
        print("\n".join(_table([done[m.id] for m in fresh])[1:]), flush=True)

    results = _run_cells(tasks, index, timeout, score_finished)
    score_finished(results)  # mutants without a cell to wait for
    done.update({m.id: _score(m, results) for m in to_score if m.id not in done})
    rows = in_zoo_order()
    caught, ran, score, skipped = _tally(rows)
    print(f"mutation score: {caught}/{ran} caught ({score:.0%}); {skipped} skipped (backend cannot run here); "
          f"{time.time() - t0:.0f} s")
    _write_reports(rows, device, report_dir)
    return 0 if caught == ran else 1


def _resumed(zoo: list[Mutant], device: str, report_dir: str) -> dict[str, dict[str, Any]]:
    """The rows of this zoo's mutants that the report folder's mutants.json holds from a run of this code (a zoo
    stopped part way), by mutant id; {} from other code."""
    path = Path(report_dir) / device_class(device) / "mutants.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(old, dict) or not same_code(old.get("provenance", {}), run_provenance(device)):
        return {}
    by_id = {m.id: m for m in zoo}
    return {r["mutant"]: {**r, "m": by_id[r["mutant"]]} for r in old.get("rows", [])
            if isinstance(r, dict) and r.get("mutant") in by_id and r.get("status") in SCORED}


SCORED = ("CAUGHT", "MISSED", "SKIP", "ERROR")


def _tally(rows: list[dict[str, Any]]) -> tuple[int, int, float, int]:
    """(caught, ran, score, skipped) of scored rows: ERROR counts as run and not caught."""
    ran = sum(r["status"] in ("CAUGHT", "MISSED", "ERROR") for r in rows)
    caught = sum(r["status"] == "CAUGHT" for r in rows)
    return caught, ran, caught / ran if ran else 1.0, sum(r["status"] == "SKIP" for r in rows)


def _counted_mutants(ops: list[str], only: list[str] | None) -> list[Mutant]:
    """The zoo's mutants of these operators (those named in ``only``), less the compare-only ones, which are
    named and not counted."""
    zoo = [m for m in registry.mutants() if m.operator in ops and (not only or m.id in only)]
    for m in [m for m in zoo if m.compare_only]:
        # inside the verdict's bound by design: caught by `harness run --compare REF`, not by a verdict
        print(f"{m.id}: compare-only (a defect inside the bound; `harness run --backend mutant:{m.id} --compare "
              f"REF` catches it), not counted")
    return [m for m in zoo if not m.compare_only]


def _plan_zoo(zoo: list[Mutant], device: str) -> tuple[list[dict[str, Any]], list[Task], list[tuple]]:
    """The ERROR rows of mutants whose edits do not apply or that cannot be planned, the tasks of the others
    (each expectation's case for the mutant and for its unmutated control), and each task's (mutant id,
    expectation index, backend)."""
    rows: list[dict[str, Any]] = []
    tasks: list[Task] = []
    index: list[tuple] = []
    for m in zoo:
        problems = check_edits(m)
        if problems:
            rows.append({"mutant": m.id, "status": "ERROR", "detail": "; ".join(problems), "m": m})
            continue
        try:
            for j, exp in enumerate(m.expect):
                for backend in (f"mutant:{m.id}", m.backend):  # the mutant, and its unmutated control
                    p = plan([m.operator], "smoke", [backend], [exp.dtype], device, repeats=1,
                             cases={m.operator: [exp.case]})
                    tasks += p.tasks
                    index += [(m.id, j, backend)] * len(p.tasks)
        except (KeyError, ValueError, MutantError) as e:  # the tasks planned before still run, unscored
            rows.append({"mutant": m.id, "status": "ERROR", "detail": str(e), "m": m})
    return rows, tasks, index


def _run_cells(tasks: list[Task], index: list[tuple], timeout: float,
               on_filed: Callable[[dict[tuple, CellRecord]], None]) -> dict[tuple, CellRecord]:
    """Every task on a local pool of workers (a mutant that crashes or hangs costs its cell only), each cell
    filed under the (mutant id, expectation index, backend) of its task as it finishes; ``on_filed`` sees the
    results so far after each."""
    results: dict[tuple, CellRecord] = {}
    if not tasks:
        return results

    def file(c: CellRecord) -> None:
        for k, t in zip(index, tasks, strict=True):
            if t.backend == c.backend and t.case.name == c.case.name and t.dtype == c.dtype:
                results[k] = c
        on_filed(results)

    with LocalPool(registry.plugins_loaded(), timeout=timeout) as pool:
        pool.run(tasks, file)
    return results


def _score(m: Mutant, results: dict[tuple, CellRecord]) -> dict[str, Any]:
    """The mutant's row: CAUGHT when every expectation that ran was caught with a passing control, MISSED
    if not, SKIP when none ran here."""
    checks, skipped = [], []
    mine = [c for j in range(len(m.expect)) if (c := results.get((m.id, j, f"mutant:{m.id}"))) is not None]
    judged = {x.record.id: x for x in judge_cells(mine)}
    for j, exp in enumerate(m.expect):
        cell, control = results.get((m.id, j, f"mutant:{m.id}")), results.get((m.id, j, m.backend))
        if cell is None or cell.status.value == "SKIP":
            skipped.append(cell.error or "not run" if cell else "not run")
            continue
        checks.append(_check(m, exp, cell, control, judged.get(cell.id)))
    if not checks:
        return {"mutant": m.id, "status": "SKIP", "detail": "; ".join(sorted(set(skipped))), "m": m}
    ok = all(c["caught"] for c in checks)
    return {
        "mutant": m.id,
        "status": "CAUGHT" if ok else "MISSED",
        "checks": checks,
        "m": m,
        "detail": "; ".join(p for c in checks for p in c["problems"]),
    }


def _check(m: Mutant, exp: Expectation, cell: CellRecord, control: CellRecord | None,
           judged: CellJudgement | None = None) -> dict[str, Any]:
    """One expectation's check: caught only where the unmutated control passes the same case."""
    caught, problems, shown = judge_expectation(exp, cell, judged)
    control_ok = control is not None and judge_cell(control).shown == "PASS"
    if control is not None and not control_ok:
        problems.append(f"control (unmutated {m.backend}) is {judge_cell(control).shown} on this case")
        caught = False
    j = judged or judge_cell(cell)
    return {
        "case": exp.case.name,
        "dtype": exp.dtype,
        "caught": caught and control_ok,
        "problems": problems,
        "shown": shown,
        "status": j.shown,
        "failing": [c.name for c in j.failed_components],
        "hints": sorted({h.cls for c in j.failed_components for h in c.hints}),
    }


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'mutant':<26} {'backend':<22} {'expected':<34} {'result':<7} localization / detail"]
    for r in rows:
        m = r["m"]
        exp = "; ".join(filter(None, [", ".join(e.fail) or (e.status or "") for e in m.expect]))[:34]
        where = "; ".join(c["shown"] for c in r.get("checks", []) if c["shown"]) or r.get("detail", "")
        lines.append(f"{m.id:<26} {m.operator + '/' + m.backend:<22} {exp:<34} {r['status']:<7} {where[:120]}")
    return lines


def _expected(exp: Expectation | None) -> str:
    """What the mutant's expectation asks for, as the markdown table shows it."""
    if exp is None:
        return ""
    return (", ".join(exp.fail) + (f" {exp.status}" if exp.status else "")
            + (f" contracts {','.join(exp.contracts)}" if exp.contracts else "")
            + (f" hint {exp.hint}" if exp.hint else ""))


def _write_reports(rows: list[dict[str, Any]], device: str, report_dir: str, pending: Sequence[str] = ()) -> None:
    """``mutants.md`` and ``mutants.json`` in the report folder of this device class; ``pending``: the ids of
    mutants still running when this was written (the reports of a zoo in progress, or of one stopped part way)."""
    caught, ran, score, skipped = _tally(rows)
    prov = run_provenance(device)
    out = Path(report_dir) / device_class(device)
    md = [
        "# Bug zoo",
        "",
        f"Commit `{prov['commit']}`, {prov['date']}, {prov['device']}.",
        "",
        f"**Mutation score: {caught}/{ran} caught ({score:.0%})**; skipped here: {skipped}.",
        "",
    ]
    if pending:
        md += [f"**Partial**: {len(pending)} more mutant(s) were still running when this was written "
               f"({', '.join(pending)}); a zoo stopped part way leaves the ones it finished (`--resume` runs "
               "the rest).", ""]
    md += [
        "| mutant | seed | operator / backend | planted defect | case | expected | result | hints | shown |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["m"]
        for c in r.get("checks", [{"case": "—", "shown": r.get("detail", "")}]):
            expected = _expected(next((e for e in m.expect if e.case.name == c["case"]), None))
            md.append(
                f"| {m.id} | {m.seed} | {m.operator}/{m.backend} | {m.description} | {c['case']} | {expected} | "
                f"{r['status']} | {', '.join(c.get('hints', []))} | "
                f"{c.get('shown') or '; '.join(c.get('problems', [])) or r.get('detail', '')} |"
            )
    atomic_write(out / "mutants.md", "\n".join(md) + "\n")
    summary = {"provenance": prov, "score": score, "caught": caught, "ran": ran, "pending": list(pending),
               "rows": [{k: v for k, v in r.items() if k != "m"} for r in rows]}
    atomic_write(out / "mutants.json", json.dumps(summary, indent=1, default=str))
