"""The plugin road (issue #25, point 2): a plugin's folder is importable from it, its errors are usage
errors naming file and line, and a registration never silently replaces or vanishes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def harness(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def _write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


ADAPTER = """
    from harness.backends.golden.mhc_pre import backward, forward
    from harness import Backend, register_backend
    {extra}
    register_backend(Backend(operator="{op}", name="{name}", impl=forward, backward=backward,
                             devices=("cpu", "cuda"){more}))
"""


def test_a_plugin_imports_its_own_kernel_module_from_its_folder(tmp_path: Path):
    _write(tmp_path, "my_kernels.py", "SCALE = 1.0\n")
    plugin = _write(tmp_path, "adapter.py", ADAPTER.format(extra="import my_kernels  # beside the adapter",
                                                           op="mhc_pre", name="mine", more=""))
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 0, r.stderr
    assert "mine" in r.stdout and f"plugin:{plugin}" in r.stdout


def test_a_plugin_with_a_syntax_error_is_a_usage_error_naming_file_and_line(tmp_path: Path):
    plugin = _write(tmp_path, "broken.py", "from harness import Backend\n\ndef f(:\n    pass\n")
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 2 and f"{plugin}:3: SyntaxError" in r.stderr and "Traceback" not in r.stderr


def test_a_plugin_whose_import_fails_names_its_line(tmp_path: Path):
    plugin = _write(tmp_path, "missing.py", "import os\nimport no_such_kernel_module\n")
    r = harness("run", "--kernel", "mhc", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 2 and f"{plugin}:2: ModuleNotFoundError" in r.stderr, r.stderr


def test_registering_for_an_unknown_operator_is_an_error(tmp_path: Path):
    plugin = _write(tmp_path, "typo.py", ADAPTER.format(extra="", op="mhc_pr", name="mine", more=""))
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 2 and "no operator 'mhc_pr' is registered" in r.stderr and "mhc_pre" in r.stderr


def test_a_name_taken_is_an_error_unless_the_plugin_says_it_replaces_it(tmp_path: Path):
    plugin = _write(tmp_path, "clash.py", ADAPTER.format(extra="", op="mhc_pre", name="golden", more=""))
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 2 and "mhc_pre/golden is already registered (in-tree)" in r.stderr
    assert "replaces=True" in r.stderr
    plugin = _write(tmp_path, "takeover.py", ADAPTER.format(extra="", op="mhc_pre", name="golden",
                                                           more=", replaces=True"))
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 0, r.stderr
    golden = next(line for line in r.stdout.splitlines() if line.strip().startswith("- golden"))
    assert f"plugin:{plugin}" in golden  # harness list shows which one runs, and where it came from
    assert "replaces the one registered by in-tree" in r.stderr


def test_two_plugins_each_with_a_kernels_module_get_their_own(tmp_path: Path):
    plugins = []
    for who in ("alice", "bob"):
        folder = tmp_path / who
        folder.mkdir()
        _write(folder, "kernels.py", f"WHO = {who!r}\n")
        plugins += ["--plugin", str(_write(folder, "adapter.py", ADAPTER.format(
            extra="import kernels", op="mhc_pre", name=who, more=", description='kernels of ' + kernels.WHO")))]
    r = harness("list", "--device", "cpu", *plugins)
    assert r.returncode == 0, r.stderr
    assert "alice" in r.stdout and "kernels of alice" in r.stdout
    assert "kernels of bob" in r.stdout, r.stdout  # not alice's module under bob's name


def test_an_operator_name_taken_is_an_error(tmp_path: Path):
    """register_operator overwrote an operator of the same name silently: a plugin's operator replaced an
    in-tree one (or another plugin's) and every backend of it then ran against the wrong reference."""
    plugin = tmp_path / "clash_op.py"
    plugin.write_text(
        "from harness import OperatorSpec, register_operator\n"
        "from harness.model.registry import get_operator\n"
        "import dataclasses\n"
        "def make_inputs(case, dtype, gen, device):\n"
        "    raise NotImplementedError\n"
        "register_operator(dataclasses.replace(get_operator('mhc_pre'), make_inputs=make_inputs))\n")
    r = harness("list", "--device", "cpu", "--plugin", str(plugin))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "operator 'mhc_pre' is already registered" in r.stderr and "another name" in r.stderr, r.stderr
