"""What a finished `harness run` tells the terminal: the summary table and the lines under it (cells per
worker, where the time went, the slowest backends, the comparison with REF), and a repro bundle per
failing cell, a hypothesis-drawn one shrunk first to a minimal case."""

from __future__ import annotations

from typing import Any

from ..judge.judgement import judge_cell
from ..model.records import CellRecord
from ..render import terminal
from ..run.exit_codes import per_worker_counts
from ..run.hangs import HangGuard
from ..run.session import RunSession

MAX_REPROS = 20  # bundles saved per run: a sweep that fails everywhere would otherwise write hundreds


def print_summary(session: RunSession, stats: dict[str, float], seconds: float, paths: list) -> None:
    """The terminal's account of the run: its table, where its cells ran and its time went, its reports."""
    results = session.results
    print(terminal.terminal_summary(results, session.device_class))
    counts = per_worker_counts(results)
    if len(counts) > 1 or session.device.startswith("cuda"):
        print("cells per worker: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(
        f"{len(results)} cells in {seconds:.1f} s; reports: "
        + ", ".join(str(p) for p in paths if p.suffix == ".md")
    )
    print("where the time went: " + time_breakdown(stats))
    busiest = busiest_backends(results)
    if busiest:
        print("cell-seconds by backend (first call / again): " + busiest)


def comparison_summary(comparison: Any) -> str:
    """The comparison with REF for the terminal: counts, then each regression with both ratios."""
    lines = [comparison.counts_line()]
    for c in comparison.regressed:
        what = "; ".join(ch.text() for ch in c.regressions)
        tag = "accepted" if comparison.accepted else "REGRESSION"
        lines.append(f"  {tag} {c.cell.operator}/{c.cell.backend}/{c.cell.dtype}/{c.cell.case.name}: {what} "
                     f"(REF commit {c.ref_header.get('commit', '?')})")
    for c in comparison.cells:
        if c.newly_failing:
            lines.append(f"  passed in REF, fails now: {c.cell.operator}/{c.cell.backend}/{c.cell.dtype}/"
                         f"{c.cell.case.name}")
    return "\n".join(lines)


def time_breakdown(stats: dict[str, float]) -> str:
    """One line from the local pool's stats (run/pool.py): when the workers were ready, the cells done, the
    report drawn."""
    parts = []
    if "ready_s" in stats:
        parts.append(f"workers ready by {stats['ready_s']:.1f} s")
    if "cells_s" in stats:
        parts.append(f"shared cells done at {stats['cells_s']:.1f} s")
    if stats.get("alone_cells"):
        parts.append(f"{stats['alone_cells']:.0f} cell(s) rerun alone in {stats['alone_s']:.1f} s")
    parts.append(f"report rendered in {stats.get('render_s', 0.0):.1f} s")
    return "; ".join(parts)


def busiest_backends(results: list[CellRecord], top: int = 5) -> str:
    """The backends whose cells took longest in all (compilation included): what to look at when a sweep
    is slow. Where the cells timed both calls of the backend (the determinism check calls it twice),
    their sums follow in parentheses, first call / the same call again: the difference is mostly
    compilation (a cold 2xH100 sweep was bound by the CPU cores that compile, see reports/multi-gpu.md)."""
    total: dict[str, list[float]] = {}
    for c in results:
        if isinstance(c.duration_s, (int, float)):
            t = total.setdefault(f"{c.operator}/{c.backend}", [0.0, 0.0, 0.0, 0])
            t[0] += c.duration_s
            if isinstance(c.backend_again_s, (int, float)):
                t[1] += c.backend_s or 0.0
                t[2] += c.backend_again_s
                t[3] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return ", ".join(f"{k} {v[0]:.0f} s" + (f" ({v[1]:.0f} / {v[2]:.0f})" if v[3] else "") for k, v in ranked)


def save_repros(session: RunSession) -> None:
    """A bundle per failing cell (the minimal failing cases, harness/front/minimal.py, get theirs there)."""

    # a cell not run because its backend hung before has nothing to replay: the cells that hung have bundles
    bad = [c for c in session.results if judge_cell(c, device_class=session.device_class).failing
           and not HangGuard.is_stand_in(c)]
    for c in bad[:MAX_REPROS]:
        print(f"repro: harness repro {session.save_repro(c)}")
