"""`harness check`: each adapter mistake explained in plain words, with the exit status saying what was tested
(0 passed, 1 something to fix, 2 a plugin that does not load, 3 nothing could run here)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import Backend
from harness.front import check
from harness.model import registry
from harness.run.plan import plan

ROOT = Path(__file__).resolve().parent.parent
CHECK = ("import sys, argparse; from harness.front import check; p = argparse.ArgumentParser(); "
         "check.add_arguments(p); "
         "sys.exit(check.run(p.parse_args(sys.argv[1:])))")

# a correct cross-entropy in torch, as the README adapter's my_kernels module
MY_KERNELS = """
    import torch


    def _weights(targets, ignore_index, reduction, normalizer):
        valid = (targets != ignore_index).float()
        if reduction != "mean":
            return valid
        count = float(valid.sum()) if normalizer is None else float(normalizer)
        return valid / count if count else torch.zeros_like(valid)


    def xent_forward(logits, targets, ignore_index, reduction, label_smoothing, z_loss, normalizer):
        z = logits.float()
        valid = targets != ignore_index
        lse = torch.logsumexp(z, dim=1)
        z_y = z.gather(1, torch.where(valid, targets, 0)[:, None]).squeeze(1)
        loss = lse - (1 - label_smoothing) * z_y - label_smoothing / z.shape[1] * z.sum(dim=1) + z_loss * lse * lse
        w = _weights(targets, ignore_index, reduction, normalizer)
        if reduction == "none":
            return loss * w, lse
        if reduction == "mean" and normalizer is None and not bool(valid.any()):
            return torch.tensor(float("nan"), device=z.device), lse
        return (loss * w).sum(), lse


    def xent_backward(g, logits, targets, lse, ignore_index, reduction, label_smoothing, z_loss, normalizer):
        z = logits.float()
        p = torch.exp(z - lse[:, None])
        valid = targets != ignore_index
        onehot = torch.zeros_like(z).scatter_(1, torch.where(valid, targets, 0)[:, None], 1.0)
        c = _weights(targets, ignore_index, reduction, normalizer) * g.float()
        dz = (1 + 2 * z_loss * lse)[:, None] * p - (1 - label_smoothing) * onehot - label_smoothing / z.shape[1]
        return (c[:, None] * dz).to(logits.dtype)
"""

XENT = "from harness.backends.torch.softmax_xent import xent_loss\nfrom harness import Backend, register_backend\n"
MHC = "from harness.backends.golden.mhc_pre import backward, forward\nfrom harness import Backend, register_backend\n"

# adapters with one mistake each: name -> (imports, code)
BROKEN = {
    "f64_loss": (XENT, """
        def impl(logits, targets, **options):
            return {"loss": xent_loss(logits, targets, **options).double()}

        register_backend(Backend(operator="softmax_xent", name="f64-loss", impl=impl, devices=("cpu", "cuda")))
    """),
    # float16 only: the check runs its first dtype, where h_in's contract is float16
    "fp16_h_in": (MHC, """
        def impl(x, phi, alpha, bias, gamma=None, **kw):
            outs, saved = forward(x, phi, alpha, bias, gamma, **kw)
            outs["h_in"] = outs["h_in"].float()
            return outs, saved

        register_backend(Backend(operator="mhc_pre", name="fp16-h-in", impl=impl, backward=backward,
                                 dtypes=("float16",), devices=("cpu", "cuda")))
    """),
    "misnamed": (XENT, """
        def impl(logits, targets, **options):
            return {"losses": xent_loss(logits, targets, **options)}

        register_backend(Backend(operator="softmax_xent", name="misnamed", impl=impl, devices=("cpu", "cuda")))
    """),
    "extra_key": (XENT, """
        import torch

        def impl(logits, targets, **options):
            return {"loss": xent_loss(logits, targets, **options), "lse": torch.logsumexp(logits.detach(), 1)}

        register_backend(Backend(operator="softmax_xent", name="extra-lse", impl=impl, devices=("cpu", "cuda")))
    """),
    "two_outputs": (MHC, """
        def impl(x, phi, alpha, bias, gamma=None, **kw):
            outs, saved = forward(x, phi, alpha, bias, gamma, **kw)
            return (outs["h_in"], outs["h_post"]), saved

        register_backend(Backend(operator="mhc_pre", name="two-outputs", impl=impl, backward=backward,
                                 devices=("cpu", "cuda")))
    """),
    "transposed": (MHC, """
        def bwd(saved, grad_outputs):
            g = backward(saved, grad_outputs)
            g["phi"] = g["phi"].t()
            return g

        register_backend(Backend(operator="mhc_pre", name="dphi-transposed", impl=forward, backward=bwd,
                                 devices=("cpu", "cuda")))
    """),
    "raises": (XENT, """
        def launch(logits, block):
            if logits.shape[1] % block:
                raise ValueError(f"V={logits.shape[1]} is not a multiple of BLOCK_V={block}")

        def impl(logits, targets, **options):
            launch(logits, 16)
            return {"loss": xent_loss(logits, targets, **options)}

        register_backend(Backend(operator="softmax_xent", name="raises", impl=impl, devices=("cpu", "cuda")))
    """),
    "no_grad": (XENT, """
        import torch

        class NoGrad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, logits, targets, options):
                return xent_loss(logits, targets, **options)

            @staticmethod
            def backward(ctx, g):
                return None, None, None

        def impl(logits, targets, **options):
            return {"loss": NoGrad.apply(logits, targets, options)}

        register_backend(Backend(operator="softmax_xent", name="no-dlogits", impl=impl, devices=("cpu", "cuda")))
    """),
    "doubled": (XENT, """
        def impl(logits, targets, **options):
            return {"loss": 2 * xent_loss(logits, targets, **options)}

        register_backend(Backend(operator="softmax_xent", name="doubled", impl=impl, devices=("cpu", "cuda")))
    """),
    # an operator of the plugin's own (softmax_xent under another name): its backends are checked too
    "own_operator": (XENT, """
        import dataclasses
        from harness.model import registry
        from harness import register_operator

        register_operator(dataclasses.replace(registry.get_operator("softmax_xent"), name="my_xent", aliases=(),
                                              perf_targets=()))

        def impl(logits, targets, **options):
            return {"loss": xent_loss(logits, targets, **options).double()}

        register_backend(Backend(operator="my_xent", name="mine", impl=impl, devices=("cpu", "cuda")))
    """),
    # last: the worker dies with it (a crash is a finding; nothing after it needs a new worker)
    "exits": (XENT, """
        import os

        def impl(**kw):
            os._exit(7)

        register_backend(Backend(operator="softmax_xent", name="exits", impl=impl, devices=("cpu", "cuda")))
    """),
}


def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def flat(text: str) -> str:
    return " ".join(text.split())


def blocks(stdout: str) -> dict[str, str]:
    """'operator/backend' -> its block, whitespace flattened (findings are wrapped at 100 columns)."""
    return {b.split()[0]: flat(b) for b in stdout.split("\n\n") if b.strip() and "/" in b.split()[0]}


def _write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.fixture(scope="module")
def readme_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's adapter, verbatim, beside a my_kernels.py that implements it correctly."""
    section = (ROOT / "README.md").read_text().split("## Plug in your own kernel", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "README.md: no python block under 'Plug in your own kernel'"
    folder = tmp_path_factory.mktemp("readme")
    _write(folder, "my_kernels.py", MY_KERNELS)
    return _write(folder, "my_xent_adapter.py", code.group(1))


def test_the_readme_adapter_declared_for_cuda_is_not_checked_on_cpu(readme_adapter: Path, tmp_path: Path):
    code = readme_adapter.read_text()
    assert 'devices=("cpu", "cuda"),' in code
    _write(tmp_path, "my_kernels.py", MY_KERNELS)
    cuda_only = _write(tmp_path, "my_xent_adapter.py", code.replace('devices=("cpu", "cuda"),', 'devices=("cuda",),')
                       .replace("interpret=True, ", ""))
    r = run_check(str(cuda_only), "--device", "cpu")
    assert r.returncode == 3, r.stdout + r.stderr
    out = blocks(r.stdout)["softmax_xent/mine"]
    assert "not checked" in out and "devices=('cuda',), which excludes this machine's cpu" in out
    assert "nothing could be checked here" in out
    assert 'add "cpu" to devices and set interpret=True' in out and "on a GPU machine" in out


def test_the_readme_adapter_as_written_passes_on_cpu(readme_adapter: Path):
    r = run_check(str(readme_adapter), "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: ran N3-V2 (float32, cpu) in" in blocks(r.stdout)["softmax_xent/mine"]
    assert "1 backend(s) on cpu: 1 ok, 0 to fix, 0 not checked here" in r.stdout


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, str], dict[str, Path]]:
    """One check of every broken adapter (one worker for all): exit status, blocks, plugin files."""
    folder = tmp_path_factory.mktemp("broken")
    files = {name: _write(folder, f"{name}.py", head + textwrap.dedent(code))
             for name, (head, code) in BROKEN.items()}
    r = run_check(*map(str, files.values()), "--device", "cpu")
    return r.returncode, blocks(r.stdout), files


def test_an_output_in_float64_for_a_float32_case_names_the_output_and_both_dtypes(broken):
    rc, out, _ = broken
    assert rc == 1
    block = out["softmax_xent/f64-loss"]
    assert "to fix (SHAPE): ran N3-V2 (float32, cpu)" in block
    assert "output 'loss' came back as float64; expected float32 for this float32 case" in block
    assert "loss.to(torch.float32)" in block


def test_a_float32_output_of_a_float16_only_backend_is_checked_in_float16(broken):
    rc, out, _ = broken
    block = out["mhc_pre/fp16-h-in"]
    assert rc == 1 and "(float16, cpu)" in block
    assert "output 'h_in' came back as float32; expected float16 for this float16 case" in block


def test_a_misnamed_output_key_names_the_extra_key_the_missing_one_and_the_outputs_in_order(broken):
    rc, out, _ = broken
    block = out["softmax_xent/misnamed"]
    assert rc == 1
    assert "impl returned a dict with the keys losses; losses is not an output of softmax_xent (ignored)" in block
    assert "loss is missing (rename 'losses' to 'loss'?)" in block
    assert "softmax_xent's outputs, in order: loss" in block and "gradients were not checked" in block


def test_an_extra_output_key_is_a_finding_although_the_cell_passes(broken):
    rc, out, _ = broken
    block = out["softmax_xent/extra-lse"]
    assert rc == 1 and "to fix (the cell passed)" in block
    assert "the keys loss, lse; lse is not an output of softmax_xent (ignored)" in block


def test_a_tuple_with_too_few_outputs_names_the_missing_one_and_the_order(broken):
    _, out, _ = broken
    block = out["mhc_pre/two-outputs"]
    assert "impl returned a tuple of 2 values, but this case has 3 output(s): so h_res is missing" in block
    assert "mhc_pre's outputs, in order: h_in, h_post, h_res" in block


def test_a_transposed_gradient_is_called_a_transpose_with_both_shapes(broken):
    _, out, _ = broken
    block = out["mhc_pre/dphi-transposed"]
    assert "to fix (SHAPE)" in block
    assert "the gradient of input 'phi' has shape [14, 8], expected [8, 14]: it is the transpose" in block


def test_an_exception_inside_impl_names_its_type_message_and_the_adapters_line(broken):
    _, out, files = broken
    lines = files["raises"].read_text().splitlines()
    line = next(i for i, s in enumerate(lines, 1) if "raise ValueError" in s)
    block = out["softmax_xent/raises"]
    assert "to fix (ERROR)" in block
    assert "it raised ValueError: V=2 is not a multiple of BLOCK_V=16" in block
    assert f"at {files['raises']}:{line} (in launch) in the adapter" in block


def test_a_gradient_never_computed_names_the_input(broken):
    _, out, _ = broken
    block = out["softmax_xent/no-dlogits"]
    assert "the gradient of input 'logits' is None: it was never computed" in block


def test_wrong_results_say_the_wiring_is_right_and_point_at_the_sweep(broken):
    _, out, files = broken
    block = out["softmax_xent/doubled"]
    assert "the adapter is wired correctly" in block and "loss (max error" in block
    assert f"harness run --kernel softmax_xent --plugin {files['doubled']} --backend doubled --sizes sweep" in block


def test_the_backends_of_an_operator_the_plugin_registers_are_checked(broken):
    _, out, _ = broken
    block = out["my_xent/mine"]
    assert "output 'loss' came back as float64; expected float32" in block
    assert "output_dtypes=lambda inputs: {'loss': torch.float64, ...}" in block


def test_a_crash_is_a_finding_with_the_exit_status(broken):
    _, out, _ = broken
    block = out["softmax_xent/exits"]
    assert "to fix (CRASH)" in block and "exit code 7" in block and "--case N3-V2" in block


# -- without a worker -----------------------------------------------------------------------------------

def check_here(*argv: str) -> int:
    p = argparse.ArgumentParser()
    check.add_arguments(p)
    return check.run(p.parse_args(list(argv)))


def test_a_plugin_with_a_syntax_error_is_a_usage_error_naming_file_and_line(tmp_path: Path, capsys):
    plugin = _write(tmp_path, "broken_syntax.py", "from harness import Backend\n\ndef f(:\n    pass\n")
    assert check_here(str(plugin), "--device", "cpu") == 2
    assert f"{plugin}:3: SyntaxError" in capsys.readouterr().err


def test_a_plugin_that_registers_no_backend_is_a_usage_error(tmp_path: Path, capsys):
    plugin = _write(tmp_path, "registers_nothing.py", "import torch\n")
    assert check_here(str(plugin), "--device", "cpu") == 2
    assert f"{plugin}: registers no backend" in capsys.readouterr().err


def test_a_missing_required_package_keeps_the_backend_from_being_checked():
    b = Backend(operator="softmax_xent", name="needs", impl=lambda **kw: None, devices=("cpu",),
                requires=("no_such_package_here",))
    (f,) = check.unrunnable(b, "cpu")
    assert f.blocking and f.topic == "requires" and "pip install no_such_package_here" in f.text


def test_a_timeout_names_the_limit():
    registry.discover()
    task = plan(["softmax_xent"], "smoke", ["torch"], ["float32"], "cpu", repeats=1).tasks[0]
    cell = task.failed("TIMEOUT", "no result after 7 s; worker killed")  # as a single worker (CellWorker) records it
    s = check.Subject(registry.get_operator("softmax_xent"), registry.get_backend("softmax_xent", "torch"),
                      (), False, 7.0)
    (f,) = check.explain(cell, s)
    assert f.topic == "timeout" and "no result within 7 s (--timeout)" in f.text and "hangs" in f.text
