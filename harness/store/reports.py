"""The report store: each operator's cell records, appended to ``<dir>/<device-class>/<operator>.jsonl`` as
they finish; read back (newest result per cell wins), compacted, locked against a second run writing the
same folder, and written atomically.

A folder may keep its records packed: ``<operator>.jsonl.gz`` (``gzip -n <operator>.jsonl`` once) holds what
compaction kept, and compaction keeps it packed; a run still appends to ``<operator>.jsonl`` and load reads
both. Committed evidence is kept so: JSON records compress about 6 to 9 times, which keeps the repository small
enough to travel to a GPU machine (tests/test_repo_size.py)."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import logging
import os
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..judge.judgement import judge_cell, rules_for
from ..judge.verdict import verdict_of
from ..model.records import PROFILE_FROM_RATIO, CellId, CellRecord

log = logging.getLogger("harness")


# where reports and repro bundles go when no --report is given: under the current directory, in a folder that
# ignores itself (.harness/.gitignore holds "*", as .pytest_cache does), so that a run leaves any checkout clean.
# The project's committed evidence is written with an explicit --report reports.
HARNESS_DIR = ".harness"  # the harness's own folder under the current one: default reports, internal-error traces
DEFAULT_REPORT_ROOT = f"{HARNESS_DIR}/reports"


def ensure_harness_dir(path: str | Path) -> None:
    """If ``path`` is or lies in a ``.harness`` folder, create that folder with a ``.gitignore`` of ``*`` (as
    pytest does for .pytest_cache), so that what the harness writes there leaves any checkout's status clean."""
    p = Path(os.path.abspath(path))
    for d in (p, *p.parents):
        if d.name == HARNESS_DIR:
            d.mkdir(parents=True, exist_ok=True)
            ignore = d / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# created by gradient-harness: nothing in this folder is tracked\n*\n")
            return




def atomic_write(path: Path, text: str | bytes) -> None:
    """``path`` replaced by ``text`` whole, or not at all: a write that fails (a full disk) leaves the old
    file as it was and removes its temporary file, then raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_line(path: Path, line: str) -> None:
    """One JSONL record appended whole, or not at all where the file system lets a failed write be undone: a
    write that fails partway (a full disk) is cut off again before the error is raised. A line left cut by a
    killed process, or by a failed write that could not be undone, is ended first, so that it does not
    swallow this record (load skips it)."""
    data = (line + "\n").encode()
    with open(path, "a+b", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                n = f.write(view)
                view = view[n or 0:]
        except OSError:
            with contextlib.suppress(OSError):
                f.truncate(end)
            raise


LOCK_NAME = ".lock"


class FolderBusy(Exception):
    """Another run holds the report folder (FolderLock)."""

    def __init__(self, folder: Path, holder: dict[str, Any]):
        self.folder, self.holder = folder, holder
        h = holder
        if h.get("pid"):
            host = f" on {h['host']}" if h.get("host") and h["host"] != socket.gethostname() else ""
            cmd = " ".join(str(h.get("command") or "").split()) or "?"
            who = f"another run (pid {h['pid']}{host}, started {h.get('started', '?')}: {cmd})"
        else:
            who = "another run (which recorded nothing about itself yet)"
        super().__init__(f"the report folder {folder} is in use by {who}; wait for it to end, or give another "
                         "--report (`harness report --report ONE --add OTHER` merges two folders)")


class FolderLock:
    """One run at a time per report folder (``<root>/<device class>``): two runs appending to one folder at
    once would interleave their records and draw each other's reports. ``.lock`` in the folder is locked
    (flock) for the whole run, so that the kernel releases it when the run ends however it ends (kill -9
    included), and holds the pid, command and start time of the run that took it, for the refusal of the
    next one (FolderBusy).

    The processes of one run (pytest-xdist workers share their session's run id) share the folder: the
    first takes it, the others join. Taking, joining and releasing happen under a short lock of the folder
    itself, so that the folder is free exactly when no process of the run holding it is left (each holds
    ``.lock`` shared), and the last one out removes ``.lock``."""

    def __init__(self, folder: str | Path, run_id: str | None, command: str = ""):
        self.folder = Path(folder)
        self.run_id = run_id
        self.command = command
        self.fd: int | None = None
        self.gated = False

    def info(self) -> dict[str, Any]:

        return {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id,
                "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
                "command": self.command or " ".join(sys.argv)}

    def acquire(self) -> None:
        """Take the folder, or join its run; FolderBusy where another run has it (at once: no waiting)."""

        if self.fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        gate = _gate(self.folder)
        try:
            fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder(fd)
                    if not (self.run_id and holder.get("run_id") == self.run_id):
                        raise FolderBusy(self.folder, holder) from None
                    with contextlib.suppress(BlockingIOError):  # held exclusively where there is no gate
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                else:
                    os.ftruncate(fd, 0)
                    data = (json.dumps(self.info()) + "\n").encode()
                    if os.pwrite(fd, data, 0) != len(data):
                        raise OSError(28, os.strerror(28), str(self.folder / LOCK_NAME))
                    if gate is not None:
                        fcntl.flock(fd, fcntl.LOCK_SH)  # the run's other processes may join
            except BaseException:
                os.close(fd)
                raise
            self.fd, self.gated = fd, gate is not None
        finally:
            if gate is not None:
                os.close(gate)

    def release(self) -> None:
        """Leave the folder; the last process of the run removes ``.lock``. Safe to call twice."""

        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        gate = _gate(self.folder) if self.gated else None
        try:
            if gate is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while another process of the run is in
                    os.unlink(self.folder / LOCK_NAME)
        finally:
            os.close(fd)
            if gate is not None:
                os.close(gate)


def _gate(folder: Path, wait_s: float = 10.0) -> int | None:
    """The folder itself locked, for the moment a run takes, joins or leaves it (FolderLock); None where
    the file system cannot lock a folder, or another process held it for ``wait_s`` (one stopped there)."""

    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() - t0 < wait_s:
                time.sleep(0.01)
                continue
        except OSError:
            pass
        os.close(fd)
        return None


def _holder(fd: int) -> dict[str, Any]:
    """What the run holding ``.lock`` wrote there about itself ({} if nothing readable)."""
    try:
        d = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


PACKED = ".jsonl.gz"


def record_files(dir_: Path, op: str) -> list[Path]:
    """The files holding an operator's records, oldest first: its packed records, and the lines appended since."""
    return [p for p in (dir_ / f"{op}{PACKED}", dir_ / f"{op}.jsonl") if p.exists()]


def operators_in(dir_: Path) -> list[str]:
    """The operators a report folder holds records of, packed or not."""
    return sorted({p.name[: -len(PACKED)] for p in dir_.glob("*" + PACKED)} | {p.stem for p in dir_.glob("*.jsonl")})


def record_text(p: Path) -> str:
    """One of record_files' files as text, unpacked where it is packed."""
    data = p.read_bytes()
    if p.name.endswith(PACKED):
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def load(dir_: Path, op: str) -> tuple[list[CellRecord], dict[str, dict]]:
    """The latest record of each cell (records of any schema version) and the run records."""
    cells: dict[CellId, CellRecord] = {}
    runs: dict[str, dict] = {}
    for p in record_files(dir_, op):
        for n, line in enumerate(record_text(p).splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise ValueError("not a record")
            except ValueError:
                _warn_cut(p, n, line)  # a line cut by a killed run or a full disk
                continue
            if "run" in d:
                add_run(cells, runs, d["run"])
            else:
                rec = CellRecord.from_json(d)
                cells[rec.id] = rec
    return list(cells.values()), runs


_warned: set[tuple[str, int, int]] = set()


def _warn_cut(p: Path, n: int, line: str) -> None:
    """Once per cut line: a report redrawn every few seconds would repeat it."""
    key = (str(p), n, hash(line))
    if key not in _warned:
        _warned.add(key)
        log.warning("%s:%d: skipped a line that is not a whole record (%d characters; a write cut short by a "
                    "killed run or a full disk)", p, n, len(line))


def add_run(cells: dict[CellId, CellRecord], runs: dict[str, dict], run: dict) -> None:
    """A run record read after ``cells``; the cells it drops from their preset go (_drop_unplanned)."""
    runs[run.get("run_id", "?")] = run
    _drop_unplanned(cells, runs, run)


def _drop_unplanned(cells: dict[CellId, CellRecord], runs: dict[str, dict], new: dict) -> None:
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
        old = runs.get(c.run_id, {})
        if old is new or old.get("sizes") != new.get("sizes") or (c.backend, c.dtype) not in pairs:
            continue
        if c.id.planned not in keep:
            del cells[key]


def compact(dir_: Path, op: str) -> None:
    """Rewrites ``op``.jsonl with only what the report shows: each cell's latest result and the run
    records those results (and the latest run) come from. Appending every run keeps the whole history,
    which grows without bound in a repository that commits its reports; git keeps the history. A folder that
    keeps the operator's records packed keeps them so, with the appended lines taken in."""
    lock = FolderLock(dir_, None, " ".join(sys.argv))
    try:
        lock.acquire()  # a run appending to the file now would lose what it appends while it is rewritten
    except FolderBusy as e:
        log.warning("%s not compacted: %s", dir_ / f"{op}.jsonl", e)
        return
    try:
        cells, runs = load(dir_, op)
        if not runs:
            return
        keep = {c.run_id for c in cells} | {latest_run(runs).get("run_id", "?")}
        lines = []
        for rid, run in runs.items():
            if rid in keep:
                lines.append(record_line({"run": run}))
                lines += [record_line(_stored(c, dir_.name).to_json()) for c in cells if c.run_id == rid]
        write_records(dir_, op, "\n".join(lines) + "\n")
    finally:
        lock.release()


def write_records(dir_: Path, op: str, text: str) -> None:
    """``op``'s records replaced by ``text`` (whole JSONL lines), under the caller's lock: packed where the folder
    keeps them packed (the appended lines taken in), else as ``op``.jsonl."""
    packed, plain = dir_ / f"{op}{PACKED}", dir_ / f"{op}.jsonl"
    if packed.exists():  # mtime 0: the same records pack to the same bytes
        atomic_write(packed, gzip.compress(text.encode(), compresslevel=9, mtime=0))
        plain.unlink(missing_ok=True)
    else:
        atomic_write(plain, text)


def minimal_path(dir_: Path, op: str) -> Path:
    """Where a run keeps its minimal failing cases of ``op`` beside the report (harness/front/minimal.py)."""
    return dir_ / f"{op}.minimal.json"


def minimal_cases(dir_: Path, op: str, run_id: str | None) -> list[dict]:
    """The minimal failing cases kept for ``op`` by the run ``run_id`` (an earlier run's are stale: [])."""
    path = minimal_path(dir_, op)
    if not run_id or not path.exists():
        return []
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [m for m in found if isinstance(m, dict) and m.get("run_id") == run_id]


def record_line(d: dict) -> str:
    return json.dumps(d, default=str, separators=(",", ":"))


def _stored(c: CellRecord, device_class: str = "") -> CellRecord:
    """What the committed store keeps of a record: per-slice profiles only where a verdict is near
    (records.PROFILE_FROM_RATIO; records from before that rule kept more), under the operator's own bounds;
    neither profiles nor a heatmap's grid for a cell inside its backend's declared gap, which the report shows
    without hints or heatmaps (an eager 16-bit backend's: two thirds of an H200 cross-entropy sweep's bytes)."""
    rules = rules_for(c.operator, c.backend, device_class)
    gap = c.status.ran and judge_cell(c, rules, device_class).shown == "XFAIL"
    for f in c.components:
        if gap:
            f.slices, f.grid = [], None
            continue
        v = verdict_of(f, rules.k_max, rules.k_rms) if f.slices and f.kind == "figures" else None
        if v is not None and not v.failed and v.global_ratio <= PROFILE_FROM_RATIO:
            f.slices = []
    return c


def recorded(dir_: Path, operators: list[str], fields: tuple[str, ...]) -> dict[str, dict[CellId, float]]:
    """Numeric fields (``duration_s``, ``peak_mem_mb``) per cell of each cell's latest
    result in this directory, read in one pass: {field: {key: value}}."""
    out: dict[str, dict[CellId, float]] = {f: {} for f in fields}
    for op in operators:
        for c in load(dir_, op)[0]:
            key = c.id
            for f in fields:
                v = getattr(c, f, None)
                if isinstance(v, (int, float)):
                    out[f][key] = float(v)
    return out


def latest_run(runs: dict[str, dict]) -> dict:
    """The newest run record: the last one appended (dates have minute resolution; ties are common)."""
    return list(runs.values())[-1]


