"""Interrupts and kills: what completed is kept, the report says the run is incomplete, the user is told how to
finish it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = ROOT / "tests" / "plugins" / "misbehaving.py"


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--device", "cpu",
           "--report", str(tmp_path), "--no-progress", *args]
    # a session of its own: the signal goes to the whole process group, as Ctrl-C on a terminal does; and
    # SIGINT's default action, as in a terminal: a test run started in the background (`cmd &` in a script)
    # ignores SIGINT, and a process started with it ignored keeps ignoring it (no KeyboardInterrupt at all)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            start_new_session=True, preexec_fn=_sigint_default)


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cells_in(jsonl: Path) -> int:
    return sum(1 for line in jsonl.read_text().splitlines() if line.startswith('{"schema"')) if jsonl.exists() else 0


def wait_for(pred, timeout: float = 240.0) -> None:
    t0 = time.time()
    while not pred():
        assert time.time() - t0 < timeout, "timed out waiting"
        time.sleep(0.5)


def test_ctrl_c_stops_workers_keeps_what_completed_and_prints_the_resume_command(tmp_path: Path):
    # golden's cells finish quickly; "sleeps" hangs in its cell until the interrupt
    p = start(tmp_path, "--backend", "golden,sleeps", "--plugin", str(SLEEPY), "--dtype", "float32",
              "--workers", "1", "--timeout", "600")
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    wait_for(lambda: cells_in(jsonl) >= 1)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 130, out
    assert "Traceback" not in out, out
    assert "interrupted: workers stopped;" in out and " cells completed" in out
    assert "to run the " in out and " remaining cells: harness run --kernel mhc" in out and out.rstrip().endswith(
        "--resume"), out
    md = (tmp_path / "cpu" / "mhc_pre.md").read_text()
    assert "**Incomplete:" in md
    # no worker outlived the interrupt
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", f"--report {tmp_path}"], capture_output=True, text=True).stdout.split()
    assert not left, left


def _workers_of(pid: int) -> list[int]:
    """The harness worker processes that ``pid`` started (multiprocessing's spawn children)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat, cmd = (d / "stat").read_text(), (d / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and b"spawn_main" in cmd:
            out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def test_sigterm_is_handled_as_ctrl_c_is_and_exits_143(tmp_path: Path):
    """SIGTERM (a scheduler's stop, `kill PID`) to the run's process alone: the workers stopped, the cells that
    completed kept and summarized, the report marked incomplete, the --resume command printed; exit 128+15."""
    p = start(tmp_path, "--backend", "golden,sleeps", "--plugin", str(SLEEPY), "--dtype", "float32",
              "--workers", "1", "--timeout", "600")
    jsonl = tmp_path / "cpu" / "mhc_pre.jsonl"
    workers: list[int] = []
    try:
        wait_for(lambda: cells_in(jsonl) >= 1)
        time.sleep(1.0)
        workers = _workers_of(p.pid)
        assert workers
        os.kill(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
        for w in workers:  # what the code under test left running
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert p.returncode == 143, out
    assert "Traceback" not in out, out
    assert "interrupted: workers stopped;" in out and " cells completed" in out, out
    assert "golden" in out and " pass" in out, out  # the summary of what completed
    assert "to run the " in out and " remaining cells: harness run --kernel mhc" in out and out.rstrip().endswith(
        "--resume"), out
    assert "**Incomplete:" in (tmp_path / "cpu" / "mhc_pre.md").read_text()
    assert cells_in(jsonl) >= 1
    assert not [w for w in workers if _alive(w)], workers


def test_a_killed_run_leaves_its_report_marked_incomplete_not_stale(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--device",
                        "cpu", "--backend", "golden", "--dtype", "float32", "--report", str(tmp_path),
                        "--no-progress"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    md = tmp_path / "cpu" / "mhc_pre.md"
    assert "**Incomplete:" not in md.read_text()
    p = start(tmp_path, "--backend", "golden,sleeps", "--plugin", str(SLEEPY), "--dtype", "float32",
              "--workers", "1", "--timeout", "600")
    wait_for(lambda: "**Incomplete:" in md.read_text())
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    text = md.read_text()
    assert "**Incomplete:" in text and "or is still running; `--resume` runs them" in text, text[:2000]


def test_a_ctrl_c_while_a_worker_is_spawned_reaches_the_parent_afterwards():
    """The parent holds SIGINT back while it spawns a worker; one that arrives then still interrupts it (at
    once where another thread takes the signal, else right after the spawn), instead of being dropped, as
    it was when the parent ignored SIGINT during the spawn."""
    from harness.run import processes as run_processes

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, however pytest started
    try:
        with pytest.raises(KeyboardInterrupt):
            with run_processes.sigint_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, before)
