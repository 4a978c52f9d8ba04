"""The pytest road as a user's CI takes it: options, collection, failure output, exit codes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from subprocess_env import inner_pytest_env

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"

_CONFTEST_WITH_BACKEND = '''
import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", default="numpy", help="this project's own --backend")


@pytest.fixture
def backend(request):
    return request.config.getoption("--backend")
'''

_UNRELATED_TESTS = '''
from hypothesis import settings


def test_its_own_backend_option(backend):
    assert backend == "jax"


def test_hypothesis_settings_are_the_defaults():
    # Hypothesis's own defaults where this runs (it loads its "ci" profile by itself under CI=true)
    import os

    s = settings()
    assert f"{s.max_examples} {s.derandomize}" == os.environ["HYPOTHESIS_WITHOUT_PYTEST"]


def test_the_installed_harness_plugin_did_not_import_torch():
    import sys

    assert "torch" not in sys.modules
'''


def hypothesis_defaults(python: str = sys.executable) -> str:
    """max_examples and derandomize as Hypothesis sets them in a plain process (no pytest, no plugin)."""
    code = "from hypothesis import settings; s = settings(); print(s.max_examples, s.derandomize)"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                          env=inner_pytest_env()).stdout.strip()


def pytest_in(folder: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = inner_pytest_env(HYPOTHESIS_WITHOUT_PYTEST=hypothesis_defaults())
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                          capture_output=True, text=True, timeout=timeout, env=env)


def unrelated_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "conftest.py").write_text(_CONFTEST_WITH_BACKEND)
    (proj / "test_unrelated.py").write_text(_UNRELATED_TESTS)
    return proj


def test_a_project_defining_its_own_backend_option_still_runs_with_defaults(tmp_path: Path):
    proj = unrelated_project(tmp_path)
    r = pytest_in(proj, "--backend", "jax")
    # its --backend is its own, Hypothesis untouched, and no conformance item was collected
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
    # the harness's canonical names still work beside it; then only conformance items run
    r = pytest_in(proj, "--backend", "jax", "--harness-backend", "golden", "--harness-kernel", "mhc",
                  "--harness-device", "cpu", "--harness-dtype", "float32", "--collect-only")
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [x for x in r.stdout.splitlines() if "::" in x]
    assert ids and all(x.startswith("harness::test_conformance[mhc_pre-golden-float32-") for x in ids), ids


def _belongs(out: str) -> list[str]:
    return [x for x in out.splitlines() if "belongs to" in x]


def test_a_short_name_the_project_took_is_named_once_with_the_harnesss_own_option(tmp_path: Path):
    """`pytest --backend=x --plugin a.py` where the project's conftest has its own --backend: --backend is the
    project's, the harness runs (--plugin) every backend, and one line says which option is the harness's."""
    proj = unrelated_project(tmp_path)
    shutil.copy(PLUGINS / "mhc_wrong.py", proj / "adapter.py")
    args = ("--backend", "wrong-grads", "--plugin", "adapter.py", "--kernel", "mhc", "--harness-device", "cpu",
            "--harness-dtype", "float32", "--collect-only")
    r = pytest_in(proj, *args)  # -q: no header, the line is written at the session's start
    assert r.returncode == 0, r.stdout + r.stderr
    assert _belongs(r.stdout) == ["harness: --backend belongs to this project's conftest; the harness's own option "
                                  "is --harness-backend (it was not given: every backend runs)"], r.stdout
    ids = [x for x in r.stdout.splitlines() if "::" in x]
    assert any("-golden-" in x for x in ids) and any("-wrong-grads-" in x for x in ids), ids
    r = pytest_in(proj, *args, "-v")  # with the header: there, once
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(_belongs(r.stdout)) == 1 and "--harness-backend" in _belongs(r.stdout)[0], r.stdout
    assert r.stdout.index("belongs to") < r.stdout.index("collected"), r.stdout
    # given, the line says so: the harness's option is the one that chose
    r = pytest_in(proj, *args[:-1], "--harness-backend", "golden", "--collect-only")
    assert _belongs(r.stdout) == ["harness: --backend belongs to this project's conftest; the harness's own option "
                                  "is --harness-backend (given: golden)"], r.stdout
    # without a harness option the project's --backend is simply its own: no word
    r = pytest_in(proj, "--backend", "jax")
    assert r.returncode == 0 and not _belongs(r.stdout) and "harness" not in r.stdout, r.stdout


def test_no_such_line_where_no_conftest_took_the_short_name(tmp_path: Path):
    shutil.copy(PLUGINS / "mhc_wrong.py", tmp_path / "adapter.py")
    for folder, plugin in ((tmp_path, "adapter.py"), (ROOT, "tests/plugins/mhc_wrong.py")):
        r = pytest_in(folder, "--backend", "golden", "--plugin", plugin, "--kernel", "mhc",
                      "--harness-device", "cpu", "--harness-dtype", "float32", "--collect-only", "-v")
        assert r.returncode == 0, r.stdout + r.stderr
        ids = [x for x in r.stdout.splitlines() if "test_conformance[" in x]  # -v: the collected tree
        assert ids and all("-golden-" in x for x in ids), ids  # --backend is the harness's
        assert not _belongs(r.stdout) and "--harness-backend" not in r.stdout, r.stdout


def test_without_a_harness_option_nothing_is_collected(tmp_path: Path):
    (tmp_path / "test_a.py").write_text("def test_a():\n    pass\n")
    r = pytest_in(tmp_path, "--collect-only")
    assert r.returncode == 0 and "1 test collected" in r.stdout, r.stdout


def test_a_plugin_folder_with_no_test_file_collects_the_conformance_items(tmp_path: Path):
    shutil.copy(PLUGINS / "mhc_wrong.py", tmp_path / "adapter.py")
    (tmp_path / "test_unit.py").write_text("def test_unit():\n    raise AssertionError('not a conformance item')\n")
    r = pytest_in(tmp_path, "--plugin", "adapter.py", "--backend", "wrong-grads", "--kernel", "mhc",
                  "--harness-device", "cpu", "--harness-dtype", "float32", "--sizes", "smoke")
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert "test_unit" not in out  # with a harness option only conformance items run
    # the failing item: the component table, the localization and hint, and the repro command
    assert "FAILED harness::test_conformance[mhc_pre-wrong-grads-float32-" in out
    assert "component      verdict" in out
    assert "dbias.pre      FAIL" in out and "hint: sign flipped" in out
    assert "dgamma         FAIL" in out and "all zeros where the oracle is not" in out
    assert "repro: harness repro " in out


def test_in_this_repository_a_harness_option_runs_only_conformance_items():
    r = pytest_in(ROOT, "--kernel", "mhc", "--backend", "golden", "--harness-device", "cpu", "--collect-only")
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [x for x in r.stdout.splitlines() if "::" in x]
    from harness.model import registry

    smoke = registry.get_operator("mhc_pre").cases("smoke", "cpu")  # each in float32 and float16
    assert len(ids) == 2 * len(smoke) and all(x.startswith("harness::") for x in ids), ids


def test_usage_errors_and_a_missing_gpu_under_pytest():
    r = pytest_in(ROOT, "--kernel", "xent", "--backend", "torch,trtion", "--harness-device", "cpu")
    assert r.returncode == 4 and "--backend trtion: no selected operator has such a backend" in r.stderr, r.stderr
    r = pytest_in(ROOT, "--kernel", "mhc", "--harness-device", "gpu")
    assert r.returncode == 4 and "--harness-device 'gpu': expected cpu, cuda" in r.stderr, r.stderr
    r = pytest_in(ROOT, "--kernel", "mhc", "--harness-device", "cuda")
    assert r.returncode == 3 and "no CUDA device on this machine" in r.stdout + r.stderr, r.stdout + r.stderr
    r = pytest_in(ROOT, "--plugin", str(PLUGINS / "no_such_adapter.py"), "--harness-device", "cpu")
    assert r.returncode == 4 and "no_such_adapter.py" in r.stderr, r.stderr


def test_a_plugin_backend_that_ran_no_item_fails_the_session(tmp_path: Path):
    (tmp_path / "gpu_only.py").write_text(
        "from harness.backends.golden.mhc_pre import backward, forward\n"
        "from harness import Backend, register_backend\n"
        "register_backend(Backend(operator='mhc_pre', name='mine', impl=forward, backward=backward,"
        " devices=('cuda',)))\n")
    r = pytest_in(tmp_path, "--plugin", "gpu_only.py", "--kernel", "mhc", "--harness-device", "cpu",
                  "--harness-dtype", "float32")
    assert r.returncode == 3, r.stdout
    assert "harness: backend mine ran no item: mine: runs on cuda only" in r.stdout
