"""The Triton lazy_attention backend under the interpreter against the float64 reference.

The kernels must be decorated with TRITON_INTERPRET=1 already set, so the checks run in one
subprocess; it prints one JSON line per case with per-head relative errors of every component.
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

# (name, B, H, L, Dh, W, tau, qkv layout, dO layout, dtype)
CASES = [
    # the seed bug's setting: q/k/v transposed views of [B,L,H,Dh], dO contiguous, H > 1
    ("seed-H3-qkvT-dOcontig", 1, 3, 17, 16, 100, "neg", "T", "contig", "float32"),
    ("L33-W7-B2-pos-tau", 2, 2, 33, 16, 7, "pos", "contig", "T", "float32"),
    ("L33-W20-D32-fp16-qkvT", 1, 2, 33, 32, 20, "neg", "T", "contig", "float16"),
    ("L1-W1", 1, 2, 1, 16, 1, "neg", "T", "contig", "float32"),
    ("L2-W7", 1, 2, 2, 16, 7, "pos", "contig", "contig", "float32"),
]

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from harness.references.lazy_attention import lazy_attention
    from harness.backends.triton.lazy_attention import wrapper
    from harness.backends.triton.lazy_attention.wrapper import lazy_attention_triton
    wrapper.INTERPRET_OVERRIDES.update(json.loads(sys.argv[2]))

    def make(shape, layout, dtype, gen):
        B, H, L, Dh = shape
        if layout == "T":   # [B,H,L,Dh] view of a [B,L,H,Dh] buffer: head stride Dh
            return torch.randn(B, L, H, Dh, generator=gen).to(dtype).transpose(1, 2)
        return torch.randn(B, H, L, Dh, generator=gen).to(dtype)

    for name, B, H, L, Dh, W, tau, lay, glay, dt in json.loads(sys.argv[1]):
        gen = torch.Generator().manual_seed(1234)
        dtype = getattr(torch, dt)
        q, k, v = (make((B, H, L, Dh), lay, dtype, gen) for _ in range(3))
        bias = 0.5 * torch.randn(H, W, generator=gen)
        u = torch.rand(H, generator=gen)
        tau_t = -0.9 + 0.8 * u if tau == "neg" else 0.1 + 0.4 * u
        g = make((B, H, L, Dh), glay, dtype, gen)
        ins = [t.clone().requires_grad_() for t in (q, k, v, bias, tau_t)]
        o = lazy_attention_triton(*ins)["o"]
        got = [o] + list(torch.autograd.grad(o, ins, g))
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, bias, tau_t)]
        ro = lazy_attention(*ref_in)["o"]
        ref = [ro] + list(torch.autograd.grad(ro, ref_in, g.double()))
        out = {"name": name}
        for comp, a, r in zip(("o", "dq", "dk", "dv", "dbias", "dtau"), got, ref):
            assert a.dtype == (dtype if comp in ("o", "dq", "dk", "dv") else torch.float32), (comp, a.dtype)
            assert a.shape == r.shape, (comp, a.shape, r.shape)
            err = (a.double() - r).abs()
            head = 1 if comp in ("o", "dq", "dk", "dv") else 0
            per_head = err.movedim(head, 0).reshape(H, -1).amax(1)
            # errors relative to the component's scale (absolute where the true gradient is ~0: L=1)
            scale = max(float(r.abs().max()), 1.0)
            out[comp] = [float(e) / scale for e in per_head]
        print(json.dumps(out), flush=True)
""")


# the interpreter's tiles (16 everywhere), and query blocks of two key blocks in the Delta+dq kernel (its
# diagonal tile spans both) with key blocks of two query blocks in the dk/dv kernel
TILES = {"square": {}, "mixed": {"delta": {"BLOCK_M": 32, "BLOCK_N": 16}, "dkdv": {"BLOCK_M": 16, "BLOCK_N": 32}}}


@pytest.fixture(scope="module", params=list(TILES))
def results(request) -> dict[str, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES), json.dumps(TILES[request.param])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in rows}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_head_matches_reference(results: dict, case: tuple) -> None:
    name, dtype = case[0], case[-1]
    row = results[name]
    bad = {}
    for comp, errs in row.items():
        if comp == "name":
            continue
        # float32 accumulation over <= 33 terms. With fp16 inputs, e and ds are rounded to fp16 for
        # the dots (o, dq, dk, dv are fp16 anyway), but the float32 outputs dbias and dtau must keep
        # float32 accuracy: the harness judges them against a float32-math floor.
        tol = 2e-6 if dtype == "float32" or comp in ("dbias", "dtau") else 4e-3
        if max(errs) > tol:
            bad[comp] = (tol, errs)
    assert not bad, f"{name}: per-head relative errors above tolerance: {bad}"


def test_tile_shapes_are_checked(monkeypatch) -> None:
    import torch
    from harness.backends.triton.lazy_attention import wrapper

    for kernel, bad, match in (("delta", {"BLOCK_M": 16, "BLOCK_N": 32}, "delta BLOCK_M must be a multiple"),
                               ("dkdv", {"BLOCK_M": 16, "BLOCK_N": 64}, "dkdv BLOCK_N must be BLOCK_M or 2")):
        assert wrapper.checked_config(kernel, 128, torch.bfloat16) == wrapper.gpu_config(kernel, 128, torch.bfloat16)
        monkeypatch.setitem(wrapper.OVERRIDES, kernel, bad)
        with pytest.raises(ValueError, match=match):
            wrapper.checked_config(kernel, 128, torch.bfloat16)
