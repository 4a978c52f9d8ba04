"""A run's exit code, from its cells: the same for `harness run` and the pytest plugin's session.

A run that tested nothing never exits 0: a sweep whose every cell was skipped, or a backend named with
--backend or loaded by --plugin that ran no cell, must not read as a pass in CI.
"""

from __future__ import annotations

from ..judge.judgement import judge_cell
from ..model.records import CellRecord, Status
from ..model.spec import as_list

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_TESTED_NOTHING, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def exit_code(results: list[CellRecord], explicit: list[str], device_class: str = "",
              plugin_backends: list[str] | None = None) -> int:
    """1 when a cell fails the run (judged under today's rules and declarations; a marginal FAIL too);
    3 when nothing ran at all, or a backend named with --backend or loaded by --plugin ran no cell (a
    run that tested nothing never exits 0); else 0. SKIPs of in-tree backends nobody named are fine."""

    if any(judge_cell(c, device_class=device_class).failing for c in results):
        return EXIT_FAIL
    return EXIT_TESTED_NOTHING if not_run(results, explicit, plugin_backends) else EXIT_OK


def not_run(results: list[CellRecord], explicit: list[str], plugin_backends: list[str] | None = None) -> list[str]:
    """Why the run tested too little: no cell ran, or these named / plugin backends ran none."""
    if results and all(c.status == Status.SKIP for c in results):
        return ["no cell ran: every cell was skipped"]
    out = []
    for name in dict.fromkeys([*as_list(explicit), *(plugin_backends or [])]):
        mine = [c for c in results if c.backend == name]
        if mine and all(c.status == Status.SKIP for c in mine):
            reasons = sorted({c.error for c in mine})
            out.append(f"backend {name} ran no cell: " + "; ".join(reasons))
    return out


def per_worker_counts(results: list[CellRecord]) -> dict[str, int]:
    """Cells per worker (a slot, a GPU, a Ray node and worker), for the terminal's balance line."""
    out: dict[str, int] = {}
    for c in results:
        if c.worker is not None:
            out[str(c.worker)] = out.get(str(c.worker), 0) + 1
    return out
