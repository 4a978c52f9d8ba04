"""Installing the distribution changes nothing for other projects: no generic top-level modules, and (with
the wheel in a fresh virtual environment) an unrelated project's pytest keeps its options and defaults."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from subprocess_env import inner_pytest_env
from test_pytest_road import hypothesis_defaults, unrelated_project

ROOT = Path(__file__).resolve().parent.parent
GENERIC = ("cases", "references", "backends")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # a copy of the checkout, so that the build's own folders (build/, *.egg-info) stay out of it
    src = out / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file() and not f.startswith(("reports/", "tests/")):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    [whl] = out.glob("gradient_harness-*.whl")
    return whl


def test_the_wheel_has_one_top_level_package(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"harness"}, tops
    # the operators, references and backends are inside it, CUDA sources included
    for sub in ("harness/cases/mhc_pre.py", "harness/references/softmax_xent.py",
                "harness/backends/triton/mhc_pre/adapter.py", "harness/backends/cuda/softmax_xent/softmax_xent.cu"):
        assert sub in names, sub


def test_the_editable_install_provides_no_generic_top_level_module(tmp_path: Path):
    code = ("import importlib.util as u, harness.cases, harness.backends, harness.references; "
            f"print([m for m in {GENERIC!r} if u.find_spec(m) is not None])")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_the_wheel_in_a_fresh_environment_leaves_an_unrelated_project_alone(wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    # system site-packages give torch, pytest and hypothesis; the wheel itself goes into the venv
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    installed = {p.name for p in Path(site).iterdir()}
    assert not installed & set(GENERIC), installed
    proj = unrelated_project(tmp_path)
    code = ("import harness, importlib.util as u; print(harness.__file__); "
            f"print([m for m in {GENERIC!r} if u.find_spec(m) is not None])")
    r = subprocess.run([str(py), "-c", code], cwd=proj, capture_output=True, text=True, timeout=120)
    where, generic = r.stdout.split("\n")[:2]
    assert where.startswith(site) and generic == "[]", r.stdout + r.stderr
    r = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--backend", "jax"], cwd=proj,
                       capture_output=True, text=True, timeout=600,
                       env=inner_pytest_env(HYPOTHESIS_WITHOUT_PYTEST=hypothesis_defaults(str(py))))
    assert r.returncode == 0 and "3 passed" in r.stdout, r.stdout + r.stderr
