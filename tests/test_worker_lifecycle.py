"""Worker processes live no longer than their run (issue #41): a run killed with SIGKILL takes its hung workers and
the processes their kernels started with it; a worker killed or stopped by the runner takes its kernel's
processes; a backend that hangs twice is given up on; a worker killed from outside (the OOM killer) is a CRASH
that says so, and the sweep goes on. The plugin backends are tests/plugins/lifecycle.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.judge.judgement import judge_cell
from harness.model import registry
from harness.model.records import CellRecord
from harness.run import plan as run_plan
from harness.run import pool as run_pool
from harness.run import single as run_single

ROOT = Path(__file__).resolve().parent.parent
LIFECYCLE = str(ROOT / "tests" / "plugins" / "lifecycle.py")
NOT_RUN = "not run: the backend hung twice"
OOM = "killed by signal 9 (SIGKILL): often the kernel's OOM killer; see dmesg"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")


def smoke_cases() -> int:
    """mhc_pre's smoke cases on a CPU: what a run of one backend over both dtypes has twice."""
    from harness.model.registry import get_operator
    return len(get_operator("mhc_pre").cases("smoke", "cpu"))


def harness_run(tmp_path: Path, pids: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--device", "cpu",
           "--report", str(tmp_path / "r"), "--no-progress", "--plugin", LIFECYCLE, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            start_new_session=True, env={**os.environ, "LIFECYCLE_PIDS": str(pids)})


def notes(pids: Path) -> list[dict]:
    """What the lifecycle backends noted, one entry per call."""
    out = []
    for line in pids.read_text().splitlines() if pids.exists() else []:
        name, pid, pgid, child, t = line.split()
        out.append({"name": name, "pid": int(pid), "pgid": int(pgid), "child": int(child), "t": float(t)})
    return out


def cells(tmp_path: Path) -> list[dict]:
    jsonl = tmp_path / "r" / "cpu" / "mhc_pre.jsonl"
    return [{**d, "shown": judge_cell(CellRecord.from_json(d)).shown}  # judged as a report judges it
            for d in map(json.loads, jsonl.read_text().splitlines()) if "status" in d]


def wait_for(pred, timeout: float = 240.0, what: str = "") -> None:
    t0 = time.time()
    while not pred():
        assert time.time() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, or None where it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    """Running, or stopped: a zombie (dead, not yet reaped by whoever inherited it) is not alive."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def living_in_groups(pgids: set[int]) -> list[int]:
    """The live processes of these process groups."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st is not None and st[1] in pgids and st[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


def kill_leftovers(ns: list[dict]) -> None:
    """Whatever the code under test left running (before its fix): not left to slow the other tests."""
    for n in ns:
        for pid in (n["pid"], n["child"]):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_run_killed_with_sigkill_takes_its_hung_workers_and_their_children_with_it(tmp_path: Path):
    """kill -9 of `harness run` while one worker spins in a tight Python loop and the other is blocked in a C
    call, each having started a process of its own: within 10 s nothing of the workers' process groups is
    left (before: the workers, re-parented to pid 1, hung on, and their children with them)."""
    pids = tmp_path / "pids"
    # two cell groups (float32, float16), one per worker: spins runs in one (blocks takes float16 only), blocks
    # in the other (spins takes float32 only)
    p = harness_run(tmp_path, pids, "--backend", "spins,blocks", "--case", "tiny", "--dtype", "float32,float16",
                    "--workers", "2", "--timeout", "600")
    try:
        wait_for(lambda: {n["name"] for n in notes(pids)} == {"spins", "blocks"} or p.poll() is not None,
                 what="both cells in flight")
        assert p.poll() is None, p.communicate()[0]
        time.sleep(0.5)
        ns = notes(pids)
        groups = {n["pgid"] for n in ns}
        procs = {n["pid"] for n in ns} | {n["child"] for n in ns}
        assert all(alive(pid) for pid in procs), ns
        os.kill(p.pid, signal.SIGKILL)  # the run's process only: its workers are left to the code under test
        p.wait(timeout=60)  # (not its output: a worker left alive would hold the pipe open)
        t0 = time.time()
        while time.time() - t0 < 10 and (living_in_groups(groups) or any(alive(pid) for pid in procs)):
            time.sleep(0.2)
        left = sorted(set(living_in_groups(groups)) | {pid for pid in procs if alive(pid)})
        assert not left, f"alive 10 s after kill -9 of the run: {left} (workers and children: {ns})"
    finally:
        if p.poll() is None:
            p.kill()
        kill_leftovers(notes(pids))


def test_the_processes_a_kernel_starts_end_with_the_run(tmp_path: Path):
    """A backend that leaves a process running at each call, in a cell that passes and in one that times out
    (its worker killed): when the run has ended, none of those processes is left."""
    pids = tmp_path / "pids"
    p = harness_run(tmp_path, pids, "--backend", "spawns,spawns-hangs", "--case", "tiny", "--dtype", "float32",
                    "--timeout", "5")
    try:
        out, _ = p.communicate(timeout=300)
        ns = notes(pids)
        by = {c["backend"]: c for c in cells(tmp_path)}
        assert by["spawns"]["shown"] == "PASS", out
        assert by["spawns-hangs"]["status"] == "TIMEOUT", out
        assert {n["name"] for n in ns} == {"spawns", "spawns-hangs"}, ns
        children = [n["child"] for n in ns]
        wait_for(lambda: not any(alive(c) for c in children), 5, "the kernel's processes to end")
    finally:
        kill_leftovers(notes(pids))


def _task(backend: str, dtype: str = "float32", case: str = "tiny-n2") -> run_plan.Task:
    registry.discover()
    c = next(c for c in registry.get_operator("mhc_pre").cases("smoke", "cpu") if c.name == case)
    return run_plan.Task("mhc_pre", backend, c, dtype, "cpu", repeats=1)


def test_a_worker_killed_for_its_timeout_takes_its_kernels_processes(tmp_path: Path, monkeypatch):
    """The local pool kills the worker of a cell that timed out with its process group: the kernel's process is gone
    before the next cell is handed over; and a single worker (CellWorker) does the same (before close)."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("LIFECYCLE_PIDS", str(pids))
    seen: list[tuple[str, str, list[bool]]] = []

    def on_cell(cell) -> None:  # the children of the cells noted so far: alive or not when this cell is handed over
        seen.append((cell.backend, judge_cell(cell).shown, [alive(n["child"]) for n in notes(pids)]))

    try:
        with run_pool.LocalPool([LIFECYCLE], workers=1, timeout=4) as pool:
            pool.run([_task("spawns-hangs", "float32"), _task("golden", "float16")], on_cell)
        assert [s[:2] for s in seen] == [("spawns-hangs", "TIMEOUT"), ("golden", "PASS")], seen
        assert seen[1][2] == [False], seen  # the timed-out worker's child was killed with it

        pids.unlink()
        cells = run_single.CellWorker("cpu", [LIFECYCLE], timeout=4)
        try:
            assert cells.run(_task("spawns-hangs")).status.value == "TIMEOUT"
            [n] = notes(pids)
            wait_for(lambda: not alive(n["child"]), 5, "the timed-out kernel's process to end")
            assert judge_cell(cells.run(_task("spawns"))).shown == "PASS"
            spawned = [n["child"] for n in notes(pids) if n["name"] == "spawns"]
            assert spawned and all(alive(c) for c in spawned)  # the worker is alive, and its kernel's process
        finally:
            cells.close()
        wait_for(lambda: not any(alive(c) for c in spawned), 5, "the kernel's processes to end with close()")
    finally:
        kill_leftovers(notes(pids))


def test_a_backend_that_hangs_twice_in_a_row_is_given_up_on(tmp_path: Path):
    """At --timeout 3 a backend that hangs costs the mhc smoke two timeouts, not one per cell: the first two
    cells are TIMEOUT with the timeout's message, the rest TIMEOUT "not run: the backend hung twice" without
    running; exit 1."""
    pids = tmp_path / "pids"
    t0 = time.time()
    p = harness_run(tmp_path, pids, "--backend", "hangs", "--timeout", "3", "--workers", "1")
    out, _ = p.communicate(timeout=600)
    wall = time.time() - t0
    ns = notes(pids)
    kill_leftovers(ns)
    got = cells(tmp_path)
    print(f"hang test: {len(got)} cells, {len(ns)} run, {wall:.1f} s in all, "
          f"{wall - (ns[0]['t'] - t0) if ns else 0:.1f} s from the first hang")
    assert p.returncode == 1, out
    assert len(got) == 2 * smoke_cases() and all(c["status"] == "TIMEOUT" for c in got), out
    assert [c["error"] for c in got[:2]] == ["no result after 3 s; worker killed and restarted"] * 2, got[:2]
    cases = smoke_cases()
    assert [c["error"] for c in got[2:]] == [NOT_RUN] * (2 * cases - 2), [c["error"] for c in got]
    assert [x["name"] for x in ns] == ["hangs", "hangs"], ns  # the others never reached the backend
    summary = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["hangs"]]  # "hangs float16 8 timeout"
    assert sorted(ln[1:] for ln in summary) == [["float16", str(cases), "timeout"],
                                                ["float32", str(cases), "timeout"]], out
    # two timeouts, not ten: from the second hang's start, one timeout and the run's end (before: 8 more cells,
    # each a timeout and a worker's restart, 37 s at --workers 2)
    assert time.time() - ns[1]["t"] < 3 * 3, out


def test_the_pytest_plugins_worker_gives_up_on_a_backend_that_hangs_twice(tmp_path: Path, monkeypatch):
    """SingleWorker (one pytest item per cell) runs cells through its CellWorker, which asks the same guard."""
    from harness.run.single import SingleWorker

    pids = tmp_path / "pids"
    monkeypatch.setenv("LIFECYCLE_PIDS", str(pids))
    one = SingleWorker("cpu", [LIFECYCLE], timeout=2)
    try:
        got = [one.cells.run(_task("hangs", dt, case)) for case in ("tiny-n2", "n4-xT-gradpad")
               for dt in ("float32", "float16")]
        golden = one.cells.run(_task("golden"))
        later = one.cells.run(_task("hangs", "float32", "T16-xpad-gradT"))
    finally:
        one.close()
        kill_leftovers(notes(pids))
    assert [c.error for c in got] == ["no result after 2 s; worker killed"] * 2 + [NOT_RUN] * 2
    assert judge_cell(golden).shown == "PASS" and (later.status.value, later.error) == ("TIMEOUT", NOT_RUN)
    assert len(notes(pids)) == 2


def test_max_hangs_0_tries_every_cell(tmp_path: Path):
    pids = tmp_path / "pids"
    # T16-xpad-gradT and the twins of n2-D24-T17: five cells, each tried
    p = harness_run(tmp_path, pids, "--backend", "hangs", "--case", "T1", "--dtype", "float32", "--timeout", "2",
                    "--max-hangs", "0")
    out, _ = p.communicate(timeout=600)
    kill_leftovers(notes(pids))
    got = cells(tmp_path)
    assert p.returncode == 1, out
    assert len(got) == 5 and all(c["error"].startswith("no result after 2 s") for c in got), got
    assert len(notes(pids)) == 5


def test_a_worker_killed_from_outside_mid_cell_is_a_crash_that_names_sigkill(tmp_path: Path):
    """The OOM killer's SIGKILL, mid-cell: the cell is CRASH, says the worker was killed by SIGKILL and where to
    look, and the sweep goes on (the next group's cells run, in a new worker)."""
    pids = tmp_path / "pids"
    p = harness_run(tmp_path, pids, "--backend", "golden,hangs", "--case", "T1", "--dtype", "float32",
                    "--workers", "1", "--timeout", "600")
    killed: set[int] = set()
    try:
        t0 = time.time()
        while p.poll() is None and time.time() - t0 < 300:
            for n in notes(pids):
                if n["pid"] not in killed:
                    time.sleep(0.3)
                    os.kill(n["pid"], signal.SIGKILL)
                    killed.add(n["pid"])
            time.sleep(0.2)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert len(killed) == 5, out  # T16-xpad-gradT and the four twins of n2-D24-T17
    got = cells(tmp_path)
    assert p.returncode == 1, out
    hung = [c for c in got if c["backend"] == "hangs"]
    assert [c["status"] for c in hung] == ["CRASH"] * 5, hung
    assert all(c["error"] == f"worker process died ({OOM}) while running this cell" for c in hung), hung
    assert [c["shown"] for c in got if c["backend"] == "golden"] == ["PASS"] * 5, got


def test_the_hang_guard_counts_timeouts_in_a_row_per_backend():
    from harness.run.hangs import HangGuard

    g = HangGuard(2)
    t = _task("hangs")

    def cell(backend: str, status: str):
        c = _task(backend).failed(status, "x")
        return c

    g.seen(cell("hangs", "TIMEOUT"))
    g.seen(cell("other", "TIMEOUT"))
    g.seen(cell("hangs", "SKIP"))  # did not run: not an end of the row
    assert g.stand_in(t) is None
    g.seen(cell("hangs", "TIMEOUT"))
    stand_in = g.stand_in(t)
    assert stand_in is not None and (stand_in.status.value, stand_in.error) == ("TIMEOUT", NOT_RUN)
    assert g.stand_in(_task("other")) is None
    g.seen(stand_in)  # its own stand-ins count for nothing

    h = HangGuard(2)
    for s in ("TIMEOUT", "PASS", "TIMEOUT"):
        h.seen(cell("hangs", s))
    assert h.stand_in(t) is None  # not in a row
    never = HangGuard(0)
    for _ in range(5):
        never.seen(cell("hangs", "TIMEOUT"))
    assert never.stand_in(t) is None


@pytest.mark.xdist_group("ray")
def test_on_ray_a_backend_that_hangs_twice_is_given_up_on(tmp_path: Path):
    """The Ray executor's driver asks the same guard: groups wait on the driver, not in Ray's queue, so that
    once the backend has timed out twice in a row its cells not yet submitted are reported TIMEOUT without
    running. On a cluster of two one-CPU nodes at most one more cell, the one already running in the
    other slot, times out on its own."""
    pytest.importorskip("ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cluster = None
    address = os.environ.get("HARNESS_RAY_TEST_ADDRESS")
    if not address:
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        address = cluster.address
    try:
        r = subprocess.run([sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--sizes", "smoke", "--device",
                            "cpu", "--no-progress", "--plugin", "tests/plugins/lifecycle.py", "--backend", "hangs",
                            "--timeout", "3", "--report", str(tmp_path / "r"), "--executor", "ray", "--ray-address",
                            address], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    finally:
        if cluster is not None:
            cluster.shutdown()
    out = r.stdout[-3000:] + r.stderr[-3000:]
    got = cells(tmp_path)
    hung = [c for c in got if c["error"].startswith("no result after 3 s")]
    stood_in = [c for c in got if c["error"] == NOT_RUN]
    assert r.returncode == 1, out
    assert len(got) == 2 * smoke_cases() and all(c["status"] == "TIMEOUT" for c in got), out
    assert 2 <= len(hung) <= 3 and len(stood_in) == 2 * smoke_cases() - len(hung), [c["error"] for c in got]


@pytest.mark.parametrize("max_hangs, tried", [(None, 2), ("0", 3)])
def test_pytest_harness_max_hangs(tmp_path: Path, max_hangs: str | None, tried: int):
    """pytest's items follow the same rule; --harness-max-hangs 0 runs every item, as --max-hangs 0 does."""
    from subprocess_env import inner_pytest_env

    pids = tmp_path / "pids"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--harness-kernel", "mhc",
            "--harness-backend", "hangs", "--harness-dtype", "float32", "--harness-device", "cpu",
            "--harness-plugin", LIFECYCLE, "--harness-timeout", "2", "-k", "tiny or xT or T16"]
    args += ["--harness-max-hangs", max_hangs] if max_hangs is not None else []
    r = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=inner_pytest_env(LIFECYCLE_PIDS=str(pids)))
    kill_leftovers(notes(pids))
    assert "3 failed" in r.stdout, r.stdout[-3000:]
    assert len(notes(pids)) == tried, r.stdout[-3000:]
    assert (NOT_RUN in r.stdout) == (tried < 3), r.stdout[-3000:]


FLAKY_HANG = '''
import os, time
from harness.backends.golden.mhc_pre import backward, forward
from harness import Backend, register_backend

def impl(x, phi, alpha, bias, gamma=None, **kw):
    if os.environ.get("HANG_NOW"):
        time.sleep(3600)  # a stuck GPU, a deadlock that a restart clears: not the kernel's numerics
    return forward(x, phi, alpha, bias, gamma, **kw)

register_backend(Backend(operator="mhc_pre", name="sometimes-hangs", impl=impl, backward=backward,
                         devices=("cpu",)))
'''


def test_resume_runs_the_cells_not_run_because_the_backend_hung(tmp_path: Path):
    """A cell given up on ("not run: the backend hung twice") has no result: --resume at the same commit
    runs it; the two that hung keep their TIMEOUT."""
    plugin = tmp_path / "flaky.py"
    plugin.write_text(FLAKY_HANG)
    args = [sys.executable, "-m", "harness", "run", "--kernel", "mhc", "--device", "cpu", "--dtype", "float32",
            "--backend", "sometimes-hangs", "--plugin", str(plugin), "--report", str(tmp_path / "r"), "--workers",
            "1", "--timeout", "2", "--no-progress"]
    env = {**os.environ, "HARNESS_COMMIT": "resume-after-hangs"}
    first = subprocess.run(args, capture_output=True, text=True, timeout=600, env={**env, "HANG_NOW": "1"})
    assert first.returncode == 1, first.stdout + first.stderr
    hung = [c for c in cells(tmp_path) if c["error"].startswith("no result after")]
    given_up = [c for c in cells(tmp_path) if c["error"] == NOT_RUN]
    assert len(hung) == 2 and len(given_up) == smoke_cases() - 2, cells(tmp_path)
    again = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=600, env=env)
    assert f"2 of {smoke_cases()} cells already have a result" in again.stdout, again.stdout + again.stderr
    latest = {c["case"]["name"]: c["shown"] for c in cells(tmp_path)}  # the last record of each case wins
    assert sorted(latest.values()) == ["PASS"] * (smoke_cases() - 2) + ["TIMEOUT"] * 2, latest
