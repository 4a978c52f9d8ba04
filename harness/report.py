"""Reports: cells appended to ``<dir>/<device-class>/<operator>.jsonl`` as they finish, rendered to
``<operator>.md`` and ``<operator>.json`` atomically (newest result per cell wins)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

STATUSES = ("PASS", "XFAIL", "FAIL", "SHAPE", "ERROR", "CRASH", "TIMEOUT", "SKIP")


def shown_status(c: dict) -> str:
    """FAIL/SHAPE of a dtype the backend declares behind the floor counts as XFAIL (still reported)."""
    return "XFAIL" if c.get("expected_gap") and c["status"] in ("FAIL", "SHAPE") else c["status"]


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cell_key(c: dict) -> tuple:
    case = c["case"]
    return (
        c["backend"],
        c["dtype"],
        case["name"],
        json.dumps(case["params"], sort_keys=True),
        case.get("microbatches", 0),
    )


def planned_key(backend: str, dtype: str, case_name: str) -> str:
    return f"{backend}|{dtype}|{case_name}"


def planned_key_of(c: dict) -> str:
    """planned_key of a stored cell."""
    return planned_key(c["backend"], c["dtype"], c["case"]["name"])


def duration_key(op: str, backend: str, dtype: str, case_name: str) -> tuple[str, str]:
    """Key of recorded(): a cell across operators (two may share backend, dtype and case name)."""
    return op, planned_key(backend, dtype, case_name)


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

    def append(self, cell: dict) -> None:
        op = cell["operator"]
        with open(self.path(op), "a") as f:
            if op not in self.started:
                self.started.add(op)
                self.touched.append(op)
                planned = (self.header.get("planned") or {}).get(op)
                f.write(json.dumps({"run": {**self.header, "planned": planned}}) + "\n")
            f.write(json.dumps({**cell, "run_id": self.header.get("run_id")}, default=str) + "\n")
            f.flush()

    def render(self) -> list[Path]:
        return [p for op in self.touched for p in render(self.dir, op)]


def load(dir_: Path, op: str) -> tuple[list[dict], dict[str, dict]]:
    cells: dict[tuple, dict] = {}
    runs: dict[str, dict] = {}
    p = dir_ / f"{op}.jsonl"
    if not p.exists():
        return [], {}
    for line in p.read_text().splitlines():
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed run
        if "run" in d:
            runs[d["run"].get("run_id", "?")] = d["run"]
            _drop_unplanned(cells, runs, d["run"])
        else:
            cells[cell_key(d)] = d
    return list(cells.values()), runs


def _drop_unplanned(cells: dict[tuple, dict], runs: dict[str, dict], new: dict) -> None:
    """A later run of the same size preset that plans a (backend, dtype) without one of its earlier
    cases supersedes that cell: the case left the preset (e.g. moved to ``full``), and its old result
    would otherwise stand in the report, and in STATUS, for good. Runs of other presets, subsets of
    backends or dtypes (cells of pairs the new run does not plan) and --case filters are left alone:
    only a pair's whole preset is compared, and only when the new run ran without a case filter."""
    planned = new.get("planned")
    if not planned or new.get("case_filter"):
        return
    pairs = {tuple(k.split("|", 2)[:2]) for k in planned}
    keep = set(planned)
    for key, c in list(cells.items()):
        old = runs.get(c.get("run_id"), {})
        if old is new or old.get("sizes") != new.get("sizes") or (c["backend"], c["dtype"]) not in pairs:
            continue
        if planned_key_of(c) not in keep:
            del cells[key]


def compact(dir_: Path, op: str) -> None:
    """Rewrites ``op``.jsonl with only what the report shows: each cell's latest result and the run
    records those results (and the latest run) come from. Appending every run keeps the whole history,
    which grows without bound in a repository that commits its reports; git keeps the history."""
    p = dir_ / f"{op}.jsonl"
    cells, runs = load(dir_, op)
    if not runs:
        return
    keep = {c.get("run_id") for c in cells} | {latest_run(runs).get("run_id", "?")}
    lines = []
    for rid, run in runs.items():
        if rid in keep:
            lines.append(json.dumps({"run": run}))
            lines += [json.dumps(c, default=str) for c in cells if c.get("run_id") == rid]
    atomic_write(p, "\n".join(lines) + "\n")


def recorded(dir_: Path, operators: list[str], fields: tuple[str, ...]) -> dict[str, dict[tuple[str, str], float]]:
    """Numeric fields (``duration_s``, ``peak_mem_mb``) per cell (duration_key) of each cell's latest
    result in this directory, read in one pass: {field: {key: value}}."""
    out: dict[str, dict[tuple[str, str], float]] = {f: {} for f in fields}
    for op in operators:
        for c in load(dir_, op)[0]:
            key = duration_key(op, c["backend"], c["dtype"], c["case"]["name"])
            for f in fields:
                if isinstance(c.get(f), (int, float)):
                    out[f][key] = float(c[f])
    return out


def latest_run(runs: dict[str, dict]) -> dict:
    """The newest run record: the last one appended (dates have minute resolution; ties are common)."""
    return list(runs.values())[-1]


def summary(cells: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    out: dict[tuple[str, str], dict[str, int]] = {}
    for c in cells:
        row = out.setdefault((c["backend"], c["dtype"]), dict.fromkeys(STATUSES, 0))
        row[shown_status(c)] += 1
    return dict(sorted(out.items()))


def _fmt(x: Any) -> str:
    if isinstance(x, str):
        return x
    if x is None:
        return ""
    if isinstance(x, float):
        if x == 0:
            return "0"
        return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
    return str(x)


def _params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


def render_markdown(op: str, cells: list[dict], runs: dict[str, dict]) -> str:
    latest = latest_run(runs) if runs else {}
    lines = [f"# `{op}` conformance — {latest.get('device', '?')}", ""]
    if latest:
        v = latest.get("versions", {})
        lines += [
            f"Commit `{latest.get('commit')}`, {latest.get('date')}, device class `{latest.get('device_class')}`"
            f"{', Triton interpreted (TRITON_INTERPRET=1)' if latest.get('interpreted') else ''}; "
            + ", ".join(f"{k} {val}" for k, val in v.items())
            + ".",
            "",
        ]
        if latest.get("command"):
            lines += [f"Command: `{latest['command']}`", ""]
    latest_id = latest.get("run_id")
    from_runs: dict[Any, int] = {}
    for c in cells:
        from_runs[c.get("run_id")] = from_runs.get(c.get("run_id"), 0) + 1
    if len(from_runs) > 1:
        # each cell shows its latest result, so a report can mix runs (an interrupted sweep, a
        # --case rerun): say which, so an old result is never read as the current code's
        lines += ["Cells come from several runs (each cell shows its latest result):", ""]
        for rid, n in sorted(from_runs.items(), key=lambda kv: runs.get(kv[0], {}).get("date", ""), reverse=True):
            r = runs.get(rid, {})
            lines.append(f"- {n} cells: commit `{r.get('commit', '?')}`, {r.get('date', '?')}"
                         + (f", `{r['command']}`" if r.get("command") else "")
                         + (" (latest)" if rid == latest_id else ""))
        lines.append("")

    planned = latest.get("planned") or []
    if planned:
        # a --resume run counts the results it reused from the runs it resumed
        mine = {latest_id, *latest.get("resumes", [])}
        done = {planned_key_of(c) for c in cells if c.get("run_id") in mine}
        missing = [k for k in planned if k not in done]
        if missing:
            by_case: dict[str, list[str]] = {}
            for k in missing:
                b, dt, name = k.split("|", 2)
                by_case.setdefault(name, []).append(f"{b} {dt}")
            lines += [f"**{len(missing)} of {len(planned)} planned cells of the latest run have no result** "
                      "(the run stopped before them; `--case NAME` runs them):", ""]
            lines += [f"- `{name}`: {', '.join(v)}" for name, v in by_case.items()]
            lines.append("")

    def earlier(c: dict) -> str:
        if len(from_runs) < 2 or c.get("run_id") == latest_id:
            return ""
        r = runs.get(c.get("run_id"), {})
        return f" [earlier run: commit `{r.get('commit', '?')}`, {r.get('date', '?')}]"

    lines += [
        "## Summary",
        "",
        "| backend | dtype | " + " | ".join(s.lower() for s in STATUSES) + " |",
        "|---|---|" + "---|" * len(STATUSES),
    ]
    for (b, dt), row in summary(cells).items():
        lines.append(f"| {b} | {dt} | " + " | ".join(str(row[s]) if row[s] else "" for s in STATUSES) + " |")
    bad = [c for c in cells if c["status"] not in ("PASS", "SKIP")]
    lines += [
        "",
        "How to read: a component passes when max(e) <= 3·max|floor−oracle| + 2u and "
        "rms(e) <= 2·rms(floor−oracle) + ½·eps·rms(oracle) (e = |backend−oracle| − extra_bound; "
        "u = eps(dtype)·max|oracle|). `ratio` columns are error over bound: above 1 fails. "
        "Recorded change: the rms criterion applies to components of >= 16 elements only (an rms of "
        "a few values is one sample of the floor's luck; see harness/verdict.py).",
        "",
    ]
    if bad:
        lines += ["## Failures", ""]
        for c in bad:
            lines.append(
                f"- **{c['backend']} / {c['dtype']} / {c['case']['name']}**: {shown_status(c)}"
                + (f" (declared: {c['expected_gap']})" if c.get("expected_gap") else "")
                + (f" — {c['error'].splitlines()[0][:300]}" if c.get("error") else "")
                + earlier(c)
            )
            for r in c.get("components", []):
                if r["verdict"] != "PASS":
                    where = r.get("localization", {}).get("text", "")
                    heat = r.get("localization", {}).get("heatmap")
                    lines.append(
                        f"  - `{r['name']}` {r['verdict']}: {r['reason']}"
                        + (f"; where: {where}" if where else "")
                        + (f"; hint: {r['hint']}" if r.get("hint") else "")
                        + (f" ([heatmap]({heat}))" if heat else "")
                    )
            for k in c.get("contracts", []):
                if not k["ok"]:
                    lines.append(f"  - contract `{k['name']}` violated: {k['detail']}")
        lines.append("")
    skips = sorted({(c["backend"], c.get("error", "")) for c in cells if c["status"] == "SKIP"})
    if skips:
        lines += ["## Skipped", ""] + [f"- {b}: {why}" for b, why in skips] + [""]
    lines += ["## Cases", ""]
    by_case: dict[str, list[dict]] = {}
    for c in cells:
        by_case.setdefault(c["case"]["name"], []).append(c)
    for name, group in by_case.items():
        case = group[0]["case"]
        mb = f", microbatches={case['microbatches']}" if case.get("microbatches") else ""
        lines += [
            f"### {name}",
            "",
            f"`{_params(case['params'])}{mb}`" + (f" — {', '.join(case['tags'])}" if case.get("tags") else ""),
            "",
        ]
        lines += [
            "| backend | dtype | component | verdict | max err | mean err | floor max | ratio max | "
            "ratio rms | cos | zeros | non-finite | where |",
            "|---" * 13 + "|",
        ]
        notes = []
        for c in sorted(group, key=lambda c: (c["backend"], c["dtype"])):
            if c["status"] in ("SKIP", "ERROR", "CRASH", "TIMEOUT"):
                lines.append(f"| {c['backend']} | {c['dtype']} | — | {c['status']} |" + " |" * 9)
                continue
            for r in c["components"]:
                where = r.get("localization", {}).get("text", "") if r["verdict"] != "PASS" else ""
                lines.append(
                    f"| {c['backend']} | {c['dtype']} | {r['name']} | {r['verdict']} | {_fmt(r['max_err'])} | "
                    f"{_fmt(r['mean_err'])} | {_fmt(r['ref_max'])} | {_fmt(r['ratio_max'])} | "
                    f"{_fmt(r['ratio_rms'])} | {_fmt(r['cosine'])} | {_fmt(r['zero_frac'])} | "
                    f"{r['nonfinite'] or ''} | {where or r.get('reason', '') if r['verdict'] != 'PASS' else ''} |"
                )
            extra = [
                f"{k['name']}: {'ok' if k['ok'] else 'VIOLATED'}{' (' + k['detail'] + ')' if k['detail'] else ''}"
                for k in c.get("contracts", [])
            ]
            if c.get("kink_marked") is not None:
                extra.append(f"kink-marked elements: {c['kink_marked']}")
            if c.get("microbatch"):
                mbd = c["microbatch"]["per_microbatch_mean_error"]
                extra.append(
                    "a per-microbatch mean would give rel. rms error "
                    + ", ".join(f"{k} {_fmt(v['rel_rms'])}" for k, v in mbd.items())
                )
            notes.append(f"- {c['backend']}/{c['dtype']}: " + "; ".join(extra))
        lines += [""] + notes + [""]
    return "\n".join(lines) + "\n"


def heatmaps(dir_: Path, op: str, cells: list[dict]) -> dict[tuple, str]:
    """PNG heatmaps of failing components along two localization axes; {(cell key, component): path}."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}
    out = {}
    jobs = []
    img = dir_ / "img"
    for c in cells:
        for r in c.get("components", []):
            g = r.get("localization", {}).get("grid")
            if r["verdict"] == "PASS" or not g:
                continue
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{op}-{c['backend']}-{c['dtype']}-{c['case']['name']}-{r['name']}")
            img.mkdir(parents=True, exist_ok=True)
            vals = [[min(v, 1e30) for v in row] for row in g["values"]]
            ylabel = f"{g['axes'][0]} (blocks of {g['block'][0]})"
            xlabel = f"{g['axes'][1]} (blocks of {g['block'][1]})"
            title = f"{r['name']} max |error| — {c['backend']} {c['dtype']} {c['case']['name']}"[:80]
            path = img / f"{name}.png"
            out[(cell_key(c), r["name"])] = f"img/{name}.png"
            # a picture costs ~0.5 s; one whose data has not changed since it was drawn is kept
            digest = hashlib.sha256(json.dumps([vals, ylabel, xlabel, title]).encode()).hexdigest()[:16]
            if _png_digest(path) != digest:
                jobs.append((str(path), vals, ylabel, xlabel, title, digest))
    if len(jobs) > 8:
        # a whole sweep's pictures (~135 on a GPU run) drawn one by one kept the run waiting about a minute
        import concurrent.futures
        import multiprocessing

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


def render(dir_: Path, op: str) -> list[Path]:
    cells, runs = load(dir_, op)
    if not cells:
        return []
    for (key, comp), path in heatmaps(dir_, op, cells).items():
        for c in cells:
            if cell_key(c) == key:
                for r in c["components"]:
                    if r["name"] == comp:
                        r["localization"]["heatmap"] = path
    md, js = dir_ / f"{op}.md", dir_ / f"{op}.json"
    atomic_write(md, render_markdown(op, cells, runs))
    payload = {
        "operator": op,
        "runs": runs,
        "summary": {f"{b}/{d}": v for (b, d), v in summary(cells).items()},
        "cells": cells,
    }
    atomic_write(js, json.dumps(payload, indent=1, default=str) + "\n")
    return [md, js]


def terminal_summary(results: list[dict]) -> str:
    ops = sorted({c["operator"] for c in results})
    out = []
    for op in ops:
        mine = summary([c for c in results if c["operator"] == op])
        out.append(f"{op}:")
        for (b, dt), row in mine.items():
            counts = ", ".join(f"{row[s]} {s.lower()}" for s in STATUSES if row[s])
            out.append(f"  {b:<14} {dt:<9} {counts}")
    declared = [c for c in results if shown_status(c) == "XFAIL"]
    if declared:
        out.append(
            f"  {len(declared)} cell(s) behind the floor as their backend declares "
            f"({'; '.join(sorted({c['backend'] + '/' + c['dtype'] + ': ' + c['expected_gap'] for c in declared}))})"
        )
    bad = [c for c in results if shown_status(c) not in ("PASS", "SKIP", "XFAIL")]
    for c in bad[:20]:
        comps = [r for r in c.get("components", []) if r["verdict"] != "PASS"]
        what = "; ".join(
            f"{r['name']} {r['verdict']} ({r.get('localization', {}).get('text') or r['reason']})" for r in comps[:4]
        )
        what += "; ".join(f" contract {k['name']}: {k['detail']}" for k in c.get("contracts", []) if not k["ok"])
        out.append(
            f"  ✗ {c['operator']}/{c['backend']}/{c['dtype']}/{c['case']['name']}: {c['status']} "
            f"{what or c.get('error', '')[:200]}"
        )
    if len(bad) > 20:
        out.append(f"  ... and {len(bad) - 20} more failing cells (see the reports)")
    return "\n".join(out)
