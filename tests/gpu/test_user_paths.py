"""The user paths end to end on a real GPU: what a user types, in a subprocess, as a user would.

Run on a GPU machine with `.ci/gpu-user-paths` (it records the evidence); on a machine without a GPU the
module is skipped as a whole, with that reason. Each test is one path of issue #41: two runs of different
operators into one fresh report folder; an operator and a backend from a plugin in a folder of their own
through `harness run`, `harness check` and `pytest --plugin`; kill -9 then `--resume`; Ctrl-C and SIGTERM;
`--compare` against a git revision; `harness repro` of a GPU failure; `harness bench`; the faults of
docs/faults.md that need a GPU; and `--executor ray` with a head and a worker node (test_ray_on_gpu).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("the GPU user-path suite needs a CUDA device (run it with .ci/gpu-user-paths)",
                allow_module_level=True)

from harness.judge.judgement import judge_cell  # noqa: E402 - after the skip: a CPU machine stops above
from harness.model.records import CellRecord  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
# --resume reuses only the results of a clean commit; where the tree travels without .git the suite's
# script sets HARNESS_COMMIT
ENV = {**os.environ, "HARNESS_COMMIT": os.environ.get("HARNESS_COMMIT", "gpu-user-paths"), "PYTHONUNBUFFERED": "1"}
ENV.pop("PYTEST_XDIST_WORKER", None)


def harness(*args: str, cwd: Path = ROOT, timeout: float = 420, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**ENV, **(env or {})})


def start(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**ENV, **(env or {})}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def said(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"


def records(folder: Path, op: str) -> list[dict]:
    path = folder / f"{op}.jsonl"
    if not path.exists():
        return []
    return [{**d, "shown": judge_cell(CellRecord.from_json(d)).shown}  # judged as a report judges it
            for d in map(json.loads, path.read_text().splitlines()) if "status" in d]


def device_class_dir(report: Path) -> Path:
    dirs = [d for d in report.iterdir() if d.is_dir() and d.name not in ("cpu", "repro")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def wait_for(pred, timeout: float = 300.0, what: str = "") -> None:
    t0 = time.time()
    while not pred():
        assert time.time() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.3)


def group_alive(pgid: int) -> list[int]:
    """Processes still in the run's process group (the workers join groups of their own: see also_workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(d.name))
    return out


def descendants(pid: int) -> set[int]:
    """Every live process whose ancestry reaches pid (read now, while pid lives)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    out: set[int] = set()
    for p in parent:
        q = p
        while q in parent and q > 1:
            q = parent[q]
            if q == pid:
                out.add(p)
                break
    return out


def alive(pids: set[int]) -> set[int]:
    left = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(p)
    return left


# -- runs into one report folder ----------------------------------------------------------------------------


def test_two_runs_of_different_operators_into_one_fresh_report_folder(tmp_path: Path):
    r = tmp_path / "R"
    first = harness("run", "--kernel", "lazy_attention", "--backend", "triton", "--dtype", "bfloat16",
                    "--sizes", "smoke", "--device", "cuda", "--report", str(r), "--no-progress")
    assert first.returncode == 0, said(first)
    second = harness("run", "--kernel", "xent", "--backend", "torch", "--dtype", "float32", "--sizes", "smoke",
                     "--device", "cuda", "--report", str(r), "--no-progress")
    assert second.returncode == 0, said(second)
    assert "Traceback" not in second.stderr
    dc = device_class_dir(r)
    assert records(dc, "lazy_attention") and records(dc, "softmax_xent") and records(dc, "fused_linear_xent")


def test_two_runs_at_once_take_two_folders_and_merge_into_one(tmp_path: Path):
    # one run per GPU (here both on the same one): a second run into a folder in use is refused with the way
    # out; in folders of their own they run at once, and `harness report --add` renders them as one
    one, two, both = tmp_path / "one", tmp_path / "two", tmp_path / "both"
    # every dtype: its compiles keep the first run going well past the second's start (about a minute)
    first = start("run", "--kernel", "lazy_attention", "--backend", "triton", "--sizes", "smoke", "--device", "cuda",
                  "--report", str(one), "--no-progress")
    try:
        wait_for(lambda: any(one.glob("*/.lock")), what="the first run to take its folder")
        refused = harness("run", "--kernel", "xent", "--backend", "torch", "--dtype", "float32", "--sizes", "smoke",
                          "--device", "cuda", "--report", str(one), "--no-progress")
        assert refused.returncode == 2 and "in use by another run" in refused.stderr and "--add" in refused.stderr, \
            said(refused)
        second = harness("run", "--kernel", "xent", "--backend", "torch", "--dtype", "float32", "--sizes", "smoke",
                         "--device", "cuda", "--report", str(two), "--no-progress")
        assert second.returncode == 0, said(second)
        out, _ = first.communicate(timeout=420)
        assert first.returncode == 0, out[-4000:]
    finally:
        first.kill()
    merged = harness("report", "--report", str(both), "--add", str(one), "--add", str(two))
    assert merged.returncode == 0, said(merged)
    dc = device_class_dir(both)
    status = (both / "STATUS.md").read_text()
    for op in ("lazy_attention", "softmax_xent", "fused_linear_xent"):
        assert f"| {op} |" in status, status
    assert (dc / "lazy_attention.md").exists() and (dc / "softmax_xent.md").exists()


def test_the_default_report_folder_leaves_a_clone_clean(tmp_path: Path):
    # a git repository of the user's, the harness run from it with no --report
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    p = harness("run", "--kernel", "mhc", "--backend", "triton", "--dtype", "bfloat16", "--device", "cuda",
                "--no-progress", cwd=tmp_path)
    assert p.returncode == 0, said(p)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True)
    assert status.stdout == "", status.stdout
    again = harness("report", cwd=tmp_path)
    assert again.returncode == 0, said(again)


# -- a user's own operator and backend, outside the repository --------------------------------------------------


def test_a_plugin_operator_and_backend_through_run_check_and_pytest(tmp_path: Path):
    folder = tmp_path / "my_kernels"
    shutil.copytree(ROOT / "tests" / "examples" / "rmsnorm", folder)
    adapter = folder / "adapter.py"
    ran = harness("run", "--plugin", str(adapter), "--kernel", "example_rmsnorm", "--backend", "example-triton",
                  "--sizes", "smoke", "--device", "cuda", "--report", str(tmp_path / "R"), "--no-progress", cwd=folder)
    assert ran.returncode == 0, said(ran)
    wrong = harness("run", "--plugin", str(adapter), "--kernel", "example_rmsnorm", "--backend", "example-triton-wrong",
                    "--sizes", "smoke", "--device", "cuda", "--report", str(tmp_path / "R"), "--no-progress",
                    cwd=folder)
    assert wrong.returncode == 1, said(wrong)
    # check judges the wiring on one tiny case (one feature block: the last-block bug does not show there)
    checked = harness("check", str(adapter), "--device", "cuda", cwd=folder)
    assert checked.returncode == 0 and "2 backend(s) on cuda: 2 ok" in checked.stdout, said(checked)
    py = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--harness-backend",
                         "example-triton", "--harness-plugin", str(adapter), "--harness-kernel", "example_rmsnorm",
                         "--harness-device", "cuda"], cwd=folder, capture_output=True, text=True, timeout=420,
                        env=ENV)
    assert py.returncode == 0 and " passed" in py.stdout, said(py)
    # both commits in the header: the harness's and the plugin's folder's (not a git repository here)
    header = [json.loads(x)["run"] for x in (device_class_dir(tmp_path / "R") / "example_rmsnorm.jsonl").read_text()
              .splitlines() if x.startswith('{"run"')][-1]
    assert header.get("plugins"), header


# -- interrupted runs --------------------------------------------------------------------------------------


SLOW = '''
import os, time
from harness.backends.golden.mhc_pre import backward, forward
from harness import Backend, register_backend

def slow(x, phi, alpha, bias, gamma=None, **kw):
    import torch
    torch.ones(1, device="cuda")
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(600)

register_backend(Backend(operator="mhc_pre", name="slow", impl=slow, backward=backward, devices=("cuda",)))
'''


def _slow_plugin(tmp_path: Path) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    plugin = tmp_path / "slow.py"
    plugin.write_text(textwrap.dedent(SLOW.format(pids=str(pids))))
    return plugin, pids


@pytest.mark.parametrize("how", ["kill-9", "ctrl-c", "sigterm"])
def test_a_stopped_run_leaves_no_worker_and_resume_finishes_it(tmp_path: Path, how: str):
    plugin, pids = _slow_plugin(tmp_path)
    r = tmp_path / "R"
    args = ["run", "--kernel", "mhc", "--backend", "golden,slow", "--dtype", "float32", "--device", "cuda",
            "--plugin", str(plugin), "--report", str(r), "--no-progress", "--workers", "2", "--timeout", "600"]
    p = start(*args)
    wait_for(lambda: pids.exists() and pids.read_text().strip(), what="a slow cell in flight")
    workers = descendants(p.pid)
    assert workers, "the run has no worker processes"
    sig = {"kill-9": signal.SIGKILL, "ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM}[how]
    if how == "ctrl-c":
        os.killpg(p.pid, sig)  # a terminal's Ctrl-C reaches the whole foreground group
    else:
        os.kill(p.pid, sig)
    out, _ = p.communicate(timeout=120)
    wait_for(lambda: not alive(workers), timeout=30, what=f"the workers {sorted(alive(workers))} to go")
    dc = device_class_dir(r)
    md = (dc / "mhc_pre.md").read_text()
    assert "Incomplete" in md, md[:2000]
    if how == "kill-9":
        assert p.returncode == -signal.SIGKILL
    else:
        assert p.returncode == (130 if how == "ctrl-c" else 143), out[-3000:]
        assert "Traceback" not in out and "--resume" in out, out[-3000:]
    # the rest of the run, without the hanging backend
    done = harness(*[a if a != "golden,slow" else "golden" for a in args], "--resume")
    assert done.returncode == 0, said(done)
    assert "already have a result" in done.stdout, said(done)


# -- across runs: compare, repro ------------------------------------------------------------------------------


def test_compare_against_a_git_revision(tmp_path: Path):
    """The user's flow: a run's report committed in their own repository, then a later run compared with it."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=suite@localhost", "-c", "user.name=suite", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    args = ["run", "--kernel", "softmax_xent", "--backend", "cuda", "--dtype", "bfloat16", "--device", "cuda",
            "--report", "reports", "--no-progress"]
    git("init", "-q")
    first = harness(*args, cwd=tmp_path)
    assert first.returncode == 0, said(first)
    git("add", "reports")
    git("commit", "-qm", "evidence")
    p = harness(*args, "--compare", "HEAD", cwd=tmp_path)
    assert p.returncode == 0, said(p)
    assert " 0 unmatched, 0 not comparable; 0 regressed" in p.stdout, said(p)


def test_repro_of_a_gpu_failure(tmp_path: Path):
    r = tmp_path / "R"
    p = harness("run", "--kernel", "mhc", "--backend", "wrong-grads", "--dtype", "float32", "--device", "cuda",
                "--plugin", str(PLUGINS / "mhc_wrong.py"), "--report", str(r), "--no-progress")
    assert p.returncode == 1, said(p)
    bundles = [line.split("harness repro ", 1)[1].strip() for line in p.stdout.splitlines()
               if line.startswith("repro: harness repro ")]
    assert bundles, said(p)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = harness("repro", bundles[0], cwd=elsewhere)
    assert again.returncode == 1 and "FAIL" in again.stdout, said(again)


def test_bench_names_a_figure_for_every_target(tmp_path: Path):
    p = harness("bench", "--kernel", "softmax_xent", "--backend", "torch,cuda", "--device", "cuda",
                "--report", str(tmp_path / "R"), "--reps", "5", "--no-progress", timeout=500)
    assert p.returncode == 0, said(p)
    assert "no figure" not in p.stdout, said(p)


# -- faults that need a GPU (docs/faults.md) ----------------------------------------------------------------------


GREEDY = '''
import torch
from harness.backends.golden.mhc_pre import backward, forward
from harness import Backend, register_backend

def greedy(x, phi, alpha, bias, gamma=None, **kw):
    torch.empty(1 << 40, dtype=torch.uint8, device=x.device)  # a terabyte: more than any card
    return forward(x, phi, alpha, bias, gamma, **kw)

register_backend(Backend(operator="mhc_pre", name="greedy", impl=greedy, backward=backward, devices=("cuda",)))
'''


def test_out_of_memory_on_a_shared_gpu_and_an_illegal_access_cost_their_own_cells(tmp_path: Path):
    plugin = tmp_path / "greedy.py"
    plugin.write_text(GREEDY)
    r = tmp_path / "R"
    # two workers share the GPU; the greedy cells run out of memory, are retried alone, and stay ERROR; the
    # illegal access kills its worker's CUDA context: CRASH, and the golden cells after it still pass
    p = harness("run", "--kernel", "mhc", "--backend", "golden,greedy,illegal-access", "--dtype", "float32",
                "--device", "cuda", "--workers", "2", "--plugin", str(plugin), "--plugin",
                str(PLUGINS / "gpu_faults.py"), "--report", str(r), "--no-progress")
    assert p.returncode == 1, said(p)
    cells = records(device_class_dir(r), "mhc_pre")
    by: dict[str, set[str]] = {}
    for c in cells:
        by.setdefault(c["backend"], set()).add(c["shown"])
    assert by["golden"] == {"PASS"}, by
    assert by["greedy"] == {"ERROR"}, by
    assert by["illegal-access"] == {"CRASH"}, by
    assert all("out of memory" in c["error"] for c in cells if c["backend"] == "greedy")


# -- Ray: a head and a worker node on this GPU host -----------------------------------------------------------------


def _ray(*args: str, env: dict) -> subprocess.CompletedProcess:
    code = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, env=env)


RAY_SLOW = '''
import os, time
from harness.backends.golden.mhc_pre import backward, forward
from harness import Backend, register_backend

def slow(x, phi, alpha, bias, gamma=None, **kw):
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}} {{os.getppid()}}\\n")
    time.sleep(120)
    return forward(x, phi, alpha, bias, gamma, **kw)

register_backend(Backend(operator="mhc_pre", name="slow", impl=slow, backward=backward, devices=("cuda",)))
'''


def test_ray_on_gpu_same_verdicts_as_local_with_a_worker_killed(tmp_path: Path):
    pytest.importorskip("ray", reason="Ray is not installed here (.ci/gpu-user-paths brings it)")
    gpus = torch.cuda.device_count()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    env = {**ENV, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(32).hex()}
    # one GPU per node where the host has two; on a host of one GPU both nodes name it (Ray sees two GPUs
    # that are one card: what a shared card looks like to a cluster)
    per_node = "1"
    head = _ray("start", "--head", "--node-ip-address=127.0.0.1", "--port=6391", f"--num-gpus={per_node}",
                "--num-cpus=4", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp}", env=env)
    assert head.returncode == 0, head.stdout + head.stderr
    try:
        node_env = {**env, "CUDA_VISIBLE_DEVICES": "1" if gpus > 1 else "0"}
        node = _ray("start", "--address=127.0.0.1:6391", "--node-ip-address=127.0.0.1", f"--num-gpus={per_node}",
                    "--num-cpus=4", f"--temp-dir={tmp}", env=node_env)
        assert node.returncode == 0, node.stdout + node.stderr
        r = tmp_path / "R"
        common = ["run", "--kernel", "mhc,xent", "--backend", "golden,triton,torch", "--dtype", "float32",
                  "--sizes", "smoke", "--device", "cuda", "--report", str(r), "--no-progress"]
        local = harness(*common)  # also records the peaks the Ray run's GPU fractions come from
        assert local.returncode == 0, said(local)
        rdc = device_class_dir(r)
        verdicts_local = {_key(c): c["shown"] for op in ("mhc_pre", "softmax_xent", "fused_linear_xent")
                          for c in records(rdc, op)}
        rr = tmp_path / "RR"
        for d in (r / rdc.name,):  # the Ray run starts from the local run's records (durations, peaks)
            shutil.copytree(d, rr / rdc.name)
        on_ray = harness(*[a if a != str(r) else str(rr) for a in common], "--executor", "ray", "--ray-address",
                         "127.0.0.1:6391", "--workers", "2", env=env)
        assert on_ray.returncode == 0, said(on_ray)
        ray_cells = [c for op in ("mhc_pre", "softmax_xent", "fused_linear_xent") for c in records(rr / rdc.name, op)
                     if (c.get("ran_on") or {}).get("executor") == "ray"]
        verdicts_ray = {_key(c): c["shown"] for c in ray_cells}
        assert verdicts_ray == {k: v for k, v in verdicts_local.items() if k in verdicts_ray}, "verdicts differ"
        assert set(verdicts_ray) == set(verdicts_local)
        nodes = {c["ran_on"]["node_id"] for c in ray_cells if c["status"] != "SKIP"}
        assert len(nodes) == 2, nodes
        # a Ray worker killed mid-run: its cell is a CRASH, the rest of its group runs again
        pids = tmp_path / "pids"
        plugin = tmp_path / "ray_slow.py"
        plugin.write_text(textwrap.dedent(RAY_SLOW.format(pids=str(pids))))
        p = start("run", "--kernel", "mhc", "--case", "tiny", "--backend", "slow,golden", "--dtype", "float32",
                  "--device", "cuda",
                  "--plugin", str(plugin), "--report", str(tmp_path / "RK"), "--no-progress", "--executor", "ray",
                  "--ray-address", "127.0.0.1:6391", "--timeout", "300", env=env)  # the cluster's token
        wait_for(lambda: (pids.exists() and pids.read_text().strip()) or p.poll() is not None,
                 what="the slow cell on a Ray worker")
        assert p.poll() is None, p.communicate()[0][-3000:]
        _pid, ray_worker = map(int, pids.read_text().split()[:2])
        os.kill(ray_worker, signal.SIGKILL)
        out, _ = p.communicate(timeout=400)
        assert p.returncode == 1, out[-3000:]
        killed = [c for c in records(device_class_dir(tmp_path / "RK"), "mhc_pre") if c["backend"] == "slow"]
        assert any(c["status"] == "CRASH" and "Ray worker died" in c["error"] for c in killed), killed
        golden = [c for c in records(device_class_dir(tmp_path / "RK"), "mhc_pre") if c["backend"] == "golden"]
        assert golden and all(c["shown"] == "PASS" for c in golden)
    finally:
        _ray("stop", "--force", env=env)


def _key(c: dict) -> tuple:
    return (c["operator"], c["backend"], c["dtype"], c["case"]["name"], json.dumps(c["case"].get("params", {}),
                                                                                 sort_keys=True))
