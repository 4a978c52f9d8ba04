"""Merging report folders: the cell records of one report folder taken into another (``harness report --add``).

A sweep split over machines, GPUs or CI jobs writes one folder per part (a report folder takes one run at a
time); merged, they render as one report and one STATUS.md. Records are merged run by run, ordered by each run's
start date (a run the two folders share, as when one began as a copy of the other, counts once), so that the
newest result of each cell wins, and a later run of the same preset supersedes the cells it no longer plans,
as if the runs had been made into one folder in that order (reports.load). The minimal failing cases and repro
bundles of the added folder come along; bench and zoo pages do not (each is one run's page)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .reports import FolderLock, atomic_write, minimal_path, operators_in, record_files, record_text, write_records

REPRO = "repro"


@dataclass
class RunGroup:
    """One run record and the cell lines appended after it (records before any run record: run None)."""

    run: dict | None
    lines: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        return self.run.get("run_id") if self.run else None

    @property
    def date(self) -> str:
        return str(self.run.get("date", "")) if self.run else ""


@dataclass
class Merged:
    """What one added folder brought: cell records per ``<device class>/<operator>``, runs new to the
    destination, and what was left behind with the reason."""

    records: dict[str, int] = field(default_factory=dict)
    new_runs: set[str] = field(default_factory=set)
    left: list[str] = field(default_factory=list)


def groups(dir_: Path, op: str) -> list[RunGroup]:
    """An operator's records in a device-class folder, as runs in file order; cut lines are left out."""
    out: list[RunGroup] = []
    for p in record_files(dir_, op):
        for line in record_text(p).splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue  # blank, or cut by a killed run (reports.load warns when it renders)
            if not isinstance(d, dict):
                continue
            if "run" in d:
                out.append(RunGroup(d["run"], [line]))
            elif out:
                out[-1].lines.append(line)
            else:
                out.append(RunGroup(None, [line]))
    return out


def merged_groups(mine: list[RunGroup], added: list[RunGroup]) -> list[RunGroup]:
    """Both folders' runs, a run they share once (its cells from both: the added folder's last), ordered by
    start date; equal dates keep the destination's runs first. Dates have minute resolution, so two runs
    started in the same minute are taken in that order."""
    by_id = {g.run_id: g for g in mine if g.run_id}
    out = list(mine)
    for g in added:
        same = by_id.get(g.run_id) if g.run_id else None
        if same is not None:
            known = set(same.lines)
            same.lines += [ln for ln in g.lines[1:] if ln not in known]
        else:
            out.append(g)
    return sorted(out, key=lambda g: g.date)  # stable: ties keep the order above


def merge_operator(src: Path, dest: Path, op: str) -> tuple[int, set[str]]:
    """``op``'s records of the device-class folder ``src`` merged into ``dest``; (cell lines, the ids of runs
    new to ``dest``).
    The caller holds ``dest``'s lock."""
    mine, added = groups(dest, op), groups(src, op)
    known = {g.run_id for g in mine if g.run_id}
    write_records(dest, op, "\n".join(ln for g in merged_groups(mine, added) for ln in g.lines) + "\n")
    cells = sum(len(g.lines) - (g.run is not None) for g in added)
    return cells, {g.run_id for g in added if g.run_id and g.run_id not in known}


def _merge_minimal(src: Path, dest: Path, op: str, src_root: Path, dest_root: Path) -> None:
    """The added folder's minimal failing cases joined to this one's, their repro commands pointed at the
    bundles' new place."""
    found = minimal_path(src, op)
    if not found.exists():
        return
    try:
        theirs = json.loads(found.read_text())
        target = minimal_path(dest, op)
        ours = json.loads(target.read_text()) if target.exists() else []
    except ValueError:
        return
    old, new = str(src_root / REPRO), str(dest_root / REPRO)
    have = {json.dumps(m, sort_keys=True) for m in ours}
    for m in theirs:
        if isinstance(m, dict) and isinstance(m.get("repro"), str):
            m = {**m, "repro": m["repro"].replace(old, new)}
        if json.dumps(m, sort_keys=True) not in have:
            ours.append(m)
    atomic_write(target, json.dumps(ours, indent=1) + "\n")


def merge_folder(src_root: Path, dest_root: Path) -> Merged:
    """Every operator's records of every device class in the report folder ``src_root`` merged into
    ``dest_root``, each device-class folder under its lock (reports.FolderBusy while a run writes it)."""
    result = Merged()
    for src in sorted(p for p in src_root.iterdir() if p.is_dir() and p.name != REPRO):
        ops = operators_in(src)
        if not ops:
            continue
        dest = dest_root / src.name
        lock = FolderLock(dest, None, " ".join(sys.argv))
        lock.acquire()
        try:
            for op in ops:
                cells, runs = merge_operator(src, dest, op)
                result.records[f"{src.name}/{op}"] = cells
                result.new_runs |= runs
                _merge_minimal(src, dest, op, src_root, dest_root)
        finally:
            lock.release()
        result.left += [str(p) for p in sorted(src.glob("*.json"))
                        if p.name.startswith(("bench-", "mutants")) and p.suffix == ".json"]
    for bundle in sorted((src_root / REPRO).glob("*")) if (src_root / REPRO).is_dir() else []:
        there = dest_root / REPRO / bundle.name
        if bundle.is_dir() and not there.exists():
            shutil.copytree(bundle, there)
    result.left += [str(p) for p in sorted(src_root.glob("bench-*.json"))]
    return result
