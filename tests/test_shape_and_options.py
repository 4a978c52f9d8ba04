"""Issue #41: a gradient a non-autograd backward returns transposed is SHAPE (naming the input, both shapes and
the transpose) in `harness check`, `harness run` and a cell run in-process, never an ERROR raised inside the
operator's invariants or the microbatch combination."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.judge.judgement import judge_cell

ROOT = Path(__file__).resolve().parent.parent

# softmax_xent through the reference in float32, with a backward of its own (impl returns (outputs, saved)) that
# returns dlogits transposed: [V, N] for logits [N, V]
TRANSPOSED_XENT = """
    import torch

    from harness import Backend, register_backend
    from harness.references.softmax_xent import softmax_xent


    def forward(logits, targets, **options):
        x = logits.detach().float().requires_grad_(True)
        with torch.enable_grad():
            loss = softmax_xent(x, targets, **options)["loss"]
        return {"loss": loss.detach()}, (x, loss, logits.dtype)


    def backward(saved, grad_outputs):
        x, loss, dtype = saved
        (d,) = torch.autograd.grad(loss, x, grad_outputs["loss"].to(loss.dtype))
        return {"logits": d.t().to(dtype)}
"""
REGISTER = """
    register_backend(Backend(operator="softmax_xent", name="dlogits-transposed", impl=forward, backward=backward,
                             devices=("cpu", "cuda")))
"""


def _plugin(folder: Path) -> Path:
    p = folder / "transposed_xent.py"
    p.write_text(textwrap.dedent(TRANSPOSED_XENT) + textwrap.dedent(REGISTER))
    return p


def harness(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_harness_check_calls_a_transposed_gradient_of_a_backward_shape_with_both_shapes(tmp_path: Path):
    r = harness("check", str(_plugin(tmp_path)), "--device", "cpu")
    out = " ".join(r.stdout.split())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RuntimeError" not in out and "in invariants" not in out, out
    assert "to fix (SHAPE): ran N3-V2 (float32, cpu)" in out, out
    assert "the gradient of input 'logits' has shape [2, 3], expected [3, 2]: it is the transpose" in out, out


def test_harness_run_calls_every_cell_with_a_transposed_gradient_shape_microbatches_included(tmp_path: Path):
    report = tmp_path / "reports"
    r = harness("run", "--kernel", "softmax_xent", "--sizes", "smoke", "--plugin", str(_plugin(tmp_path)),
                "--backend", "dlogits-transposed", "--device", "cpu", "--dtype", "float32", "--report", str(report),
                "--no-progress", "--repeats", "1", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ERROR" not in r.stdout, r.stdout
    cells = json.loads((report / "cpu" / "softmax_xent.json").read_text())["cells"]
    assert cells and any(c["case"]["microbatches"] > 1 for c in cells)
    for c in cells:
        name = c["case"]["name"]
        assert c["status"] in ("MEASURED", "SHAPE") and c["shown"] == "SHAPE", (name, c["status"], c.get("error"))
        (bad,) = [x for x in c["components"] if x["verdict"] != "PASS"]
        assert bad["name"] == "dlogits", (name, bad)
        n, v = c["case"]["params"]["N"], c["case"]["params"]["V"]
        if c["case"]["microbatches"] <= 1:
            assert bad["reason"] == f"expected [{n}, {v}] float32, got [{v}, {n}] float32 " \
                                    "(transposed: the expected shape reversed)", (name, bad["reason"])
            assert any("the gradient of input 'logits': expected" in x and "transposed" in x for x in c["notes"])
        else:  # named in the microbatch that came back transposed, before the microbatches are combined
            assert "transposed" in bad["reason"], (name, bad["reason"])
            assert any("the gradient of input 'logits' (microbatch 1 of" in x for x in c["notes"]), c["notes"]
    assert "dlogits SHAPE (expected [3, 2] float32, got [2, 3] float32 (transposed" in r.stdout, r.stdout


def test_a_cell_run_in_process_is_shape_and_its_other_results_still_judged():
    from harness import Backend
    from harness.measure.cell import run_cell
    from harness.model import registry
    from harness.model.spec import Case

    plugin: dict = {}  # the plugin's forward and backward, not registered in this process
    exec(textwrap.dedent(TRANSPOSED_XENT), plugin)
    forward, backward = plugin["forward"], plugin["backward"]

    op = registry.get_operator("softmax_xent")
    b = Backend(operator="softmax_xent", name="test", impl=forward, backward=backward, devices=("cpu",))
    cell = run_cell(op, b, Case("N5-V7", {"N": 5, "V": 7, "z_loss": 1e-4}), "float32", "cpu", repeats=1)
    assert judge_cell(cell).shown == "SHAPE", (cell.status, cell.error)
    figs = {f.name: f for f in cell.components}
    assert figs["dlogits"].kind == "shape" and (figs["dlogits"].expected, figs["dlogits"].got) == \
        ("[5, 7] float32", "[7, 5] float32")
    assert figs["loss"].kind == "figures"  # the loss is judged as usual
    assert "invariants" not in [c.name for c in cell.contracts]  # they read dlogits in its contract's shape
    assert cell.notes == ["the gradient of input 'logits': expected [5, 7] float32, got [7, 5] float32 "
                          "(transposed: the expected shape reversed); the invariants were not checked"]
