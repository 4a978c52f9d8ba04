"""The Triton gated-MLP kernels (backends/triton/gated_mlp/) and the rope kernel (backends/triton/rope/) under the
interpreter, at their edges: empty tensors, saturated and huge gates, every activation against float64, strided and
transposed views, 16-bit dtypes; rope's two pair layouts, offsets, odd head dimensions, its backward as the inverse
rotation; and the declared blocks against the tiles the wrappers launch and the cases' sizes.

The kernels must be decorated with TRITON_INTERPRET=1 already set, so the checks run in one subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, warnings, torch
    import torch.nn.functional as F
    from harness.model import registry
    from harness.backends.triton.gated_mlp import wrapper as W
    from harness.cases.swiglu import BLOCKS
    from harness.model.inputs import place
    warnings.simplefilter("ignore")  # numpy's overflow warnings of exp(+-1e4) under the interpreter

    REF = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
    out = {}

    def check(name, gate, up, act, tol):
        g64, u64 = gate.double().requires_grad_(), up.double().requires_grad_()
        o64 = REF[act](g64) * u64
        d = torch.randn(o64.shape, dtype=torch.float64, generator=gen)  # seeded: the same check on every machine
        o64.backward(d)
        gk, uk = gate.clone().requires_grad_(), up.clone().requires_grad_()
        o = W.GatedAct.apply(gk, uk, W.ACTS[act])
        o.backward(d.to(gate.dtype))
        row = {}
        for n, k, r in (("out", o, o64), ("dgate", gk.grad, g64.grad), ("dup", uk.grad, u64.grad)):
            if not torch.isfinite(k).all():
                row[n] = "non-finite"
                continue
            err = float((k.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
            row[n] = "ok" if err <= tol else f"rel err {err:.3g} > {tol:g}"
        out[name] = row

    gen = torch.Generator().manual_seed(0)
    for act in ("silu", "gelu", "gelu_tanh"):
        g = torch.randn(9, 70, generator=gen) * 3
        u = torch.randn(9, 70, generator=gen)
        check(f"{act}-randn", g, u, act, 2e-6)
        # saturated and huge gates: no NaN from exp overflow, exact limits; at g = -5 a tanh gelu taking 1 - t*t
        # in float32 is off by up to 2.9e-6 of max|dgate| (over 300 draws of dout), the kernel's form 9e-8
        big = torch.tensor([[-1e4, -100.0, -30.0, -5.0, 0.0, 5.0, 30.0, 100.0, 1e4]]).repeat(3, 1)
        check(f"{act}-huge", big, torch.randn(big.shape, generator=gen), act, 2e-6)
        # strided and transposed views of other strides each, several tiles
        gt = place(torch.randn(11, 65, generator=gen), "transposed", "cpu")
        us = place(torch.randn(11, 65, generator=gen), "stride:3", "cpu")
        check(f"{act}-strided", gt, us, act, 2e-6)
        for dt, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
            check(f"{act}-{str(dt)[6:]}", (torch.randn(5, 40, generator=gen) * 2).to(dt),
                  torch.randn(5, 40, generator=gen).to(dt), act, tol)
    # the tanh gelu's tail, element by element: where tanh saturates (z < -8) act and act' are tiny, and keep their
    # digits only if 1 + t and 1 - t^2 are not formed by cancellation (z's own rounding costs 2|z| ulps of exp);
    # float64's tanh saturates too (1 - t*t is 0 at z = -33), so the reference takes 1 + t = 2q / (1 + q),
    # q = exp(2z), and 1 - t^2 = (1 + t)(1 - t) in float64
    tail = torch.linspace(-9.0, -3.0, 61)[None].requires_grad_()
    g = tail.detach().double()
    z = 0.7978845608028654 * (g + 0.044715 * g ** 3)
    q = torch.exp(2 * z)
    one_plus_t = 2 * q / (1 + q)
    want = 0.5 * one_plus_t + 0.5 * g * one_plus_t * (2 - one_plus_t) * 0.7978845608028654 * (1 + 3 * 0.044715 * g * g)
    W.GatedAct.apply(tail, torch.ones(1, 61), W.ACTS["gelu_tanh"]).backward(torch.ones(1, 61))
    rel = float(((tail.grad.double() - want) / want).abs().max())
    out["gelu_tanh-tail"] = {"dgate": "ok" if rel <= 1e-5 else f"elementwise rel err {rel:.3g} > 1e-05"}
    # empty tensors: no launch, empty results of the right shape
    for shape in ((0, 7), (3, 0)):
        e = torch.empty(shape).requires_grad_()
        y = W.GatedAct.apply(e, torch.empty(shape).requires_grad_(), W.ACTS["silu"])
        y.sum().backward()
        out[f"empty-{shape[0]}x{shape[1]}"] = {"out": "ok" if y.shape == shape and e.grad.shape == shape else "shape"}
    # rope: against the reference in float32 (the same float32 angles), every pair layout, offset and odd size
    from harness.backends.triton.rope import wrapper as RW
    from harness.references.rope import rope as rope_ref
    for il in (False, True):
        for off in (0, 4095, 70000):
            for shape, lay in (((1, 1, 1, 2), "contiguous"), ((2, 7, 3, 30), "perm:0,2,1,3"),
                               ((1, 9, 5, 64), "stride:2")):
                x = place(torch.randn(shape, generator=gen), lay, "cpu").requires_grad_()
                y = RW.Rope.apply(x, 10000.0, il, off)
                want = rope_ref(x.detach(), base=10000.0, interleaved=il, offset=off)["out"]
                err = float((y.detach() - want).abs().max())
                # the backward is the inverse rotation: dout = out gives dx = x back
                y.backward(y.detach())
                back = float((x.grad - x.detach()).abs().max())
                key = f"rope-{'il' if il else 'half'}-off{off}-D{shape[-1]}"
                out[key] = {"out": "ok" if err <= 2e-6 else f"err {err:.3g}",
                            "inverse": "ok" if back <= 2e-6 else f"err {back:.3g}"}
    e = torch.empty((2, 0, 3, 8)).requires_grad_()
    y = RW.Rope.apply(e, 10000.0, False, 0)
    y.sum().backward()
    out["rope-empty"] = {"out": "ok" if y.shape == e.shape and e.grad.shape == e.shape else "shape"}
    for bad in ((torch.empty(1, 2, 3, 7), 0), (torch.empty(1, 2, 3, 8), -1)):
        try:
            RW.Rope.apply(bad[0], 10000.0, False, bad[1])
            out[f"rope-rejects-{bad[1]}"] = {"raised": "no"}
        except ValueError:
            out[f"rope-rejects-{bad[1]}"] = {"raised": "ok"}
    registry.discover()
    out["_rope"] = {"blocks": registry.get_backend("rope", "triton").blocks,
                    "used": {k: RW.CONFIG[k] for k in ("BLOCK_T", "BLOCK_H")},
                    "gpu": {k: RW.GPU_CONFIG[k] for k in ("BLOCK_T", "BLOCK_H")}}
    out["_blocks"] = {op: registry.get_backend(op, "triton").blocks for op in ("swiglu", "geglu")}
    out["_used"] = {k: W.CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}
    out["_cases"] = BLOCKS
    out["_gpu"] = {k: W.GPU_CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CHECKS = [f"{a}-{k}" for a in ("silu", "gelu", "gelu_tanh")
          for k in ("randn", "huge", "strided", "float16", "bfloat16")] + ["gelu_tanh-tail", "empty-0x7", "empty-3x0"]
CHECKS += [f"rope-{lay}-off{off}-D{d}" for lay in ("half", "il") for off in (0, 4095, 70000) for d in (2, 30, 64)]
CHECKS += ["rope-empty", "rope-rejects-0", "rope-rejects--1"]


@pytest.mark.parametrize("check", CHECKS)
def test_kernels_at_their_edges(results: dict, check: str) -> None:
    assert results[check] and all(v == "ok" for v in results[check].values()), results[check]


def test_declared_blocks_are_the_launched_tiles_and_the_cases_tiles(results: dict) -> None:
    for op in ("swiglu", "geglu"):
        assert results["_blocks"][op] == results["_used"] == results["_cases"]["cpu"]
    assert results["_gpu"] == results["_cases"]["cuda"]


def test_rope_declared_blocks_are_the_launched_tiles_and_the_cases_tiles(results: dict) -> None:
    from harness.cases.rope import BLOCKS

    assert results["_rope"]["blocks"] == results["_rope"]["used"] == BLOCKS["cpu"]
    assert results["_rope"]["gpu"] == BLOCKS["cuda"]


def test_the_gpu_blocks_declared_outside_the_interpreter_are_the_cases_tiles() -> None:
    from harness.cases import rope, swiglu

    from harness.model import registry
    from harness.model.registry import interpreted

    if interpreted():
        pytest.skip("the adapters declare the interpreter's blocks under TRITON_INTERPRET=1")
    registry.discover()
    assert registry.get_backend("swiglu", "triton").blocks == swiglu.BLOCKS["cuda"]
    assert registry.get_backend("geglu", "triton").blocks == swiglu.BLOCKS["cuda"]
    assert registry.get_backend("rope", "triton").blocks == rope.BLOCKS["cuda"]
