"""One run session: the request checked and planned, its header, report writer, repro bundles and exit code.

`harness run` and the pytest plugin both go through a :class:`RunSession`, so that the two front doors
plan the same cells, write the same reports and bundles, and refuse the same runs. How cells are
executed is an :class:`Executor`'s business (executor.py): a pool of local worker processes
(:class:`LocalPool`, the CLI), one worker running a cell at a time (:class:`SingleWorker`, one pytest item
per cell), or Ray tasks on a cluster (ray_executor.py). Every executor reports each finished cell through
the same callback. The session names the two local executors too, so that a front door finds here all it
needs to run a session.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..across.compare import CompareError, compare, load_reference, require, save
from ..across.repro import save_bundle
from ..model import registry
from ..model.devices import checked_device, parsed_device
from ..model.errors import ReportWriteError, UsageError
from ..model.mutant_builds import resolve as resolve_backend
from ..model.records import CellRecord
from ..render.report import ReportWriter
from ..render.terminal import terminal_summary
from ..store.provenance import backend_provenance, device_class, plugin_provenance, run_provenance
from ..store.reports import DEFAULT_REPORT_ROOT, FolderBusy, FolderLock, ensure_harness_dir
from . import exit_codes
from .executor import Executor
from .exit_codes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK
from .plan import Plan, Task, plan


def load_plugins(plugins: list[str]) -> None:
    """Every plugin before anything is planned or judged: a plugin's backends and declarations count."""
    for p in plugins:
        try:
            registry.load_plugin(p)
        except (FileNotFoundError, ValueError) as e:  # PluginError, RegistrationError included
            raise UsageError(str(e)) from e


@dataclass
class RunRequest:
    """What the user asked for, as both front doors take it."""

    kernels: list[str]
    sizes: str = "smoke"
    backends: list[str] | None = None
    dtypes: list[str] | None = None
    device: str | None = None
    plugins: list[str] = field(default_factory=list)
    seed: int = 0
    repeats: int = 2
    case_filter: str | None = None
    report: str | None = DEFAULT_REPORT_ROOT  # None: no report written (pytest without --harness-report)
    command: str = ""
    # --compare REF: a report directory or a git revision (harness/across/compare.py)
    compare: str | None = None
    compare_fail: float = 1.5
    compare_require: float = 0.9
    compare_accept: bool = False
    # the machines the cells run on, when they are not this one (an executor on a cluster): their device,
    # device class and package versions, as the executor found them; the device is then not looked for here
    elsewhere: dict[str, Any] | None = None
    # seconds to search each failing (operator, backend, dtype)'s minimal failing case (0: none; harness run's
    # --shrink-seconds, harness/front/minimal.py)
    shrink_seconds: float = 0.0


class RunSession:
    """A checked, planned run: plugins loaded, device checked, cells planned; then cells recorded as they
    finish, the report rendered, bundles saved and the exit code decided, the same way for every front door.
    Construction raises UsageError / CannotRunHere for a request that cannot run as asked."""

    def __init__(self, req: RunRequest, extra_tasks: Callable[[Plan, str], list[Task]] | None = None):
        self.req = req
        here = req.elsewhere is None
        self.device = checked_device(req.device) if here else (parsed_device(req.device) or "cpu")
        load_plugins(req.plugins)
        try:
            self.plan = plan(req.kernels, req.sizes, req.backends, req.dtypes, self.device, req.seed,
                                    req.repeats, case_filter=req.case_filter, here=here)
        except (KeyError, ValueError) as e:
            raise UsageError(str(e.args[0]) if e.args else str(e)) from e
        if extra_tasks is not None:
            self.plan.tasks += extra_tasks(self.plan, self.device)
        if not self.plan.tasks:
            why = (f"--case {req.case_filter!r}: no case of the {req.sizes} preset has it in its name"
                   if req.case_filter else f"--sizes {req.sizes}: the preset has no case here")
            raise UsageError(f"nothing to run: {why} (harness list shows the presets)")

        self.device_class = device_class(self.device) if here else str(req.elsewhere["device_class"])
        self.header = self._header()
        self.results: list[CellRecord] = []
        self.writer: Any = None
        self._lock: Any = None
        self._drawn_at, self._draw_took = 0.0, 0.0
        self.reference = self._reference()
        self.comparison: Any = None

    # while a run goes on its report is redrawn after a cell at most this often (and at most a tenth of the
    # time goes to it): a run killed -9 leaves a report this old at most, saying it is incomplete
    redraw_every_s = 15.0

    def _header(self) -> dict[str, Any]:

        h = run_provenance(self.device, self.req.elsewhere)
        h["run_id"] = uuid.uuid4().hex[:10]
        h["command"] = self.req.command
        # each plugin's file and the commit of its own repository (the harness's commit says nothing of it)
        h["plugins"] = plugin_provenance(registry.plugins_loaded())
        h["sizes"] = self.req.sizes
        h["case_filter"] = self.req.case_filter  # a filtered run plans part of the preset (report._drop_unplanned)
        h["backends"] = {
            f"{t.operator}/{t.backend}": backend_provenance(
                resolve_backend(t.operator, t.backend).source_files())
            for t in self.plan.tasks
        }
        # the cells this run means to produce, per operator: a report of a run stopped midway lists the rest
        h["planned"] = {}
        for t in self.plan.tasks:
            h["planned"].setdefault(t.operator, []).append(t.id.planned)
        return h

    def _reference(self) -> Any:
        """REF's cells, read before anything runs: a REF that cannot be read is a usage error at once."""
        if not self.req.compare:
            return None

        if not self.req.compare_fail > 1.0:
            raise UsageError(f"--compare-fail {self.req.compare_fail}: expected a growth factor above 1")
        self.header["compare"] = {"ref": self.req.compare, "fail": self.req.compare_fail,
                                  "accepted": self.req.compare_accept}
        try:
            return load_reference(self.req.compare, self.device_class, sorted({t.operator for t in self.plan.tasks}))
        except CompareError as e:
            raise UsageError(str(e)) from e

    def compare(self) -> Any:
        """This run's cells against REF, kept beside the report; too few compared cells is a usage error."""
        if self.reference is None:
            return None

        self.comparison = compare(self.results, self.header, self.reference, self.req.compare_fail,
                                  self.req.compare_accept)
        if self.writer is not None:
            with self._writing():
                save(self.writer.dir, self.comparison, self.header)
        try:
            require(self.comparison, self.req.compare_require)
        except CompareError as e:
            raise UsageError(str(e)) from e
        return self.comparison

    def regressed(self) -> bool:
        return self.comparison is not None and not self.comparison.accepted and bool(self.comparison.regressed)

    @property
    def report_dir(self) -> Path | None:
        return Path(self.req.report) / self.device_class if self.req.report else None

    def begin(self) -> None:
        """Open the report: the report folder is taken for this run (a second run on it is refused at once,
        a usage error naming this one), each operator's markdown is drawn with this run's cells all missing,
        then its run header goes to its JSONL; so a run killed at any point, kill -9 included, leaves a
        report that says it is incomplete (not the last run's tables, looking current, nor no report)."""
        if not self.req.report or self.writer is not None:
            return

        ensure_harness_dir(self.req.report)  # through the API too, not only the command line

        with self._writing():
            if self._lock is None:
                lock = FolderLock(self.report_dir, self.header.get("run_id"), self.req.command)
                try:
                    lock.acquire()
                except FolderBusy as e:
                    raise UsageError(str(e)) from e
                self._lock = lock
                # released when the session ends however it ends (render() releases it first)
                weakref.finalize(self, lock.release)
            self.writer = ReportWriter(self.req.report, self.device_class, self.header)
            t0 = time.monotonic()
            self.writer.begin(sorted({t.operator for t in self.plan.tasks}))
        self._drawn_at, self._draw_took = time.monotonic(), time.monotonic() - t0

    def record(self, cell: CellRecord) -> None:
        """A finished cell, appended to its JSONL at once; the report is redrawn now and then (redraw_every_s)."""
        self.results.append(cell)
        if self.writer is None:
            return
        with self._writing():
            self.writer.append(cell)
            if time.monotonic() - self._drawn_at >= max(self.redraw_every_s, 10 * self._draw_took):
                self._redraw()

    def _redraw(self) -> None:
        t0 = time.monotonic()
        try:
            self.writer.render(pictures=False)
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - a report that cannot be drawn must not stop the cells; the
            # final render raises it again
            logging.getLogger("harness").warning("the report could not be redrawn during the run: %s: %s",
                                                 type(e).__name__, e)
        self._drawn_at, self._draw_took = time.monotonic(), time.monotonic() - t0

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A report write that fails (OSError: a full disk, no permission) ends the report: one clear error
        (ReportWriteError), the folder released, nothing more written; what was written before stays (the
        JSONL's appends are cut back, the markdown and JSON are replaced whole or not at all)."""
        try:
            yield
        except OSError as e:
            self.writer = None
            self._release()
            what = e.strerror or str(e)
            where = f" (writing {e.filename})" if e.filename else ""
            raise ReportWriteError(f"cannot write the report in {self.report_dir}: {what}{where}; the cells "
                                   "recorded before stay in its JSONL: make room, then run again (--resume runs "
                                   "only the cells without a result)") from e

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def execute(self, executor: Executor, on_cell: Callable[[CellRecord], None] | None = None) -> None:
        """Run every planned task; a KeyboardInterrupt stops the executor and propagates (see interrupted())."""

        def done(cell: CellRecord) -> None:
            self.record(cell)
            if on_cell is not None:
                on_cell(cell)

        try:
            executor.run(self.plan.tasks, done)
        finally:
            executor.close()

    def render(self) -> list[Path]:
        """The run's final report (heatmaps drawn), after which the report folder is released: the last
        thing a run writes there (bundles go to ``<root>/repro``)."""
        if self.writer is None:
            return []
        with self._writing():
            paths = self.writer.render()
        self._release()
        return paths

    def exit_code(self) -> int:
        code = exit_codes.exit_code(self.results, self.plan.explicit, self.device_class, self.plugin_backends())
        return EXIT_FAIL if code == EXIT_OK and self.regressed() else code

    def not_run(self) -> list[str]:
        """Why a run that exits 3 tested nothing (for the terminal)."""
        return exit_codes.not_run(self.results, self.plan.explicit, self.plugin_backends())

    def plugin_backends(self) -> list[str]:
        return sorted({t.backend for t in self.plan.tasks
                       if resolve_backend(t.operator, t.backend).origin.startswith("plugin:")})

    def save_repro(self, cell: CellRecord) -> Path:

        return save_bundle(cell, self.req.report or DEFAULT_REPORT_ROOT, registry.plugins_loaded())

    def resume_command(self) -> str:
        """The command that finishes this run: the same arguments with --resume."""
        cmd = self.req.command or "harness run"
        return cmd if "--resume" in cmd.split() else f"{cmd} --resume"

    def interrupted(self, out: Any = sys.stdout) -> int:
        """After Ctrl-C: what completed, the report drawn from it, and how to finish (exit 130)."""
        planned = len(self.plan.tasks)
        print(f"\ninterrupted: workers stopped; {len(self.results)} of {planned} cells completed", file=out)
        paths = self.render()
        if self.results:

            print(terminal_summary(self.results, self.device_class), file=out)
        if paths:
            print("reports (marked incomplete): " + ", ".join(str(p) for p in paths if p.suffix == ".md"), file=out)
        print(f"to run the {planned - len(self.results)} remaining cells: {self.resume_command()}", file=out)
        return EXIT_INTERRUPTED
