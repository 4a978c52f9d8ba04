"""Reports: cell records appended to ``<dir>/<device-class>/<operator>.jsonl`` as they finish, judged
and rendered to ``<operator>.md`` and ``<operator>.json`` atomically (newest result per cell wins).

Rendering judges every stored record anew (harness/judge/judgement.py), under today's rules and the
declarations of the backends registered now: all wording is made here, from figures."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import multiprocessing
import os
import re
from pathlib import Path
from typing import Any

from ..across.compare import Comparison, load_saved
from ..across.compare import mark as mark_regressions
from ..judge.causes import causes
from ..judge.judgement import CellJudgement, counts, judge_cells
from ..model.records import CellRecord
from ..store.provenance import plugin_label
from ..store.reports import (
    add_run,
    append_line,
    atomic_write,
    latest_run,
    load,
    minimal_cases,
    record_line,
)
from .sections import compared_section, minimal_section
from .terminal import fmt

log = logging.getLogger("harness")


class ReportWriter:
    """Appends cells to JSONL files, one per operator, under ``root/<device_class>/``."""

    def __init__(self, root: str | Path, device_class: str, header: dict[str, Any]):
        self.dir = Path(root) / device_class
        self.dir.mkdir(parents=True, exist_ok=True)
        self.header = header
        self.started: set[str] = set()
        self.touched: list[str] = []

    def path(self, op: str) -> Path:
        return self.dir / f"{op}.jsonl"

    def begin(self, operators: list[str]) -> list[Path]:
        """Redraw each operator's report with this run in it, then write the run's header to its JSONL: until
        the run's cells arrive the report lists them as missing (none of them done yet, however many cells
        earlier runs left), so a run killed at any point (kill -9 included) leaves a report saying it is
        incomplete. The report is drawn before the header is written: a JSONL holding the header always has
        a report saying so beside it."""
        paths = []
        for op in operators:
            if op not in self.started:
                paths += render(self.dir, op, pending=self.run_record(op), pictures=False)
            self._start(op)
        return paths

    def _start(self, op: str) -> None:
        if op in self.started:
            return
        self.started.add(op)
        self.touched.append(op)
        append_line(self.path(op), json.dumps({"run": self.run_record(op)}))

    def run_record(self, op: str) -> dict[str, Any]:
        """The run's header as ``op``'s JSONL keeps it: with that operator's planned cells only."""
        return {**self.header, "planned": (self.header.get("planned") or {}).get(op)}

    def append(self, cell: CellRecord) -> None:
        cell.run_id = self.header.get("run_id")
        self._start(cell.operator)
        append_line(self.path(cell.operator), record_line(cell.to_json()))

    def render(self, pictures: bool = True) -> list[Path]:
        """Each operator's report redrawn; ``pictures=False`` (a redraw while the run goes on) draws no
        heatmap and links only those already drawn from the same data."""
        return [p for op in self.touched for p in render(self.dir, op, pictures=pictures)]


def _params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


COLUMNS = ("pass", "xfail", "fail", "marginal", "shape", "error", "crash", "timeout", "skip")


def _count_row(row: dict[str, int]) -> str:
    """pass | declared | fail (of which marginal) | ... as table cells."""
    vals = [row["PASS"], row["XFAIL"], row["FAIL"] + row["REGRESSION"], row["marginal"], row["SHAPE"],
            row["ERROR"], row["CRASH"], row["TIMEOUT"], row["SKIP"]]
    return " | ".join(str(v) if v else "" for v in vals)


def _preset_of(c: CellRecord, runs: dict[str, dict]) -> str:
    return runs.get(c.run_id or "", {}).get("sizes") or "?"


def _main_run(cells: list[CellRecord], runs: dict[str, dict]) -> dict:
    """The run that produced most of the report's cells (the latest one on a tie)."""
    n: dict[str, int] = {}
    for c in cells:
        n[c.run_id or "?"] = n.get(c.run_id or "?", 0) + 1
    order = list(runs)
    best = max(n, key=lambda rid: (n[rid], order.index(rid) if rid in order else -1), default=None)
    return runs.get(best or "", latest_run(runs) if runs else {})


def render_markdown(op: str, cells: list[CellRecord], runs: dict[str, dict], device_class: str = "",
                    heat: dict[tuple, str] | None = None, comparison: Comparison | None = None,
                    minimal: list[dict] | None = None) -> str:
    judged = judge_cells(cells, device_class)
    mark_regressions(judged, comparison)
    main = _main_run(cells, runs) if runs else {}
    latest = latest_run(runs) if runs else {}
    lines = [f"# `{op}` conformance — {main.get('device', '?')}", ""]
    if main:
        v = main.get("versions", {})
        n_main = sum(1 for c in cells if c.run_id == main.get("run_id"))
        which = f"{n_main} of {len(cells)} cells come from" if cells else "No cell has a result yet:"
        lines += [
            f"{which} the run at commit `{main.get('commit')}`{_plugins_note(main)}, {main.get('date')}, "
            f"device class `{main.get('device_class')}`"
            f"{', Triton interpreted (TRITON_INTERPRET=1)' if main.get('interpreted') else ''}; "
            + ", ".join(f"{k} {val}" for k, val in v.items()) + ".", ""]
        if main.get("command"):
            lines += [f"Command: `{main['command']}`", ""]
    lines += _runs_section(cells, runs, main.get("run_id"))
    lines += _missing_section(cells, latest)
    lines += _summary_section(judged, runs)
    lines += minimal_section(minimal or [])
    lines += _failures_section(judged, runs, main.get("run_id"), heat or {})
    lines += compared_section(comparison)
    lines += _declared_section(judged)
    skips = sorted({(j.record.backend, j.record.error) for j in judged if j.shown == "SKIP"})
    if skips:
        lines += ["## Skipped", ""] + [f"- {b}: {why}" for b, why in skips] + [""]
    lines += _cases_section(judged, runs)
    return "\n".join(lines) + "\n"


def _runs_section(cells: list[CellRecord], runs: dict[str, dict], main_id: str | None) -> list[str]:
    from_runs: dict[Any, int] = {}
    for c in cells:
        from_runs[c.run_id] = from_runs.get(c.run_id, 0) + 1
    if len(from_runs) < 2:
        return []
    # each cell shows its latest result, so a report can mix runs (an interrupted sweep, a --case rerun):
    # say which, so an old result is never read as the current code's
    lines = ["Cells come from several runs (each cell shows its latest result):", ""]
    for rid, n in sorted(from_runs.items(), key=lambda kv: runs.get(kv[0], {}).get("date", ""), reverse=True):
        r = runs.get(rid, {})
        lines.append(f"- {n} cells: commit `{r.get('commit', '?')}`{_plugins_note(r)}, {r.get('date', '?')}, sizes "
                     f"`{r.get('sizes', '?')}`" + (f", `{r['command']}`" if r.get("command") else "")
                     + (" (most cells)" if rid == main_id else ""))
    return lines + [""]


def _plugins_note(run: dict) -> str:
    """The plugins a run loaded, each with the commit of its own repository, beside the harness's commit."""

    plugins = run.get("plugins") or []
    return f" ({'; '.join(plugin_label(p) for p in plugins)})" if plugins else ""


def missing_cells(cells: list[CellRecord], latest: dict) -> tuple[list[str], list[str]]:
    """The latest run's planned cells (CellId.planned) and those of them without a result."""
    planned = latest.get("planned") or []
    # a --resume run counts the results it reused from the runs it resumed
    mine = {latest.get("run_id"), *latest.get("resumes", [])}
    done = {c.id.planned for c in cells if c.run_id in mine}
    return planned, [k for k in planned if k not in done]


def _missing_section(cells: list[CellRecord], latest: dict) -> list[str]:
    planned, missing = missing_cells(cells, latest)
    if not missing:
        return []
    by_case: dict[str, list[str]] = {}
    for k in missing:
        b, dt, name = k.split("|", 2)
        by_case.setdefault(name, []).append(f"{b} {dt}")
    return ([f"**Incomplete: {len(missing)} of {len(planned)} planned cells of the latest run have no result** "
             f"({len(planned) - len(missing)} of {len(planned)} planned cells have a result: the run stopped "
             "before the others, or is still running; `--resume` runs them):", ""]
            + [f"- `{name}`: {', '.join(v)}" for name, v in by_case.items()] + [""])


def _summary_section(judged: list[CellJudgement], runs: dict[str, dict]) -> list[str]:
    lines = ["## Summary", ""] + ([] if judged else ["No cell has a result yet.", ""])
    presets: dict[str, list[CellJudgement]] = {}
    for j in judged:
        presets.setdefault(_preset_of(j.record, runs), []).append(j)
    for preset in sorted(presets):
        lines += ([f"`{preset}` cells:", ""] if len(presets) > 1 else []) + [
                  "| backend | dtype | pass | declared gap | fail | of which marginal | shape | error | crash | "
                  "timeout | skip |", "|---|---|" + "---|" * 9]
        for (b, dt), row in counts(presets[preset]).items():
            lines.append(f"| {b} | {dt} | {_count_row(row)} |")
        lines.append("")
    lines += [
        "How to read: a component passes when max(e) <= 3·max|floor−oracle| + 2u and "
        "rms(e) <= 2·rms(floor−oracle) + ½·eps·rms(oracle) (e = |backend−oracle| − extra_bound; "
        "u = eps(dtype)·max|oracle|). `ratio` columns are error over bound: above 1 fails; `n/a`: the rms "
        "criterion applies to components of >= 16 elements only (an rms of a few values is one sample of the "
        "floor's luck; see harness/judge/verdict.py). A FAIL is marginal when every ratio is at most 2 and no "
        "localized structure was found; it still fails. Hints are stated only where the cell's figures back "
        "them.", ""]
    return lines


def _earlier(c: CellRecord, runs: dict[str, dict], main_id: str | None) -> str:
    if c.run_id == main_id or len(runs) < 2:
        return ""
    r = runs.get(c.run_id or "", {})
    return f" [run at commit `{r.get('commit', '?')}`, {r.get('date', '?')}]"


def _failures_section(judged: list[CellJudgement], runs: dict[str, dict], main_id: str | None,
                      heat: dict[tuple, str]) -> list[str]:
    bad = [j for j in judged if j.failing]
    if not bad:
        return []
    lines = ["## Failures", ""]
    found = causes(judged)
    if found:
        lines += ["Sweep-level causes (case features that separate failing cells from passing ones):", ""]
        lines += [f"- {c.text()}" for c in found] + [""]
    bad.sort(key=lambda j: (j.severity == "marginal", j.record.backend, j.record.dtype))
    for j in bad:
        c = j.record
        sev = f" ({j.severity})" if j.severity else ""
        lines.append(f"- **{c.backend} / {c.dtype} / {c.case.name}**: {j.shown}{sev}"
                     + (f" — {c.error.splitlines()[0][:300]}" if c.error else "") + _earlier(c, runs, main_id))
        for comp in j.failed_components:
            img = heat.get((c.id, comp.name))
            lines.append(f"  - `{comp.name}` {comp.verdict.verdict}: {comp.reason}"
                         + (f"; where: {comp.where}" if comp.where else "")
                         + (f"; hint: {comp.hint_text()}" if comp.hints else "")
                         + (f" ([heatmap]({img}))" if img else ""))
        for k, _x in j.contracts:
            if not k.ok and _x is None:
                lines.append(f"  - contract `{k.name}` violated: {k.detail}")
        lines += [f"  - note: {n}" for n in j.notes]
    return lines + [""]


def _declared_section(judged: list[CellJudgement]) -> list[str]:
    """One row per (backend, dtype, declaration): the components it covered, in how many cells, and the
    worst ratio they reached beside the declared ceiling."""
    groups: dict[tuple, list] = {}
    for j in judged:
        if j.shown != "XFAIL":
            continue
        for c in j.failed_components:
            if c.gap is not None:
                groups.setdefault((j.record.backend, j.record.dtype, c.gap), []).append((j, c))
    if not groups:
        return []
    lines = ["## Declared gaps", "", "Failing components inside their backend's declared gap (no hints: the cause "
             "is declared); the worst ratio observed beside the declared ceiling.", "",
             "| backend | dtype | declared | scope | components | cells | worst ratio |",
             "|---|---|---|---|---|---|---|"]
    for (b, dt, g), items in groups.items():
        names = ", ".join(dict.fromkeys(c.name for _, c in items))
        cells = len({id(j) for j, _ in items})
        worst = max(c.verdict.worst_ratio for _, c in items)
        lines.append(f"| {b} | {dt} | {g.reason} | {g.scope()} | {names} | {cells} | {worst:.3g}x |")
    return lines + [""]


def _cases_section(judged: list[CellJudgement], runs: dict[str, dict]) -> list[str]:
    lines = ["## Cases", ""]
    by_case: dict[tuple[str, str], list[CellJudgement]] = {}
    for j in judged:
        by_case.setdefault((_preset_of(j.record, runs), j.record.case.name), []).append(j)
    for (preset, name), group in sorted(by_case.items()):
        case = group[0].record.case
        mb = f", microbatches={case.microbatches}" if case.microbatches else ""
        lines += [f"### {name}", "", f"`{_params(case.params)}{mb}` ({preset})"
                  + (f" — {', '.join(case.tags)}" if case.tags else ""), ""]
        lines += ["| backend | dtype | component | verdict | max err | floor max | ratio max | ratio rms | "
                  "extra bound | cos | where |", "|---" * 11 + "|"]
        notes = []
        for j in sorted(group, key=lambda j: (j.record.backend, j.record.dtype)):
            c = j.record
            if not c.status.ran:
                lines.append(f"| {c.backend} | {c.dtype} | — | {j.shown} |" + " |" * 7)
                continue
            for comp in j.components:
                lines.append(_component_row(j, comp))
            notes.append(_contract_note(j))
        lines += [""] + notes + [""]
    return lines


def _component_row(j: CellJudgement, comp: Any) -> str:
    v, f, c = comp.verdict, comp.figures, j.record
    shown = v.verdict if not (v.failed and j.shown == "XFAIL") else "XFAIL"
    if f.kind != "figures":
        return f"| {c.backend} | {c.dtype} | {comp.name} | {shown} |" + " |" * 6 + f" {comp.reason} |"
    rms = fmt(v.ratio_rms) if v.rms_applies else "n/a"
    extra = fmt(f.extra_bound_max) if f.extra_bound_max else ""
    note = (comp.where or comp.reason) if v.failed and j.shown != "XFAIL" else ""
    return (f"| {c.backend} | {c.dtype} | {comp.name} | {shown} | {fmt(f.max_err)} | {fmt(f.floor_max)} | "
            f"{fmt(v.ratio_max)} | {rms} | {extra} | {fmt(f.cosine)} | {note} |")


def _contract_note(j: CellJudgement) -> str:
    c = j.record
    extra = []
    for k, x in j.contracts:
        state = "ok" if k.ok else (f"declared ({x.reason})" if x else "VIOLATED")
        extra.append(f"{k.name}: {state}" + (f" ({k.detail})" if k.detail else ""))
    if c.kink_marked is not None:
        extra.append(f"kink-marked elements: {c.kink_marked}")
    if c.microbatch:
        mbd = c.microbatch["per_microbatch_mean_error"]
        extra.append("a per-microbatch mean would give rel. rms error "
                     + ", ".join(f"{k} {fmt(v['rel_rms'])}" for k, v in mbd.items()))
    return f"- {c.backend}/{c.dtype}: " + "; ".join(extra)


def heatmaps(dir_: Path, op: str, judged: list[CellJudgement], draw: bool = True) -> dict[tuple, str]:
    """PNG heatmaps of failing components (not of declared gaps) along two localization axes;
    {(cell key, component): path}. Pictures of this operator that no failure shows any more are removed.
    ``draw=False``: nothing drawn or removed; only the pictures already drawn from the same data are named."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}
    out = {}
    jobs = []
    img = dir_ / "img"
    for j in judged:
        if not j.failing:
            continue
        c = j.record
        for comp in j.failed_components:
            g = comp.figures.grid or (comp.figures.legacy or {}).get("grid")
            if not g:
                continue
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{op}-{c.backend}-{c.dtype}-{c.case.name}-{comp.name}")
            if draw:
                img.mkdir(parents=True, exist_ok=True)
            vals = [[min(float(v), 1e30) for v in row] for row in g["values"]]
            ylabel = f"{g['axes'][0]} (blocks of {g['block'][0]})"
            xlabel = f"{g['axes'][1]} (blocks of {g['block'][1]})"
            title = f"{comp.name} max |error| — {c.backend} {c.dtype} {c.case.name}"[:80]
            path = img / f"{name}.png"
            out[(c.id, comp.name)] = f"img/{name}.png"
            # a picture costs ~0.5 s; one whose data has not changed since it was drawn is kept
            digest = hashlib.sha256(json.dumps([vals, ylabel, xlabel, title]).encode()).hexdigest()[:16]
            if _png_digest(path) != digest:
                if not draw:
                    del out[(c.id, comp.name)]
                    continue
                jobs.append((str(path), vals, ylabel, xlabel, title, digest))
    if not draw:
        return out
    if img.is_dir():
        shown = {Path(p).name for p in out.values()}
        for old in img.glob(f"{op}-*.png"):
            if old.name not in shown:
                old.unlink()
    if len(jobs) > 8:
        # a whole sweep's pictures (~135 on a GPU run) drawn one by one kept the run waiting about a minute

        n = min(os.cpu_count() or 1, len(jobs) // 4, 16)
        with concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
            list(ex.map(_draw, jobs, chunksize=4))
    else:
        for j in jobs:
            _draw(j)
    return out


def _draw(job: tuple) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path, vals, ylabel, xlabel, title, digest = job
    fig, ax = plt.subplots(figsize=(6, 3.2))
    im = ax.imshow(vals, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=8)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Comment": f"harness-digest {digest}"})
    plt.close(fig)
    compact_png(path)


def compact_png(path: str | Path) -> None:
    """A heatmap re-encoded with a 128-colour palette (a third of its size: committed reports stay under the
    repository's 12 MB), its digest comment kept. Left as drawn without Pillow."""
    try:
        from PIL import Image, PngImagePlugin
    except ImportError:
        return
    with Image.open(path) as im:
        comment = im.text.get("Comment", "")
        small = im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    info = PngImagePlugin.PngInfo()
    if comment:
        info.add_text("Comment", comment)
    small.save(path, optimize=True, pnginfo=info)


def _png_digest(path: Path) -> str | None:
    """The data digest a heatmap was drawn from (its PNG comment), or None."""
    if not path.exists():
        return None
    try:
        from PIL import Image

        with Image.open(path) as im:
            comment = im.text.get("Comment", "")
    except Exception:  # no Pillow, or not a readable PNG: draw it again
        return None
    return comment.split(" ", 1)[1] if comment.startswith("harness-digest ") else None


def judged_cells(dir_: Path, op: str, cells: list[CellRecord], runs: dict[str, dict]
                 ) -> tuple[list[CellJudgement], Comparison | None]:
    """The cells of a report folder as its report shows them: judged under the folder's device class, with
    the regressions of the comparison saved beside them (--compare) marked."""
    comparison = load_saved(dir_, op, cells, runs)
    judged = judge_cells(cells, dir_.name)
    mark_regressions(judged, comparison)
    return judged, comparison


def render(dir_: Path, op: str, pending: dict | None = None, pictures: bool = True) -> list[Path]:
    """``op``'s markdown and JSON reports from its JSONL, also where no cell has a result yet (a run that
    has just begun, or was killed before its first cell: the report says so and lists the planned cells).
    ``pending``: a run record not yet in the JSONL, read as if appended last (ReportWriter.begin).
    ``pictures=False``: no heatmap drawn or removed (heatmaps)."""
    cells, runs = load(dir_, op)
    if pending is not None:
        by_key = {c.id: c for c in cells}
        add_run(by_key, runs, pending)
        cells = list(by_key.values())
    if not cells and not runs:
        return []
    judged, comparison = judged_cells(dir_, op, cells, runs)
    heat = heatmaps(dir_, op, judged, draw=pictures)
    md, js = dir_ / f"{op}.md", dir_ / f"{op}.json"
    minimal = minimal_cases(dir_, op, (latest_run(runs) if runs else {}).get("run_id"))
    atomic_write(md, render_markdown(op, cells, runs, dir_.name, heat, comparison, minimal))
    planned, missing = missing_cells(cells, latest_run(runs) if runs else {})
    payload = {
        "operator": op,
        "runs": runs,
        # the latest run's planned cells without a result (a run stopped midway, or still running)
        "incomplete": {"planned": len(planned), "missing": missing} if missing else None,
        "summary": {f"{b}/{d}": v for (b, d), v in counts(judged).items()},
        "minimal": minimal,
        "cells": [_judged_json(j) for j in judged],
    }
    atomic_write(js, json.dumps(payload, indent=1, default=str) + "\n")
    return [md, js]


def _judged_json(j: CellJudgement) -> dict:
    """A record with what rendering derived from it: the shown status, severity, and per component its
    verdict, bounds, hints and localization (the JSON report is rendered, like the markdown)."""
    d = {**j.record.to_json(), "shown": j.shown, "severity": j.severity,
         "declared": j.declared_text() or None}
    comps = []
    for c in j.components:
        v = c.verdict
        comps.append({**c.figures.to_json(), "verdict": v.verdict, "reason": c.reason, "tol_max": v.tol_max,
                      "tol_rms": v.tol_rms, "ratio_max": v.ratio_max,
                      "ratio_rms": v.ratio_rms if v.rms_applies else None, "where": c.where,
                      "hint": c.hint_text(), "hints": [{"class": h.cls, "text": h.text} for h in c.hints]})
    d["components"] = comps
    return d
