"""Reports under faults (issue #41): a run killed before any cell finished, two runs on one report folder, a
disk that fills up while a report is written, and the commit of a plugin's own repository."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from subprocess_env import inner_pytest_env

ROOT = Path(__file__).resolve().parent.parent
MISBEHAVING = ROOT / "tests" / "plugins" / "misbehaving.py"


def start(report: Path, *args: str) -> subprocess.Popen:
    """`harness run` on mhc's smoke cells in a session of its own (killpg reaches its workers too)."""
    cmd = [sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--device", "cpu",
           "--report", str(report), "--no-progress", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=report,
                            start_new_session=True)


def hanging(report: Path) -> subprocess.Popen:
    """A run whose cells never finish: the "sleeps" backend sleeps an hour in every cell."""
    return start(report, "--backend", "sleeps", "--plugin", str(MISBEHAVING), "--dtype", "float32",
                 "--timeout", "600")


def harness(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def wait_for(pred, what: str, timeout: float = 240.0) -> None:
    t0 = time.time()
    while not pred():
        assert time.time() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


def header_written(jsonl: Path) -> bool:
    """The run's header line is in the JSONL, whole."""
    text = jsonl.read_text() if jsonl.exists() else ""
    return text.startswith('{"run"') and text.endswith("\n")


def cell_lines(jsonl: Path) -> list[str]:
    return [x for x in jsonl.read_text().splitlines() if x.startswith('{"schema"')]


def kill(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)


def killed_before_any_cell(tmp_path: Path) -> tuple[Path, int]:
    """Starts a hanging run, kills it -9 as soon as its JSONL header is written; the folder and how many
    cells the run planned."""
    p = hanging(tmp_path)
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    try:
        wait_for(lambda: header_written(jsonl) or p.poll() is not None, "the run's header")
    finally:
        kill(p)
    assert header_written(jsonl), p.stderr.read() if p.stderr else ""
    assert not cell_lines(jsonl)  # killed before any cell finished
    planned = json.loads(jsonl.read_text().splitlines()[0])["run"]["planned"]
    assert planned
    return tmp_path / "cpu", len(planned)


# -- 1. a report from the moment the run begins ---------------------------------------------------------


def test_a_run_killed_before_any_cell_finished_leaves_a_report_saying_it_is_incomplete(tmp_path: Path):
    folder, n = killed_before_any_cell(tmp_path)
    md = folder / "mhc_pre.md"
    assert md.exists(), sorted(p.name for p in folder.iterdir())
    text = md.read_text()
    assert "**Incomplete:" in text and f"0 of {n} planned cells have a result" in text, text
    assert "No cell has a result yet" in text and "harness run --kernel mhc" in text, text  # the run's header
    assert "`tiny-n2`: sleeps float32" in text, text  # the planned cells, listed as missing
    assert json.loads((folder / "mhc_pre.json").read_text())["cells"] == []


def test_harness_report_after_a_run_killed_before_any_cell_says_the_same(tmp_path: Path):
    folder, n = killed_before_any_cell(tmp_path)
    for p in (folder / "mhc_pre.md", folder / "mhc_pre.json"):
        p.unlink(missing_ok=True)  # drawn again from the JSONL alone
    r = harness("report", "--report", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(folder / "mhc_pre.md") in r.stdout, r.stdout
    text = (folder / "mhc_pre.md").read_text()
    assert "**Incomplete:" in text and f"0 of {n} planned cells have a result" in text, text
    assert "`tiny-n2`: sleeps float32" in text, text


class _Instant:
    """An executor whose cells finish at once (PASS, without figures): what is tested is the report."""

    def __init__(self, *args, **kw):
        self.durations, self.peaks, self.stats = {}, {}, {}

    def run(self, tasks, on_cell) -> None:
        from harness.measure.failures import error_cell

        for t in tasks:
            on_cell(error_cell(t.operator, t.backend, t.case, t.dtype, t.device, t.seed, "PASS", ""))

    def close(self) -> None:
        pass


def _session(report: Path):
    from harness.run.session import RunRequest, RunSession

    return RunSession(RunRequest(["mhc_pre"], "smoke", ["golden"], ["float32"], "cpu", report=str(report),
                                 command="harness run (test)"))


def test_the_report_is_redrawn_while_the_run_goes_on_at_most_every_interval(tmp_path: Path, monkeypatch):
    import types

    from harness.measure.failures import error_cell
    from harness.run import session

    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(session, "time", types.SimpleNamespace(monotonic=lambda: clock.now, time=time.time),
                        raising=False)
    s = _session(tmp_path)
    n = len(s.plan.tasks)
    md = tmp_path / "cpu" / "mhc_pre.md"
    s.begin()
    assert f"0 of {n} planned cells have a result" in md.read_text()
    cells = [error_cell(t.operator, t.backend, t.case, t.dtype, t.device, t.seed, "PASS", "") for t in s.plan.tasks]
    clock.now += 10.0
    s.record(cells[0])
    assert f"0 of {n} planned cells have a result" in md.read_text()  # not redrawn for every cell
    clock.now += 6.0
    s.record(cells[1])
    assert f"2 of {n} planned cells have a result" in md.read_text()  # 15 s after the last draw
    clock.now += 1.0
    s.record(cells[2])
    assert f"2 of {n} planned cells have a result" in md.read_text()
    for c in cells[3:]:
        s.record(c)
    s.render()
    assert "planned cells" not in md.read_text()


# -- 2. one run at a time per report folder --------------------------------------------------------------


def test_a_second_run_on_a_report_folder_in_use_is_refused_and_a_killed_run_frees_it(tmp_path: Path):
    first = hanging(tmp_path)
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    try:
        wait_for(lambda: header_written(jsonl) or first.poll() is not None, "the first run's header")
        before = jsonl.read_text()
        t0 = time.time()
        second = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "golden",
                         "--dtype", "float32", "--device", "cpu", "--report", str(tmp_path), "--no-progress")
        assert time.time() - t0 < 60
        assert second.returncode == 2, second.stdout + second.stderr
        [line] = [x for x in second.stderr.splitlines() if x.startswith("harness run: error:")]
        assert str(tmp_path / "cpu") in line and f"pid {first.pid}" in line, line
        assert "harness run --kernel mhc --sizes smoke --device cpu" in line and "--backend sleeps" in line, line
        assert "started 20" in line, line
        assert jsonl.read_text() == before  # the refused run wrote nothing
        assert not cell_lines(jsonl)
    finally:
        kill(first)
    third = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "golden",
                    "--dtype", "float32", "--device", "cpu", "--report", str(tmp_path), "--no-progress")
    assert third.returncode == 0, third.stdout + third.stderr
    assert len(cell_lines(jsonl)) == 1
    assert not (tmp_path / "cpu" / ".lock").exists()  # a run that ends releases the folder and removes the lock


def test_pytest_with_harness_report_on_a_folder_in_use_writes_nothing(tmp_path: Path):
    first = hanging(tmp_path)
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    try:
        wait_for(lambda: header_written(jsonl) or first.poll() is not None, "the first run's header")
        before = jsonl.read_text()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--harness-kernel", "mhc",
                            "--harness-backend", "golden", "--harness-dtype", "float32", "--harness-device", "cpu",
                            "--harness-sizes", "smoke", "-k", "tiny", "--harness-report", str(tmp_path)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600, env=inner_pytest_env())
        assert r.returncode == 4, r.stdout[-3000:]  # pytest's usage error, as harness run's exit 2
        assert f"is in use by another run (pid {first.pid}" in r.stdout + r.stderr, r.stdout[-3000:]
        assert jsonl.read_text() == before
    finally:
        kill(first)


def test_the_xdist_workers_of_one_pytest_session_share_its_report_folder(tmp_path: Path):
    """pytest -n 2: two processes, one run (one run id); both write, and the last one out frees the folder."""
    pytest.importorskip("xdist")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--harness-kernel",
                        "mhc", "--harness-backend", "golden", "--harness-dtype", "float32", "--harness-device", "cpu",
                        "--harness-sizes", "smoke", "--harness-report", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=inner_pytest_env())
    assert r.returncode == 0, r.stdout[-3000:]
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    runs = [json.loads(x)["run"]["run_id"] for x in jsonl.read_text().splitlines() if x.startswith('{"run"')]
    assert len(runs) == 2 and len(set(runs)) == 1, runs  # each worker opened the report, as the same run
    from harness.model.registry import get_operator
    assert len(cell_lines(jsonl)) == len(get_operator("mhc_pre").cases("smoke", "cpu"))
    assert not (tmp_path / "cpu" / ".lock").exists()


# -- 3. a full disk ---------------------------------------------------------------------------------------


class _FullDisk:
    """The report module's file writes on a disk that fills up: once ``fill`` returns True for a write, that
    write lands half its data and raises ENOSPC, and every write after it raises at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fill):
        import builtins
        import types

        from harness.store import reports as report

        self.fill, self.full, self.failed = fill, False, 0
        real_open, real_os = builtins.open, report.os
        disk = self

        class File:
            def __init__(self, f, name):
                self._f, self.name_ = f, name

            def write(self, data):
                data = data if isinstance(data, str) else bytes(data)
                if not disk.full and disk.fill(self.name_, data):
                    disk.full = True
                    self._f.write(data[: len(data) // 2])
                    self._f.flush()
                if disk.full:
                    disk.failed += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return self._f.write(data)

            def __getattr__(self, name):
                return getattr(self._f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._f.close()

        def fake_open(file, mode="r", *a, **kw):
            f = real_open(file, mode, *a, **kw)
            return File(f, str(file)) if any(m in mode for m in "wax+") else f

        def fake_fdopen(fd, mode="r", *a, **kw):
            f = real_os.fdopen(fd, mode, *a, **kw)
            return File(f, os.readlink(f"/proc/self/fd/{fd}")) if any(m in mode for m in "wax+") else f

        proxy = types.ModuleType("os")
        proxy.__dict__.update(real_os.__dict__)
        proxy.fdopen = fake_fdopen
        monkeypatch.setattr(report, "open", fake_open, raising=False)
        monkeypatch.setattr(report, "os", proxy)


def _third_cell(name: str, data) -> bool:
    """The disk fills up in the middle of the third cell appended to a JSONL."""
    text = data.decode() if isinstance(data, bytes) else data
    if name.endswith(".jsonl") and '"schema"' in text:
        _third_cell.n = getattr(_third_cell, "n", 0) + 1
        return _third_cell.n == 3
    return False


def test_a_full_disk_during_a_run_is_one_clear_error_and_keeps_what_was_written(tmp_path, monkeypatch, capsys):
    from harness.front import cli
    from harness.run import pool
    from harness.store.reports import load

    monkeypatch.chdir(tmp_path)  # anything written beside the report (a trace of an unexpected error) stays here
    monkeypatch.setattr(pool, "LocalPool", _Instant)
    args = ["run", "--kernel", "mhc_pre", "--sizes", "smoke", "--backend", "golden", "--dtype", "float32",
            "--device", "cpu", "--report", str(tmp_path), "--no-progress"]
    folder = tmp_path / "cpu"
    assert cli.main(args) == 0  # a complete run first
    first = {c.id for c in load(folder, "mhc_pre")[0]}
    capsys.readouterr()
    _third_cell.n = 0
    disk = _FullDisk(monkeypatch, _third_cell)
    assert cli.main(args) == 2
    assert disk.full
    out, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert err.startswith(f"harness run: error: cannot write the report in {folder}: No space left on device"), err
    monkeypatch.undo()  # space freed
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pool, "LocalPool", _Instant)
    cells, runs = load(folder, "mhc_pre")  # readable: the earlier run's cells and the two written before
    assert {c.id for c in cells} == first and len(runs) == 2
    assert sum(c.run_id == list(runs)[-1] for c in cells) == 2
    md = (folder / "mhc_pre.md").read_text()  # the report drawn when the run began, whole
    assert f"2 of {len(first)} planned cells of the latest run have no result" not in md
    assert "Incomplete:" in md and md.endswith("\n")
    assert not list(folder.glob(".*.tmp"))
    assert cli.main(args) == 0  # the folder is usable again, the JSONL appends cleanly
    cells, runs = load(folder, "mhc_pre")
    assert len(runs) == 3 and all(c.run_id == list(runs)[-1] for c in cells)
    assert "planned cells" not in (folder / "mhc_pre.md").read_text()


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    from harness.store.reports import atomic_write

    target = tmp_path / "mhc_pre.md"
    atomic_write(target, "old report\n")
    _FullDisk(monkeypatch, lambda name, data: True)
    with pytest.raises(OSError) as e:
        atomic_write(target, "new report " * 1000)
    assert e.value.errno == errno.ENOSPC
    assert target.read_text() == "old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mhc_pre.md"]


def test_a_jsonl_with_a_truncated_last_line_loads_every_earlier_cell_and_renders(tmp_path, caplog):
    from harness.measure.failures import error_cell
    from harness.render.report import ReportWriter, render
    from harness.store.reports import load

    s = _session(tmp_path)
    tasks = s.plan.tasks
    folder = tmp_path / "cpu"
    w = ReportWriter(tmp_path, "cpu", {**s.header, "run_id": "r1"})
    w.begin(["mhc_pre"])
    for t in tasks:
        w.append(error_cell(t.operator, t.backend, t.case, t.dtype, t.device, t.seed, "PASS", ""))
    jsonl = folder / "mhc_pre.jsonl"
    text = jsonl.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    jsonl.write_text(text[: len(text) - len(last) // 2 - 1])  # the last append cut in the middle
    with caplog.at_level(logging.WARNING, logger="harness"):
        cells, runs = load(folder, "mhc_pre")
    assert len(cells) == len(tasks) - 1 and list(runs) == ["r1"]
    assert any(f"{jsonl}:{len(tasks) + 1}" in r.getMessage() and "skipped" in r.getMessage()
               for r in caplog.records), caplog.text
    paths = render(folder, "mhc_pre")
    md = (folder / "mhc_pre.md").read_text()
    assert folder / "mhc_pre.md" in paths and f"1 of {len(tasks)} planned cells of the latest run have no result" in md
    # a later run appends after the cut line without losing its own header or cells
    w2 = ReportWriter(tmp_path, "cpu", {**s.header, "run_id": "r2", "planned": {"mhc_pre": [
        t.id.planned for t in tasks]}})
    w2.begin(["mhc_pre"])
    t = tasks[-1]
    w2.append(error_cell(t.operator, t.backend, t.case, t.dtype, t.device, t.seed, "PASS", ""))
    cells, runs = load(folder, "mhc_pre")
    assert list(runs) == ["r1", "r2"] and len(cells) == len(tasks)
    assert [c.run_id for c in cells].count("r2") == 1


# -- 4. a plugin's own repository --------------------------------------------------------------------------

ADAPTER = '''
from harness.backends.golden.mhc_pre import backward, forward

from harness import Backend, register_backend

register_backend(Backend(operator="mhc_pre", name="mine", impl=forward, backward=backward, devices=("cpu", "cuda"),
                         sources=(__file__,)))
'''


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_names_the_commit_of_its_plugin_repository(tmp_path: Path):
    repo = tmp_path / "adapter-repo"
    repo.mkdir()
    (repo / "adapter.py").write_text(ADAPTER)
    _git(repo, "init", "-q")
    _git(repo, "add", "adapter.py")
    _git(repo, "commit", "-q", "-m", "adapter")
    head = _git(repo, "rev-parse", "HEAD")
    rep = tmp_path / "rep"
    r = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "mine", "--plugin",
                str(repo / "adapter.py"), "--dtype", "float32", "--device", "cpu", "--report", str(rep),
                "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    header = json.loads((rep / "cpu" / "mhc_pre.jsonl").read_text().splitlines()[0])["run"]
    [plugin] = header["plugins"]
    assert plugin["path"] == str((repo / "adapter.py").resolve())
    assert head.startswith(plugin["commit"]) and len(plugin["commit"]) >= 12, plugin
    first = (rep / "cpu" / "mhc_pre.md").read_text().split("\n\n")[1]  # the line naming the run
    assert f"commit `{header['commit']}`" in first and f"`adapter.py` at `{plugin['commit']}`" in first, first


def test_a_plugin_commit_is_dirty_with_uncommitted_changes_and_unknown_outside_git(tmp_path: Path, monkeypatch):
    from harness.store.provenance import plugin_provenance

    repo = tmp_path / "adapter-repo"
    repo.mkdir()
    (repo / "adapter.py").write_text(ADAPTER)
    _git(repo, "init", "-q")
    _git(repo, "add", "adapter.py")
    _git(repo, "commit", "-q", "-m", "adapter")
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    assert plugin_provenance([str(repo / "adapter.py")])[0]["commit"] == head
    (repo / "adapter.py").write_text(ADAPTER + "# changed\n")
    assert plugin_provenance([str(repo / "adapter.py")])[0]["commit"] == head + "+dirty"
    (repo / "other.py").write_text(ADAPTER)  # a plugin file git does not track: not what the commit holds
    assert plugin_provenance([str(repo / "other.py")])[0]["commit"] == head + "+dirty"
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "adapter.py").write_text(ADAPTER)
    [p] = plugin_provenance([str(alone / "adapter.py")])
    assert (p["path"], p["commit"]) == (str((alone / "adapter.py").resolve()), "unknown")
    (repo / "adapter_mod_41.py").write_text(ADAPTER)  # a plugin given as a module: the file it loads from
    _git(repo, "add", "adapter_mod_41.py", "adapter.py")
    _git(repo, "commit", "-q", "-m", "module")
    monkeypatch.syspath_prepend(str(repo))
    [m] = plugin_provenance(["adapter_mod_41"])
    assert m["path"] == str((repo / "adapter_mod_41.py").resolve())
    assert m["commit"] == _git(repo, "rev-parse", "--short=12", "HEAD") and m["plugin"] == "adapter_mod_41"
    assert "adapter_mod_41" not in sys.modules  # found, not imported (it registers backends)
