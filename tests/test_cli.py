"""The `harness` command end to end on the CPU: exit codes, reports, plugins, isolation, contracts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_env import inner_pytest_env

ROOT = Path(__file__).resolve().parent.parent


def harness(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def cells(report: Path, op: str) -> list[dict]:
    return json.loads((report / "cpu" / f"{op}.json").read_text())["cells"]


def verdicts(cell: dict) -> dict[str, str]:
    return {r["name"]: r["verdict"] for r in cell["components"]}


def test_list_names_operators_and_why_backends_skip():
    r = harness("list", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    for op in ("mhc_pre", "lazy_attention", "softmax_xent", "fused_linear_xent"):
        assert op in r.stdout
    assert "golden" in r.stdout


def test_unknown_names_are_usage_errors_listing_valid_ones():
    r = harness("run", "--kernel", "nope", "--device", "cpu")
    assert r.returncode == 2 and "mhc_pre" in r.stderr and "families" in r.stderr
    r = harness("run", "--kernel", "mhc", "--backend", "nope", "--device", "cpu")
    assert r.returncode == 2 and "golden" in r.stderr
    r = harness("run", "--kernel", "mhc", "--dtype", "fp8", "--device", "cpu")
    assert r.returncode == 2 and "bfloat16" in r.stderr


def test_wrong_adapter_fails_exactly_its_components(tmp_path: Path):
    r = harness(
        "run",
        "--kernel",
        "mhc",
        "--sizes",
        "smoke",
        "--backend",
        "wrong-grads,wrong-shape",
        "--plugin",
        "tests/plugins/mhc_wrong.py",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--report",
        str(tmp_path),
        "--no-progress",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    all_cells = cells(tmp_path, "mhc_pre")
    wrong = [c for c in all_cells if c["backend"] == "wrong-grads"]
    assert wrong
    for c in wrong:
        v = verdicts(c)
        failing = {k for k, s in v.items() if s != "PASS"}
        rows = {r["name"]: r for r in c["components"]}
        if "dgamma" in rows:
            assert failing == {"dgamma", "dbias.pre"}, (c["case"]["name"], v)
            assert "all zeros" in rows["dgamma"]["reason"]
        else:  # gamma absent in this case
            assert failing == {"dbias.pre"}, (c["case"]["name"], v)
        assert "sign flipped" in rows["dbias.pre"]["hint"]
        assert rows["dbias.pre"]["slices"][0]["axis"] == "row"
    shape = [c for c in all_cells if c["backend"] == "wrong-shape"]
    for c in shape:
        v = verdicts(c)
        if "dgamma" not in v:
            continue
        assert v["dgamma"] == "SHAPE" and c["shown"] == "SHAPE"
        assert all(s == "PASS" for k, s in v.items() if k != "dgamma")
    md = (tmp_path / "cpu" / "mhc_pre.md").read_text()
    assert "dgamma" in md and "SHAPE" in md and "expected [" in md


def test_misbehaving_backends_become_cells_and_the_sweep_completes(tmp_path: Path):
    names = "golden,raises,nans,writes-input,sleeps,dies,segfaults,unwritten,overruns,nondeterministic"
    r = harness(
        "run",
        "--kernel",
        "mhc",
        "--sizes",
        "smoke",
        "--case",
        "tiny",
        "--backend",
        names,
        "--plugin",
        "tests/plugins/misbehaving.py",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--timeout",
        "20",
        "--report",
        str(tmp_path),
        "--no-progress",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    by = {c["backend"]: c for c in cells(tmp_path, "mhc_pre")}
    assert set(by) == set(names.split(","))
    assert by["golden"]["shown"] == "PASS"
    assert by["raises"]["status"] == "ERROR" and "invalid configuration" in by["raises"]["error"]
    assert by["sleeps"]["status"] == "TIMEOUT"
    assert by["dies"]["status"] == "CRASH" and "(exit code 7)" in by["dies"]["error"]
    assert by["segfaults"]["status"] == "CRASH" and "killed by signal SIGSEGV" in by["segfaults"]["error"]
    assert by["nans"]["shown"] == "FAIL" and verdicts(by["nans"])["dphi.pre"] == "FAIL"

    def contract(b: str, name: str) -> dict:
        return next(k for k in by[b]["contracts"] if k["name"] == name)

    assert (
        not contract("writes-input", "input-unchanged")["ok"]
        and "x" in contract("writes-input", "input-unchanged")["detail"]
    )
    unwritten = {r["name"]: r for r in by["unwritten"]["components"]}
    assert "non-finite" in unwritten["dphi.res"]["reason"]
    # the NaN is the harness's poison in a buffer the backend allocated through it: named so
    assert "never written" in unwritten["dphi.res"]["hint"]
    assert not contract("overruns", "guard-bands")["ok"]
    assert not contract("nondeterministic", "determinism")["ok"]
    assert contract("golden", "determinism")["ok"] and contract("golden", "guard-bands")["ok"]


@pytest.mark.slow
def test_smoke_all_operators_writes_reports(tmp_path: Path):
    r = harness(
        "run",
        "--kernel",
        "all",
        "--sizes",
        "smoke",
        "--device",
        "cpu",
        "--report",
        str(tmp_path),
        "--no-progress",
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for op in ("mhc_pre", "lazy_attention", "softmax_xent", "fused_linear_xent"):
        assert (tmp_path / "cpu" / f"{op}.md").exists() and (tmp_path / "cpu" / f"{op}.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="an illegal memory access needs a CUDA device")
def test_illegal_memory_access_is_a_crash_cell_and_the_sweep_goes_on(tmp_path: Path):
    r = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "illegal-access,golden",
                "--plugin", "tests/plugins/gpu_faults.py", "--device", "cuda", "--dtype", "float32",
                "--report", str(tmp_path / "r"), "--no-progress")
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(next((tmp_path / "r").glob("*/mhc_pre.json")).read_text())
    by = {c["backend"]: c for c in data["cells"]}
    assert by["illegal-access"]["status"] == "CRASH", by["illegal-access"]
    assert by["golden"]["shown"] == "PASS"


def test_out_of_memory_cells_are_recognised_for_a_lone_rerun():
    # a cell that ran out of memory while workers shared a GPU is run again alone (harness/run/memory.py)
    import torch

    from harness.measure.cell import safe_run_cell
    from harness.measure.failures import is_oom
    from harness.model.registry import Backend, get_operator

    def oom(**kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")

    op = get_operator("softmax_xent")
    b = Backend(operator="softmax_xent", name="oom", impl=oom)
    cell = safe_run_cell(op, b, op.cases("smoke", "cpu")[0], "float32", "cpu")
    assert cell.status.value == "ERROR" and is_oom(cell)
    cell.error = "RuntimeError: boom"
    assert not is_oom(cell)


def test_pytest_benchmark_items_record_history(tmp_path: Path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--harness-bench", "--kernel", "mhc",
         "--backend", "golden", "--harness-device", "cpu", f"--benchmark-json={out}", "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=600, env=inner_pytest_env(),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    [b] = data["benchmarks"]
    assert b["extra_info"]["backend"] == "golden" and b["extra_info"]["timed"] == "forward+backward"
    assert b["stats"]["rounds"] >= 1 and b["stats"]["median"] > 0


def test_bench_on_cpu_uses_smoke_shapes_and_writes_the_report(tmp_path: Path):
    r = harness("bench", "--kernel", "mhc", "--backend", "golden,triton", "--device", "cpu", "--report",
                str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "cpu" / "bench-mhc_pre.json").read_text())
    rows = {row["backend"]: row for row in data["rows"]}
    # the Triton backend runs interpreted in-process: its row has times, not an error
    assert rows["golden"]["fwd_bwd_ms"] > 0 and rows["triton"]["fwd_bwd_ms"] > 0, rows
    assert rows["triton"]["speedup_fwd_bwd"] > 0


def test_resume_runs_only_the_cells_without_a_result_from_this_code(tmp_path):
    import os

    rep = tmp_path / "rep"
    # two of the smoke's cases (tiny-n2, n2-D24-T17~mixed): enough for one with a result and one without
    args = ("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "n2", "--backend", "golden", "--dtype", "float32",
            "--device", "cpu", "--report", str(rep), "--no-progress")
    env = {**os.environ, "HARNESS_COMMIT": "abc1234"}

    def run(*extra: str, commit: str = "abc1234") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", *args, *extra], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**env, "HARNESS_COMMIT": commit})

    first = run()
    assert first.returncode == 0, first.stderr
    jl = rep / "cpu" / "mhc_pre.jsonl"
    lines = jl.read_text().splitlines()
    n = len(lines) - 1
    jl.write_text("\n".join(lines[:-1]) + "\n")  # the run was cut before its last cell
    md = (rep / "cpu" / "mhc_pre.md")
    subprocess.run([sys.executable, "-m", "harness", "report", "--report", str(rep)], cwd=ROOT, env=env,
                   capture_output=True, timeout=300, check=True)
    assert f"1 of {n} planned cells of the latest run have no result" in md.read_text()
    again = run("--resume")
    assert again.returncode == 0, again.stderr
    assert f"--resume: {n - 1} of {n} cells already have a result from this code (commit abc1234); running 1" \
        in again.stdout
    assert "planned cells" not in md.read_text()  # the resumed run counts the results it reused
    assert "nothing to run" in run("--resume").stdout
    # another commit of the same code (docs, reports or tests changed) reuses every result; other code none
    assert "nothing to run" in run("--resume", commit="def5678").stdout
    jl.write_text(re.sub(r'"code": ?"', lambda m: m.group(0) + "0", jl.read_text()))  # as if other code ran them
    other = run("--resume", commit="fed9876")
    assert f"0 of {n} cells already have a result" in other.stdout
    dirty = run("--resume", commit="abc1234+dirty")
    assert dirty.returncode == 2 and "clean" in dirty.stderr


# -- nothing silently green (issue #25, first part) ------------------------------------------------------


def test_an_invalid_device_is_a_usage_error():
    r = harness("run", "--kernel", "mhc", "--device", "gpu")
    assert r.returncode == 2 and "--device 'gpu': expected cpu, cuda" in r.stderr


def test_cuda_without_a_gpu_is_refused_not_a_green_run_of_skips():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--device", "cuda")
    assert r.returncode == 3 and "no CUDA device on this machine" in r.stderr and "--device cpu" in r.stderr


def test_a_misspelled_backend_among_several_operators_is_a_usage_error():
    r = harness("run", "--kernel", "xent", "--backend", "torch,trtion", "--device", "cpu")
    assert r.returncode == 2 and "--backend trtion" in r.stderr
    assert "softmax_xent: cuda, cuda-inplace, gluon, gluon-inplace, torch" in r.stderr


def test_a_named_backend_that_ran_no_cell_exits_3_with_the_reasons(tmp_path: Path):
    # tilelang runs on CUDA only: named on a CPU machine, every one of its cells is a SKIP
    r = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "golden,tilelang",
                "--device", "cpu", "--dtype", "float32", "--report", str(tmp_path), "--no-progress")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "tested nothing here: backend tilelang ran no cell: runs on cuda only" in r.stderr


def test_a_dtype_that_every_named_backend_skips_is_a_run_that_tested_nothing(tmp_path: Path):
    # the interpreter's bf16 dot is wrong, so Triton's bf16 cells are judged on the GPU only
    r = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--case", "tiny", "--backend", "triton",
                "--device", "cpu", "--dtype", "bfloat16", "--report", str(tmp_path), "--no-progress")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "tested nothing here: no cell ran: every cell was skipped" in r.stderr
    assert "skipped 1 cell(s) (triton): bf16 tl.dot is wrong in the Triton interpreter" in r.stdout


def test_a_pytest_session_whose_named_backend_ran_no_item_fails_with_the_reasons():
    base = [sys.executable, "-m", "pytest", "-q", "--kernel", "mhc", "--sizes", "smoke",
            "--harness-device", "cpu", "-p", "no:cacheprovider"]
    r = subprocess.run(base + ["--backend", "tilelang"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=inner_pytest_env())
    assert r.returncode == 3, r.stdout[-3000:]
    assert "backend tilelang ran no item: tilelang: runs on cuda only" in r.stdout
    r = subprocess.run(base + ["--backend", "golden", "--harness-dtype", "float32"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=inner_pytest_env())
    assert r.returncode == 0, r.stdout[-3000:]


def test_a_backend_that_writes_its_input_by_design_passes_and_is_benched(tmp_path: Path):
    # its cells draw fresh copies (the determinism re-run computes on logits, not on the first run's dlogits)
    plugin = str(ROOT / "tests" / "plugins" / "inplace_xent.py")
    r = harness("run", "--kernel", "softmax_xent", "--sizes", "smoke", "--backend", "inplace-xent", "--plugin", plugin,
                "--case", "N3-V2", "--dtype", "float32", "--device", "cpu", "--report", str(tmp_path), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    cells = [json.loads(x) for x in (tmp_path / "cpu" / "softmax_xent.jsonl").read_text().splitlines()
             if '"run"' not in x[:8]]
    assert cells
    for cell in cells:
        contracts = {c["name"]: c for c in cell["contracts"]}
        assert not contracts["input-unchanged"]["ok"] and contracts["determinism"]["ok"], contracts
    r = harness("bench", "--kernel", "softmax_xent", "--backend", "inplace-xent", "--plugin", plugin, "--device",
                "cpu", "--report", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    [row] = json.loads((tmp_path / "cpu" / "bench-softmax_xent.json").read_text())["rows"]
    # its backward refuses a second run of one forward: each timed backward follows a forward of its own
    assert row["fwd_bwd_ms"] > 0 and row["bwd_ms"] > 0 and len(row["bwd_ms_spread"]) == 2
    assert len(row["fwd_bwd_ms_spread"]) == 2 and "writes its inputs by design" in row["input_note"]
    md = (tmp_path / "cpu" / "bench-softmax_xent.md").read_text()
    assert "writes its inputs by design" in md


def test_the_code_digest_follows_the_code_and_not_the_docs(tmp_path, monkeypatch):
    # what --resume compares across commits (harness/store/provenance.py): a kernel's source changes it, a doc,
    # report or test does not (a made-up tree: its paths are joined from parts)
    from harness.store import provenance

    kernel, code = Path("backends", "x", "kernel.cu"), Path("harness", "a.py")
    others = [Path("docs", "x.md"), Path("tests", "t.py"), Path("reports", "cpu", "x.md")]
    for f in (kernel, code, *others):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f.name)
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)

    def digest() -> str:
        provenance.code_digest.cache_clear()
        return provenance.code_digest()

    base = digest()
    for f in others:
        (tmp_path / f).write_text("changed")
    assert digest() == base
    (tmp_path / kernel).write_text("changed")
    assert digest() != base
    provenance.code_digest.cache_clear()
