"""`harness run --executor ray` (harness/run/ray_executor.py) on a two-node Ray cluster on this machine.

The cluster is this module's (ray.cluster_utils: a head and a second node of one CPU each), or the one
HARNESS_RAY_TEST_ADDRESS names (.ci/ray-cluster starts one with `ray start`). The runs go through the
command line in a subprocess, as a user's would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.judge.judgement import judge_cell
from harness.model.records import CellRecord
from harness.model.spec import Case
from harness.run import memory as run_memory
from harness.run import plan as run_plan
from harness.run import single as run_single
from harness.run.ray_executor import gpu_fraction, runtime_env

# one xdist worker runs them all (pytest --dist loadgroup): one cluster, not one per worker
pytestmark = pytest.mark.xdist_group("ray")

ROOT = Path(__file__).resolve().parent.parent
MISBEHAVING = "golden,raises,sleeps,dies,segfaults"


def _cells(report: Path, op: str = "mhc_pre") -> dict[tuple, dict]:
    out = {}
    for line in (report / "cpu" / f"{op}.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "status" in d:  # a cell's record, judged as a report judges it
            shown = judge_cell(CellRecord.from_json(d)).shown
            out[(d["backend"], d["dtype"], d["case"]["name"])] = {**d, "shown": shown}
    return out


def _harness(*args: str, ray_address: str | None = None, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "harness", "run", *args, "--device", "cpu", "--no-progress"]
    if ray_address:
        cmd += ["--executor", "ray", "--ray-address", ray_address]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})


def _wait(p: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


# -- without a cluster ----------------------------------------------------------------------------------


def test_a_session_whose_cells_run_elsewhere_plans_the_cluster_gpu_from_a_machine_without_one(tmp_path: Path):
    """A driver without a GPU (a cluster's head) plans a GPU sweep: the device and its class are the
    cluster's (RunRequest.elsewhere), and no backend is skipped for this machine's lack of a GPU."""
    from harness.run.session import RunRequest, RunSession

    there = {"device": "NVIDIA H100 80GB HBM3", "device_class": "h100", "versions": {"torch": "2.11.0"}}
    s = RunSession(RunRequest(["softmax_xent"], "smoke", device="cuda", report=str(tmp_path), elsewhere=there))
    assert (s.device, s.device_class, s.report_dir) == ("cuda", "h100", tmp_path / "h100")
    assert (s.header["device"], s.header["versions"]) == (there["device"], there["versions"])
    cuda = [t for t in s.plan.tasks if t.backend == "cuda"]
    assert cuda and not any(t.skip for t in cuda)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine can run the CUDA backend")
def test_a_worker_skips_a_backend_that_cannot_run_on_its_machine():
    """What the driver did not judge, the worker does: a GPU-only backend on a machine without a GPU is a
    SKIP cell naming why (not an ERROR, not a dead worker)."""
    case = Case("zoo-N8-V1025", {"N": 8, "V": 1025, "ignored": 0.2})
    cells = run_single.CellWorker("cpu", [], timeout=120)
    try:
        cell = cells.run(run_plan.Task("softmax_xent", "cuda", case, "float32", "cuda"))
        again = cells.run(run_plan.Task("softmax_xent", "torch", case, "float32", "cpu"))
    finally:
        cells.close()
    assert (cell.status.value, cell.skip_kind) == ("SKIP", "unavailable"), cell.error
    assert "no CUDA device on this machine" in cell.error
    assert judge_cell(again).shown == "PASS"


def test_without_ray_the_executor_is_a_usage_error_naming_the_extra(tmp_path: Path):
    code = ("import sys; sys.modules['ray'] = None; from harness.front.cli import main; "
            f"sys.exit(main(['run', '--kernel', 'mhc', '--case', 'tiny', '--device', 'cpu', '--report', "
            f"{str(tmp_path)!r}, '--executor', 'ray']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert 'pip install "gradient-harness[ray]"' in r.stderr
    assert not (tmp_path / "cpu").exists()  # refused before a report was opened


def test_nothing_imports_ray_unless_asked():
    code = ("import sys, harness.front.cli, harness.run.session, harness.run.pool, harness.front.pytest_plugin; "
            "harness.front.parser.parser().parse_args(['run', '--kernel', 'mhc']); "
            "assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_gpu_fractions_come_from_recorded_peaks():
    def group(*names):
        return [run_plan.Task("mhc_pre", n, Case("c", {}), "float32", "cuda") for n in names]

    g = group("a", "b")
    peaks = {g[0].id: 3000.0, g[1].id: 9000.0}
    assert gpu_fraction(g, peaks, 1, 80_000) == 1.0  # not shared: the whole GPU
    budget = 0.9 * 80_000 - 4 * run_memory.CONTEXT_MB
    assert gpu_fraction(g, peaks, 4, 80_000) == pytest.approx(max(0.25, 9000 / budget), abs=1e-4)
    big = {g[1].id: 70_000.0}
    assert gpu_fraction(g, big, 4, 80_000) == 1.0  # more than sharing leaves: alone
    assert gpu_fraction(group("x"), {}, 4, 80_000) == 0.25  # nothing recorded: a quarter (4 per GPU)
    assert gpu_fraction(g, peaks, 3, None) == 0.3333


def test_plugins_travel_with_the_checkout_or_their_folder(tmp_path: Path):
    outside = tmp_path / "adapters" / "mine.py"
    outside.parent.mkdir()
    outside.write_text("")
    env, specs = runtime_env([str(ROOT / "tests/plugins/misbehaving.py"), str(outside), "some.module"], ROOT)
    assert env["working_dir"] == str(ROOT) and "/reports/" in env["excludes"] and "/.git/" in env["excludes"]
    assert env["py_modules"] == [str(outside.parent)]
    assert specs == ["tests/plugins/misbehaving.py", "@py_modules:adapters/mine.py", "some.module"]


# -- on a two-node cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_address():
    pytest.importorskip("ray")
    if os.environ.get("HARNESS_RAY_TEST_ADDRESS"):
        yield os.environ["HARNESS_RAY_TEST_ADDRESS"]
        return
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    try:
        yield c.address
    finally:
        c.shutdown()


def test_same_cells_as_the_local_runner_spread_over_two_workers(cluster_address: str, tmp_path: Path):
    """The misbehaving plugin's crash, hang and exception become the same CRASH/TIMEOUT/ERROR cells, the
    other cells the same verdicts; the two groups (float16, float32) ran on two Ray workers."""
    # golden's cells take ~1 s alone, but on CI's two cores, beside the local twin, Ray and another test, the
    # first cell of a Ray worker timed out at 10 s and again at 20 s (two CI runs in a row); the timeout only
    # has to tell the sleeper (an hour) from them
    args = ["--kernel", "mhc", "--case", "tiny", "--backend", MISBEHAVING, "--plugin", "tests/plugins/misbehaving.py",
            "--timeout", "60"]
    on_ray = _harness(*args, "--report", str(tmp_path / "ray"), ray_address=cluster_address)
    local = _harness(*args, "--report", str(tmp_path / "local"))
    (rc_ray, out_ray), (rc_local, out_local) = _wait(on_ray), _wait(local)
    assert rc_ray == rc_local == 1, out_ray[-3000:] + out_local[-3000:]
    got, want = _cells(tmp_path / "ray"), _cells(tmp_path / "local")
    assert set(got) == set(want) and len(got) == 10
    assert {k: c["shown"] for k, c in got.items()} == {k: c["shown"] for k, c in want.items()}
    f32 = {k[0]: c for k, c in got.items() if k[1] == "float32"}
    assert f32["golden"]["shown"] == "PASS"
    assert f32["raises"]["status"] == "ERROR" and "invalid configuration" in f32["raises"]["error"]
    assert f32["sleeps"]["status"] == "TIMEOUT"
    assert f32["dies"]["status"] == "CRASH" and "(exit code 7)" in f32["dies"]["error"]
    assert f32["segfaults"]["status"] == "CRASH" and "killed by signal SIGSEGV" in f32["segfaults"]["error"]
    ran = [c for c in got.values() if c["status"] != "SKIP"]
    assert all(c["ran_on"]["executor"] == "ray" and c["ran_on"]["device_class"] == "cpu"
               and c["ran_on"]["versions"]["torch"] for c in ran)
    assert len({c["worker"] for c in ran}) >= 2, {c["worker"] for c in ran}
    assert len({c["ran_on"]["node_id"] for c in ran}) >= 2
    assert "cells per worker" in out_ray


SLOW_PLUGIN = '''
import os, time
from harness.backends.golden.mhc_pre import backward, forward
from harness import Backend, register_backend

def _slow(name):
    def impl(x, phi, alpha, bias, gamma=None, **kw):
        with open({pids!r}, "a") as f:
            f.write(f"{{name}} {{os.getpid()}} {{os.getppid()}}\\n")
        time.sleep(60)
        return forward(x, phi, alpha, bias, gamma, **kw)
    return impl

for n in ("slow-a", "slow-b"):
    register_backend(Backend(operator="mhc_pre", name=n, impl=_slow(n), backward=backward, devices=("cpu",)))
for n in ("after", "later"):
    register_backend(Backend(operator="mhc_pre", name=n, impl=forward, backward=backward, devices=("cpu",)))
'''


def test_a_killed_worker_costs_its_own_cell_only(cluster_address: str, tmp_path: Path):
    """The harness worker killed in one cell (slow-a), the Ray worker running the task killed in the next
    (slow-b): each is a CRASH of its own cell; the others, those after them in the group included, pass.
    The plugin lives outside the checkout (it travels with its folder). Then --resume runs only the cell
    that the first run did not plan."""
    pids = tmp_path / "pids"
    plugin = tmp_path / "adapters" / "slow_kernels.py"
    plugin.parent.mkdir()
    plugin.write_text(textwrap.dedent(SLOW_PLUGIN.format(pids=str(pids))))
    args = ["--kernel", "mhc", "--case", "tiny", "--dtype", "float32", "--plugin", str(plugin), "--timeout", "120",
            "--report", str(tmp_path / "r")]
    commit = {"HARNESS_COMMIT": "ray-executor-test"}  # --resume reuses results of a clean commit only
    p = _harness(*args, "--backend", "golden,slow-a,slow-b,after", ray_address=cluster_address, env=commit)
    killed: set[str] = set()
    deadline = time.time() + 200
    while len(killed) < 2 and time.time() < deadline and p.poll() is None:
        for line in pids.read_text().splitlines() if pids.exists() else []:
            name, pid, ppid = line.split()
            if name not in killed:
                time.sleep(0.5)
                os.kill(int(pid if name == "slow-a" else ppid), signal.SIGKILL)
                killed.add(name)
        time.sleep(0.2)
    rc, out = _wait(p)
    assert killed == {"slow-a", "slow-b"}, out[-3000:]
    assert rc == 1, out[-3000:]
    by = {k[0]: c for k, c in _cells(tmp_path / "r").items()}
    assert by["slow-a"]["status"] == "CRASH" and "killed by signal 9 (SIGKILL)" in by["slow-a"]["error"], by["slow-a"]
    assert by["slow-b"]["status"] == "CRASH" and "Ray worker died" in by["slow-b"]["error"], by["slow-b"]
    assert by["golden"]["shown"] == by["after"]["shown"] == "PASS"
    rc, out = _wait(_harness(*args, "--backend", "golden,slow-a,slow-b,after,later", "--resume",
                             ray_address=cluster_address, env=commit))
    assert "4 of 5 cells already have a result" in out, out[-3000:]
    assert rc == 0, out[-3000:]  # this run's own cells decide its exit code, as locally
    again = {k[0]: c for k, c in _cells(tmp_path / "r").items()}
    assert again["later"]["shown"] == "PASS" and again["later"]["ran_on"]["executor"] == "ray"
    assert again["slow-a"]["status"] == "CRASH"  # kept, not run again
