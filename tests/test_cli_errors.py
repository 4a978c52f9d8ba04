"""The command line's front door (issue #41): bad arguments and files are one line and exit 2 for every
subcommand, a bug of the harness is one line and exit 70 with its trace in a file, --hypothesis on an
operator without a strategy is refused, `harness check` waits 30 s by default, and a run without --report
writes under .harness/ (which ignores itself), leaving any checkout clean."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.front import check, cli
from harness.front.parser import parser
from harness.front.run_command import recorded_costs
from harness.model import registry
from harness.store import reports

ROOT = Path(__file__).resolve().parent.parent
RMSNORM = ROOT / "tests" / "examples" / "rmsnorm" / "adapter.py"
# a run as small as a run gets: were a bad argument let through, the command stays cheap
TINY = ["--kernel", "mhc", "--case", "tiny", "--backend", "golden", "--dtype", "float32", "--device", "cpu",
        "--no-progress"]


def harness(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_COMMIT"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# -- a run without --report: .harness/reports, and the checkout stays clean ----------------------------------

@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A user's git repository, and the README's first command run in it (golden float32 only) without --report."""
    repo = tmp_path_factory.mktemp("clone")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    ran = harness("run", "--kernel", "mhc", "--sizes", "smoke", "--device", "cpu", "--backend", "golden", "--dtype",
                  "float32", "--no-progress", cwd=repo)
    return repo, ran


def test_a_run_without_report_writes_under_dot_harness_and_leaves_git_status_clean(fresh_clone):
    repo, ran = fresh_clone
    assert ran.returncode == 0, ran.stdout + ran.stderr
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                            capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout
    assert (repo / ".harness" / "reports" / "cpu" / "mhc_pre.md").is_file()
    assert (repo / ".harness" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert not (repo / "reports").exists()
    # `harness report` with no argument re-renders that folder and its STATUS.md
    status_md = repo / ".harness" / "reports" / "STATUS.md"
    status_md.unlink(missing_ok=True)
    again = harness("report", cwd=repo)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "| mhc_pre | golden |" in status_md.read_text()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""


def test_the_default_report_folder_is_one_constant_used_by_the_parser_and_the_request():
    from harness.run.session import RunRequest
    from harness.store.reports import DEFAULT_REPORT_ROOT

    assert DEFAULT_REPORT_ROOT == ".harness/reports"
    p = parser()
    for argv in (["run", "--kernel", "mhc"], ["mutants"], ["bench"], ["report"]):
        assert p.parse_args(argv).report == DEFAULT_REPORT_ROOT, argv
    assert RunRequest(["mhc"]).report == DEFAULT_REPORT_ROOT


# -- the GPU run's recorded durations (the shadowed device_class) ---------------------------------------------

def test_recorded_on_a_gpu_class_without_records_takes_another_gpu_class_s(tmp_path: Path):
    """A first run on an h200 with cpu/ and h100/ records beside it: the h100 records rank its groups (this
    crashed with "'str' object is not callable" on every GPU run into such a folder)."""
    # the committed CPU sweep's records (kept packed: harness/store/reports.py)
    lines = gzip.decompress((ROOT / "reports" / "cpu" / "mhc_pre.jsonl.gz").read_bytes()).decode().splitlines()
    for d in ("cpu", "h100"):
        (tmp_path / d).mkdir()
    (tmp_path / "cpu" / "mhc_pre.jsonl").write_text("\n".join(lines) + "\n")
    gpu = []
    for line in lines:
        rec = json.loads(line)
        if isinstance(rec.get("duration_s"), (int, float)):
            rec["duration_s"] += 1000.0  # told apart from the cpu records
            rec["peak_mem_mb"] = 123.0
        gpu.append(json.dumps(rec))
    (tmp_path / "h100" / "mhc_pre.jsonl").write_text("\n".join(gpu) + "\n")
    tasks = [SimpleNamespace(operator="mhc_pre")]

    got = recorded_costs(str(tmp_path), "cuda", "h200", tasks)

    h100 = reports.recorded(tmp_path / "h100", ["mhc_pre"], ("duration_s", "peak_mem_mb"))
    assert got["durations"] and got["durations"] == h100["duration_s"]
    assert all(v >= 1000.0 for v in got["durations"].values())
    assert got["peaks"] and set(got["peaks"].values()) == {123.0}
    # this class's own records, where it has them, come first
    assert recorded_costs(str(tmp_path), "cuda", "h100", tasks)["durations"] == h100["duration_s"]


# -- bad arguments and files: one line naming the argument, exit 2 -------------------------------------------

@pytest.fixture
def bad_files(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """Files that are not what an argument expects; the current folder an empty one."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "notes.txt").write_text("some text, not a bundle\n")
    (tmp_path / "other.json").write_text('{"name": "not a bundle"}\n')
    (tmp_path / "list.json").write_text("[1, 2, 3]\n")
    (tmp_path / "empty").mkdir()
    bundle = {"operator": "no_such_op", "backend": "golden", "dtype": "float32", "seed": 0, "inputs_sha256": "0",
              "case": {"name": "x", "params": {}}, "plugins": []}
    (tmp_path / "unknown-op.json").write_text(json.dumps(bundle))
    (tmp_path / "bad-case.json").write_text(json.dumps({**bundle, "operator": "mhc_pre", "case": "oops"}))
    (tmp_path / "bad-dtype.json").write_text(json.dumps({**bundle, "operator": "mhc_pre", "dtype": "fp8"}))
    (tmp_path / "gone-plugin.json").write_text(json.dumps({**bundle, "operator": "mhc_pre",
                                                           "plugins": [str(tmp_path / "gone.py")]}))
    (tmp_path / "empty_adapter.py").write_text("x = 1\n")
    return {"file": str(tmp_path / "a-file"), "missing": str(tmp_path / "missing"), "text": str(tmp_path / "notes.txt"),
            "json": str(tmp_path / "other.json"), "list": str(tmp_path / "list.json"), "dir": str(tmp_path / "empty"),
            "unknown_op": str(tmp_path / "unknown-op.json"), "bad_case": str(tmp_path / "bad-case.json"),
            "bad_dtype": str(tmp_path / "bad-dtype.json"), "gone_plugin": str(tmp_path / "gone-plugin.json"),
            "no_backend": str(tmp_path / "empty_adapter.py"), "report": str(tmp_path / "r")}


BAD = [
    # run
    (["run", *TINY, "--timeout", "-1"], "--timeout"),
    (["run", *TINY, "--timeout", "0"], "--timeout"),
    (["run", *TINY, "--timeout", "soon"], "--timeout"),
    (["run", *TINY, "--workers", "0"], "--workers"),
    (["run", *TINY, "--repeats", "0"], "--repeats"),
    (["run", *TINY, "--hypothesis", "-1"], "--hypothesis"),
    (["run", *TINY, "--device", "gpu"], "--device"),
    (["run", *TINY, "--kernel", "nope"], "--kernel"),
    (["run", *TINY, "--kernel", ""], "--kernel"),
    (["run", *TINY, "--backend", "nope"], "--backend"),
    (["run", *TINY, "--dtype", "fp8"], "dtype"),
    (["run", *TINY, "--sizes", "huge"], "--sizes"),
    (["run", *TINY, "--report", "{file}"], "--report"),
    (["run", *TINY, "--report", "{file}/sub"], "--report"),
    (["run", *TINY, "--compare-fail", "0.5"], "--compare-fail"),
    (["run", *TINY, "--compare-require", "1.5"], "--compare-require"),
    (["run", *TINY, "--compare", "{missing}"], "--compare"),
    (["run", *TINY, "--plugin", "{missing}.py"], "--plugin"),
    (["run", *TINY, "--plugin", "{dir}"], "--plugin"),
    (["run", *TINY, "--case", "no-such-case"], "--case 'no-such-case'"),
    (["run"], "--kernel"),
    # list
    (["list", "--device", "gpu"], "--device"),
    (["list", "--plugin", "{missing}.py"], "--plugin"),
    (["list", "--plugin", "{dir}"], "--plugin"),
    # report
    (["report", "--report", "{missing}"], "--report"),
    (["report", "--report", "{file}"], "--report"),
    (["report", "--report", "{dir}"], "--report"),
    (["report"], "--report"),  # nothing written yet in this folder
    (["report", "--report", "{dir}", "--plugin", "{missing}.py"], "--plugin"),
    # mutants
    (["mutants", "--kernel", "nope", "--device", "cpu"], "--kernel"),
    (["mutants", "--timeout", "0", "--device", "cpu"], "--timeout"),
    (["mutants", "--device", "gpu"], "--device"),
    (["mutants", "--report", "{file}", "--device", "cpu"], "--report"),
    (["mutants", "--plugin", "{missing}.py", "--device", "cpu"], "--plugin"),
    (["mutants", "--only", "no-such-mutant", "--kernel", "mhc", "--device", "cpu"], "no-such-mutant"),
    # bench
    (["bench", "--kernel", "nope", "--device", "cpu"], "--kernel"),
    (["bench", "--kernel", "mhc", "--backend", "nope", "--device", "cpu"], "--backend"),
    (["bench", "--kernel", "mhc", "--dtype", "fp8", "--device", "cpu"], "--dtype"),
    (["bench", "--kernel", "mhc", "--reps", "-1", "--device", "cpu"], "--reps"),
    (["bench", "--kernel", "mhc", "--device", "gpu"], "--device"),
    (["bench", "--kernel", "mhc", "--report", "{file}", "--device", "cpu"], "--report"),
    (["bench", "--kernel", "mhc", "--plugin", "{missing}.py", "--device", "cpu"], "--plugin"),
    # repro
    (["repro", "{missing}"], "BUNDLE"),
    (["repro", "{text}"], "BUNDLE"),
    (["repro", "{json}"], "BUNDLE"),
    (["repro", "{list}"], "BUNDLE"),
    (["repro", "{dir}"], "BUNDLE"),
    (["repro", "{unknown_op}"], "BUNDLE"),
    (["repro", "{bad_case}"], "BUNDLE"),
    (["repro", "{bad_dtype}"], "BUNDLE"),
    (["repro", "{gone_plugin}"], "BUNDLE"),
    (["repro", "{unknown_op}", "--timeout", "0"], "--timeout"),
    (["repro", "{unknown_op}", "--device", "gpu"], "--device"),
    (["repro", "{unknown_op}", "--plugin", "{missing}.py"], "--plugin"),
    (["repro"], "BUNDLE"),
    # check
    (["check", "{missing}.py", "--device", "cpu"], "PLUGIN"),
    (["check", "{dir}", "--device", "cpu"], "PLUGIN"),
    (["check", "{no_backend}", "--device", "cpu"], "registers no backend"),
    (["check", "{no_backend}", "--timeout", "-1"], "--timeout"),
    (["check", "{no_backend}", "--device", "gpu"], "--device"),
    (["check"], "PLUGIN"),
    # the command itself
    ([], "cmd"),
    (["frobnicate"], "frobnicate"),
]


def _main(argv: list[str], capsys) -> tuple[int, str]:
    """cli.main in this process: its exit status (argparse's exits included) and its stderr."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv, names", BAD, ids=[" ".join(a).replace("/", "_") or "(none)" for a, _ in BAD])
def test_a_bad_argument_or_file_is_one_line_naming_it_and_exit_2(argv: list[str], names: str, bad_files, capsys):
    code, err = _main([a.format(**bad_files) for a in argv], capsys)
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and names in lines[0], err
    assert lines[0].startswith("harness"), err


@pytest.mark.parametrize("argv", [["repro", "{text}"], ["run", *TINY, "--timeout", "-1"], ["report", "--report",
                                                                                           "{missing}"]])
def test_bad_input_from_a_real_shell_is_one_line_on_stderr(argv: list[str], bad_files):
    r = harness(*[a.format(**bad_files) for a in argv], cwd=Path.cwd(), timeout=300)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


# -- a bug of the harness: exit 70, one line, the trace in .harness/ -----------------------------------------

def _boom():
    raise RuntimeError("registry exploded\nsecond line of the message")


def test_an_unexpected_exception_is_one_line_exit_70_and_the_trace_in_a_file(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "operators", _boom)
    code, err = _main(["list", "--device", "cpu"], capsys)
    assert code == 70, err
    (line,) = err.strip().splitlines()
    m = re.fullmatch(r"harness list: internal error: RuntimeError: registry exploded second line of the message "
                     r"\(full trace in (?P<path>.+)\)", line)
    assert m, line
    path = Path(m["path"])
    assert path.parent == tmp_path / ".harness" and re.fullmatch(r"internal-error-[\d-]+\.txt", path.name)
    trace = path.read_text()
    assert "Traceback (most recent call last)" in trace and "cmd_list" in trace and "_boom" in trace
    assert "command: harness list --device cpu" in trace
    assert "RuntimeError: registry exploded" in trace
    assert (tmp_path / ".harness" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_the_trace_goes_to_the_temporary_folder_when_dot_harness_cannot_be_written(tmp_path: Path, monkeypatch,
                                                                                     capsys):
    import tempfile

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".harness").write_text("a file where the folder would be\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(registry, "operators", _boom)
    code, err = _main(["list", "--device", "cpu"], capsys)
    assert code == 70 and len(err.strip().splitlines()) == 1, err
    (written,) = (tmp_path / "tmp").glob("internal-error-*.txt")
    assert f"(full trace in {written})" in err and "_boom" in written.read_text()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_are_not_internal_errors(exc, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def stop():
        raise exc()

    monkeypatch.setattr(registry, "operators", stop)
    with pytest.raises(exc):
        cli.main(["list", "--device", "cpu"])
    assert not (tmp_path / ".harness").exists()


# -- --hypothesis on an operator without a strategy ----------------------------------------------------------

def test_hypothesis_on_an_operator_without_a_strategy_is_a_usage_error_naming_it(tmp_path: Path):
    r = harness("run", "--plugin", str(RMSNORM), "--kernel", "example_rmsnorm", "--backend", "example-triton", "--case",
                "rows3-features40", "--dtype", "float32", "--device", "cpu", "--hypothesis", "3", "--report",
                str(tmp_path / "r"), "--no-progress", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "--hypothesis" in line and "example_rmsnorm" in line
    # and the operators that have one
    with_one = line.split("operators with one:")[1]
    assert "mhc_pre" in with_one and "example_rmsnorm" not in with_one
    assert not (tmp_path / "r").exists()  # refused before anything ran


# -- harness check's default timeout -------------------------------------------------------------------------

def test_check_waits_30_s_by_default_and_its_timeout_says_how_to_wait_longer():
    assert parser().parse_args(["check", "my_adapter.py"]).timeout == 30.0
    from harness.run.plan import plan

    registry.discover()
    task = plan(["softmax_xent"], "smoke", ["torch"], ["float32"], "cpu", repeats=1).tasks[0]
    cell = task.failed("TIMEOUT", "no result after 30 s; worker killed")
    s = check.Subject(registry.get_operator("softmax_xent"), registry.get_backend("softmax_xent", "torch"),
                      ("my_adapter.py",), False, 30.0)
    (f,) = check.explain(cell, s)
    assert "no result within 30 s" in f.text and "`harness check my_adapter.py --timeout S`" in f.text


def test_output_into_a_pipe_closed_early_ends_quietly_not_as_an_internal_error():
    # `harness list | head -1`: the reader leaves (here before the first line: a reader that reads one line
    # races the harness's last write into the pipe's buffer); the harness ends as SIGPIPE ends other
    # commands (141), with nothing on stderr, where it printed "internal error: BrokenPipeError"
    p = subprocess.Popen([sys.executable, "-m", "harness", "list"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == cli.EX_SIGPIPE, err
    assert err == "", err
