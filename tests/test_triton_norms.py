"""The Triton norm kernels (backends/triton/rmsnorm/, backends/triton/layernorm/) under the interpreter, at their
edges: one feature, a block exactly and one past it, rows past a row tile, no rows, zero rows, |x| past the fp16
square, strided and transposed views, the fused residual (rmsnorm), a large mean and dx rows summing to 0
(layernorm), 16-bit dtypes, bitwise determinism, and the declared blocks against the tiles the wrapper launches.

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
    from harness.model import registry
    from harness.backends.triton.rmsnorm import wrapper as W
    from harness.model.inputs import place
    from harness.references.rmsnorm import rmsnorm as ref
    warnings.simplefilter("ignore")

    out = {}
    gen = torch.Generator().manual_seed(0)

    def rnd(shape, scale=1.0):
        return torch.randn(shape, generator=gen) * scale

    def rel(v, r):
        return float((v.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)) if v.numel() else 0.0

    def check(name, x, w, res=None, tol=2e-6, layouts=("contiguous", "contiguous", "contiguous")):
        dt = x.dtype
        leaves64 = [t.detach().double().requires_grad_() if t is not None else None for t in (x, res, w)]
        o64 = ref(leaves64[0], leaves64[1], leaves64[2], eps=1e-6)
        grads = {k: rnd(v.shape) for k, v in o64.items()}
        torch.autograd.backward(list(o64.values()), [grads[k].double() for k in o64])
        # the float32 reference (the floor): where it cancels (one feature), the tolerance is 3x its error
        leaves32 = [t.detach().float().clone().requires_grad_() if t is not None else None for t in (x, res, w)]
        o32 = ref(leaves32[0], leaves32[1], leaves32[2], eps=1e-6)
        torch.autograd.backward(list(o32.values()), [grads[k].float() for k in o32])
        floor = {k: o32[k] for k in o32} | {"dx": leaves32[0].grad, "dw": leaves32[2].grad,
                                             "dresidual": leaves32[1].grad if res is not None else None}
        xs = place(x, layouts[0], "cpu").requires_grad_()
        rs = place(res, layouts[1], "cpu").requires_grad_() if res is not None else None
        ws = w.clone().requires_grad_()
        o = W.rmsnorm_triton(xs, rs, ws, eps=1e-6)
        gs = {k: place(grads[k].to(dt), layouts[2], "cpu") for k in o}
        torch.autograd.backward(list(o.values()), [gs[k] for k in o])
        row = {}
        pairs = [(k, o[k], o64[k]) for k in o] + [("dx", xs.grad, leaves64[0].grad), ("dw", ws.grad, leaves64[2].grad)]
        if res is not None:
            pairs.append(("dresidual", rs.grad, leaves64[1].grad))
            row["dx==dresidual"] = "ok" if torch.equal(xs.grad, rs.grad) else "differ"
        for n, k, r in pairs:
            if k is None or k.shape != r.shape:
                row[n] = f"shape {None if k is None else tuple(k.shape)}"
            elif k.numel() and not torch.isfinite(k).all():
                row[n] = "non-finite"
            else:
                err, lim = rel(k, r), max(tol, 3 * rel(floor[n], r))
                row[n] = "ok" if err <= lim else f"rel err {err:.3g} > {lim:g}"
        out[name] = row

    BR, BF = W.CONFIG["BLOCK_R"], W.CONFIG["BLOCK_F"]
    for R, F in ((3, 1), (1, BF), (BR + 1, BF + 1), (2 * BR + 1, 3 * BF + 5), (0, 7)):
        check(f"R{R}-F{F}", rnd((R, F)), 1 + 0.5 * rnd((F,)))
        check(f"R{R}-F{F}-res", rnd((R, F)), 1 + 0.5 * rnd((F,)), rnd((R, F)))
    # a row of zeros: rstd = 1/sqrt(eps), y = 0, dx = rstd * dy * w (finite)
    z = rnd((BR + 3, 40)); z[2] = 0
    check("zero-row", z, 1 + 0.5 * rnd((40,)))
    # strided, padded and transposed views: x, the residual and the upstream gradients each their own strides
    for name, lay in (("views", ("transposed", "pad:3", "stride:3")), ("views2", ("stride:2", "transposed", "pad:5"))):
        check(name, rnd((BR + 3, 70)), 1 + 0.5 * rnd((70,)), rnd((BR + 3, 70)), layouts=lay)
    # 16 bits: |x| ~ 1e3 squares past fp16's range; judged against float64 at the dtype's rounding
    check("fp16-large", (rnd((BR + 3, 70), 1e3)).half(), (1 + 0.5 * rnd((70,))).half(), tol=2e-3)
    check("bf16-res", rnd((BR + 3, 70)).bfloat16(), (1 + 0.5 * rnd((70,))).bfloat16(), rnd((BR + 3, 70)).bfloat16(),
          tol=1.6e-2)
    # bitwise determinism of the backward (dw's fixed-order reduction)
    x, w, dy = rnd((3 * BR + 1, 100)), rnd((100,)), rnd((3 * BR + 1, 100))
    y, _, rstd = W.forward(x, None, w, 1e-6)
    a, b = W.backward(dy, None, x, None, w, rstd), W.backward(dy, None, x, None, w, rstd)
    out["deterministic"] = {"dx": "ok" if torch.equal(a[0], b[0]) else "differ",
                            "dw": "ok" if torch.equal(a[1], b[1]) else "differ"}
    # the one-read kernels' persistent backward: 25 rows in 13 two-row tiles over 3 programs, twice
    x, w, dy = rnd((3 * BR + 1, 40)), rnd((40,)), rnd((3 * BR + 1, 40))
    y, _, rstd = W.forward(x, None, w, 1e-6)
    a, b = W.backward(dy, None, x, None, w, rstd), W.backward(dy, None, x, None, w, rstd)
    out["deterministic-rows"] = {"dx": "ok" if torch.equal(a[0], b[0]) else "differ",
                                 "dw": "ok" if torch.equal(a[1], b[1]) else "differ"}
    # which kernel family each checked feature count took: both must have run
    from harness.backends.triton import _rowplan as rowplan
    out["families"] = sorted({rowplan.plan(F, W.CONFIG).rows_kernels for F in (1, BF, BF + 1, 3 * BF + 5, 40, 70)})
    registry.discover()
    out["blocks"] = registry.get_backend("rmsnorm", "triton").blocks
    out["cpu_config"] = {k: W.CPU_CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}
    out["gpu_config"] = {k: W.GPU_CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}

    # ---- layernorm ----
    from harness.backends.triton.layernorm import wrapper as LW
    from harness.cases.layernorm import row_sum_budget
    from harness.references.layernorm import layernorm as lref
    ln = {}

    def check_ln(name, x, w, b, tol=2e-6, layouts=("contiguous", "contiguous")):
        dt = x.dtype
        dy = rnd(x.shape)
        grads = {}
        for prec in (torch.float64, torch.float32):
            leaves = [t.detach().to(prec).clone().requires_grad_() for t in (x, w, b)]
            lref(*leaves, eps=1e-5)["y"].backward(dy.to(prec))
            grads[prec] = {"y": lref(*leaves, eps=1e-5)["y"].detach(), "dx": leaves[0].grad, "dw": leaves[1].grad,
                           "db": leaves[2].grad}
        xs = place(x.detach(), layouts[0], "cpu").requires_grad_()
        ws, bs = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        y = LW.layernorm_triton(xs, ws, bs, eps=1e-5)["y"]
        y.backward(place(dy.to(dt), layouts[1], "cpu"))
        row = {}
        for n, k in (("y", y.detach()), ("dx", xs.grad), ("dw", ws.grad), ("db", bs.grad)):
            r = grads[torch.float64][n]
            if k is None or k.shape != r.shape:
                row[n] = f"shape {None if k is None else tuple(k.shape)}"
            elif k.numel() and not torch.isfinite(k).all():
                row[n] = "non-finite"
            else:
                err, lim = rel(k, r), max(tol, 3 * rel(grads[torch.float32][n], r))
                row[n] = "ok" if err <= lim else f"rel err {err:.3g} > {lim:g}"
        if xs.grad is not None and xs.grad.numel():
            # dx rows sum to 0 within the budget of the operator's invariant (cases/layernorm.py)
            s, lim = row_sum_budget(x, w, dy.to(dt), xs.grad, 1e-5)
            row["dx-row-sums"] = "ok" if bool((s.abs() <= lim).all()) else f"{float((s.abs() / lim).max()):.3g}x budget"
        ln[name] = row

    BR, BF = LW.CONFIG["BLOCK_R"], LW.CONFIG["BLOCK_F"]
    for R, F in ((3, 1), (1, BF), (BR + 1, BF + 1), (2 * BR + 1, 3 * BF + 5), (0, 7)):
        check_ln(f"R{R}-F{F}", rnd((R, F)), 1 + 0.5 * rnd((F,)), 0.5 * rnd((F,)))
    # mean >> std: the two-pass variance keeps it (a one-pass E[x^2] - E[x]^2 would not)
    # (the float32 mean at 1000 is rounded to 6e-5 of the spread, for the kernel and the float32 reference alike)
    check_ln("offset", 1000 + rnd((BR + 3, 70)), 1 + 0.5 * rnd((70,)), 0.5 * rnd((70,)), tol=1e-4)
    check_ln("views", rnd((BR + 3, 70)), 1 + 0.5 * rnd((70,)), 0.5 * rnd((70,)), layouts=("transposed", "stride:3"))
    check_ln("views2", rnd((BR + 3, 70)), 1 + 0.5 * rnd((70,)), 0.5 * rnd((70,)), layouts=("pad:3", "transposed"))
    check_ln("fp16-large", rnd((BR + 3, 70), 1e3).half(), (1 + 0.5 * rnd((70,))).half(), (0.5 * rnd((70,))).half(),
             tol=2e-3)
    check_ln("bf16", rnd((BR + 3, 70)).bfloat16(), (1 + 0.5 * rnd((70,))).bfloat16(), rnd((70,)).bfloat16(), tol=1.6e-2)
    x, w, b, dy = rnd((3 * BR + 1, 100)), rnd((100,)), rnd((100,)), rnd((3 * BR + 1, 100))
    y, mean, rstd = LW.forward(x, w, b, 1e-5)
    a, c = LW.backward(dy, x, w, b, mean, rstd), LW.backward(dy, x, w, b, mean, rstd)
    ln["deterministic"] = {n: "ok" if torch.equal(u, v) else "differ" for n, u, v in zip(("dx", "dw", "db"), a, c)}
    x, w, b, dy = rnd((3 * BR + 1, 40)), rnd((40,)), rnd((40,)), rnd((3 * BR + 1, 40))
    y, mean, rstd = LW.forward(x, w, b, 1e-5)
    a, c = LW.backward(dy, x, w, b, mean, rstd), LW.backward(dy, x, w, b, mean, rstd)
    ln["deterministic-rows"] = {n: "ok" if torch.equal(u, v) else "differ" for n, u, v in zip(("dx", "dw", "db"), a, c)}
    out["layernorm"] = ln
    out["ln_blocks"] = registry.get_backend("layernorm", "triton").blocks
    out["ln_cpu_config"] = {k: LW.CPU_CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}
    out["ln_gpu_config"] = {k: LW.GPU_CONFIG[k] for k in ("BLOCK_R", "BLOCK_F")}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def results() -> dict:
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_rmsnorm_edges_match_float64(results: dict):
    skip = ("blocks", "cpu_config", "gpu_config", "layernorm", "ln_blocks", "ln_cpu_config", "ln_gpu_config",
            "families")
    bad = {name: row for name, row in results.items()
           if name not in skip and any(v != "ok" for v in row.values())}
    assert not bad, json.dumps(bad, indent=1)
    assert any(k.endswith("-res") for k in results) and "views" in results and "fp16-large" in results
    # the one-read kernels (F <= ROW_MAX) and the looped ones were both checked (layernorm shares the plan)
    assert results["families"] == [False, True]


def test_rmsnorm_declared_blocks_are_the_launched_tiles(results: dict):
    assert results["blocks"] == results["cpu_config"]
    adapter = (ROOT / "backends" / "triton" / "rmsnorm" / "adapter.py").read_text()
    gpu = results["gpu_config"]
    assert f'{{"BLOCK_R": {gpu["BLOCK_R"]}, "BLOCK_F": {gpu["BLOCK_F"]}}}' in adapter, "adapter's GPU blocks differ"


def test_layernorm_edges_match_float64(results: dict):
    ln = results["layernorm"]
    bad = {name: row for name, row in ln.items() if any(v != "ok" for v in row.values())}
    assert not bad, json.dumps(bad, indent=1)
    assert "offset" in ln and "views" in ln and "deterministic" in ln and "deterministic-rows" in ln


def test_layernorm_declared_blocks_are_the_launched_tiles(results: dict):
    assert results["ln_blocks"] == results["ln_cpu_config"]
    adapter = (ROOT / "backends" / "triton" / "layernorm" / "adapter.py").read_text()
    gpu = results["ln_gpu_config"]
    assert f'{{"BLOCK_R": {gpu["BLOCK_R"]}, "BLOCK_F": {gpu["BLOCK_F"]}}}' in adapter, "adapter's GPU blocks differ"
