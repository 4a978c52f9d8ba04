"""``layernorm``: inputs, components, invariants, presets, strategy and bench cases (docs/specs/layernorm.md).

Case params: ``rows``, ``features``; ``scale`` and ``offset`` of x (x = offset + scale * N(0, 1)); ``layout``
of x (harness/model/inputs.py layouts), ``grad_layout`` of the upstream gradient; ``eps`` (default 1e-5); ``dtypes``
restricts a case to those dtypes (the 64-bit-offset case is bf16 only).

The Triton backend's blocks (backends/triton/layernorm/wrapper.py): BLOCK_F features x BLOCK_R rows, 32 x 8
under the interpreter and 512 x 16 on a GPU. The presets cross both: one feature, odd features, one block
exactly, one block + 1, several blocks with a partial last one, rows past a row tile.
"""

from __future__ import annotations

import torch
from harness.references.layernorm import layernorm
from hypothesis import strategies as st

from harness import Case, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator
from harness.model.inputs import place, randn
from harness.model.twins import adversarial, twin, with_twins

EPS = 1e-5


def C(name: str, rows: int, features: int, tags: tuple[str, ...] = (), **kw) -> Case:
    return Case(name, {"rows": rows, "features": features, **kw}, tags)


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    R, F = p["rows"], p["features"]
    x = place(randn((R, F), gen, dtype, scale=p.get("scale", 1.0), mean=p.get("offset", 0.0)),
              p.get("layout", "contiguous"), device)
    w = place(randn((F,), gen, dtype, scale=0.5, mean=1.0), "contiguous", device)
    b = place(randn((F,), gen, dtype, scale=0.5), "contiguous", device)
    return Inputs({"x": x, "w": w, "b": b}, {"eps": p.get("eps", EPS)})


# ---- invariants ------------------------------------------------------------------------------------

def row_sum_budget(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, eps: float,
                   chunk_elems: int = 2 ** 24) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_j dx_ij, its budget) per row, in float64.

    Exactly, sum_j dx_ij = -rstd * sum_j xhat_j * mean(g xhat) = 0 (g = dy * w). A float32 kernel misses 0 by
    (a) rounding each dx to its dtype: eps_out / 2 * sum_j |dx_ij|; (b) its float32 arithmetic on each term of
    dx_j = rstd (g_j - mean g - xhat_j mean(g xhat)): a few eps32 * rstd * (|g_j| + |mean g| + |xhat_j m2|);
    (c) its float32 mean, off by up to F eps32 mean|x| (a sequential sum), which leaves sum_j xhat_j =
    F rstd (mean - mean32) != 0. The budget is the sum of the three, with 4 eps32 for (b), times 2.
    """
    e32 = torch.finfo(torch.float32).eps
    e_out = torch.finfo(dx.dtype).eps / 2
    F = x.shape[1]
    sums, budgets = [], []
    step = max(1, chunk_elems // max(1, F))
    wd = w.to(dx.device, torch.float64)
    for i in range(0, x.shape[0], step):
        xd = x[i:i + step].to(dx.device, torch.float64)
        g = dy[i:i + step].to(torch.float64) * wd
        d = dx[i:i + step].to(torch.float64)
        xc = xd - xd.mean(1, keepdim=True)
        rstd = torch.rsqrt(xc.pow(2).mean(1, keepdim=True) + eps)
        xhat = xc * rstd
        mg, m2 = g.mean(1, keepdim=True), (g * xhat).mean(1, keepdim=True)
        a = e_out * d.abs().sum(1)
        b_ = 4 * e32 * rstd.squeeze(1) * (g.abs() + mg.abs() + (xhat * m2).abs()).sum(1)
        c = F * e32 * xd.abs().mean(1) * F * rstd.squeeze(1) ** 2 * m2.abs().squeeze(1)
        sums.append(d.sum(1))
        budgets.append(2 * (a + b_ + c))
    return torch.cat(sums), torch.cat(budgets)


def invariants(outputs: dict, grads: dict, inputs: Inputs, case: Case,
               grad_outputs: dict | None = None) -> list[str]:
    """Each row of dx sums to 0, within the rounding budget of ``row_sum_budget`` (needs the upstream gradient)."""
    dx = grads.get("x")
    if dx is None or grad_outputs is None or "y" not in grad_outputs or dx.numel() == 0:
        return []
    if not torch.isfinite(dx).all():
        return []  # the verdict names non-finite values
    got, tol = row_sum_budget(inputs.tensors["x"], inputs.tensors["w"], grad_outputs["y"].to(dx.device), dx,
                              inputs.options["eps"])
    off = got.abs() > tol
    if off.any():
        i = int((got.abs() / tol.clamp_min(1e-300)).argmax())
        return [f"dx: {int(off.sum())} of {dx.shape[0]} rows do not sum to 0; worst row {i}: sum {got[i].item():.6g}, "
                f"budget {tol[i].item():.3g}"]
    return []


# ---- presets -----------------------------------------------------------------------------------------

def _size_tags(F: int) -> tuple[str, ...]:
    # one feature: x - mean = 0, y = b exactly, dx = 0 and dw = 0
    return ("features1",) if F == 1 else ("size",)


def smoke(device: str) -> list[Case]:
    # every feature of the sweep (tests/test_coverage.py) against the interpreter's 32-feature, 8-row blocks:
    # feature < / = / > BLOCK_F, row < / = / > BLOCK_R, each layout class of each tensor
    plain = C("R9-F33", 9, 33, ("size",))
    return [
        C("R8-F32-xT-gT", 8, 32, ("non-contiguous",), layout="transposed", grad_layout="transposed"),
        C("R5-F7-pad-gstride", 5, 7, ("non-contiguous",), layout="pad:3", grad_layout="stride:3"),
        C("R3-F40-offset", 3, 40, ("offset",), offset=100.0),
        plain, twin(plain, "stride"), twin(plain, "mixed"), *adversarial(plain),
    ]


def _cpu_sweep() -> list[Case]:
    # interpreter blocks: BLOCK_F = 32, BLOCK_R = 8; rows of up to 64 features take the one-read kernels
    grid = [(3, 1), (1, 7), (9, 7), (8, 32), (17, 32), (3, 33), (17, 100), (16, 64), (33, 130)]
    cases = [C(f"R{R}-F{F}", R, F, _size_tags(F)) for R, F in grid]
    edges = [
        C("R9-F100-xT", 9, 100, ("non-contiguous",), layout="transposed"),
        C("R9-F100-pad", 9, 100, ("non-contiguous",), layout="pad:3"),
        C("R9-F70-gstride", 9, 70, ("non-contiguous",), grad_layout="stride:3"),
        C("R9-F70-gT", 9, 70, ("non-contiguous",), grad_layout="transposed"),
        # mean >> std: a one-pass variance (E[x^2] - E[x]^2) cancels
        C("R9-F70-offset", 9, 70, ("offset",), offset=100.0),
        C("R17-F100-offset", 17, 100, ("offset",), offset=1000.0, scale=10.0),
        # eps dominates the variance (|x| ~ 1e-4): a kernel that drops or misplaces eps shows here
        C("R9-F70-tiny", 9, 70, ("tiny", "eps"), scale=1e-4),
        # |x| ~ 1e3: (x - mean)^2 ~ 1e6 overflows 16 bits
        C("R9-F70-large", 9, 70, ("large",), scale=1e3),
        C("R17-F100-eps1e-2", 17, 100, ("eps",), eps=1e-2),
    ]
    return with_twins(cases + edges, only=("R17-F100",))


def _gpu_sweep() -> list[Case]:
    # GPU blocks: BLOCK_F = 512, BLOCK_R = 16; rows of up to 8192 features take the one-read kernels, wider
    # ones (8193) the looped kernels
    grid = [(3, 1), (1, 7), (17, 511), (16, 512), (17, 513), (1000, 1500), (1000, 4096), (4096, 1024),
            (33, 8192), (17, 8193)]
    cases = [C(f"R{R}-F{F}", R, F, _size_tags(F)) for R, F in grid]
    edges = [
        C("R100-F1500-xT", 100, 1500, ("non-contiguous",), layout="transposed"),
        C("R100-F1500-pad", 100, 1500, ("non-contiguous",), layout="pad:3"),
        C("R100-F1500-gT", 100, 1500, ("non-contiguous",), grad_layout="transposed"),
        C("R100-F1500-offset", 100, 1500, ("offset",), offset=100.0),
        C("R100-F1500-tiny", 100, 1500, ("tiny", "eps"), scale=1e-4),
        C("R100-F1500-large", 100, 1500, ("large",), scale=1e3),
    ]
    return with_twins(cases + edges, only=("R1000-F1500",))


def sweep(device: str) -> list[Case]:
    return _cpu_sweep() if device == "cpu" else _gpu_sweep()


def full(device: str) -> list[Case]:
    cases = sweep(device)
    if device == "cpu":
        return cases
    for F in (4096, 8192):
        cases.append(C(f"full-R16384-F{F}", 16384, F, ("full",)))
    # the last row starts at (R-1)*F = 2,147,491,840 > 2^31 - 1 (bf16 only: 4.3 GB of x; the oracle runs
    # row chunk by row chunk, docs/design.md "64-bit offsets")
    cases.append(C("R262145-F8192-int64", 262145, 8192, ("64-bit-offsets",), dtypes=["bfloat16"]))
    return cases


# ---- strategy, bench ---------------------------------------------------------------------------------

def strategy(device: str):
    # biased to the block edges of both configurations (32/8 interpreted, 512/16 on a GPU)
    # and the one-read kernels' limits (64 interpreted, 8192 on a GPU: backends/triton/_rowplan.py)
    F = st.one_of(st.sampled_from([1, 31, 32, 33, 64, 65, 511, 512, 513] + ([] if device == "cpu" else [8192, 8193])),
                  st.integers(1, 300 if device == "cpu" else 5000))
    R = st.integers(1, 20 if device == "cpu" else 2000)

    def build(R: int, F: int, layout: str, scale: float, offset: float) -> Case:
        name = f"hyp-R{R}-F{F}-{layout.replace(':', '')}-s{scale:g}-o{offset:g}"
        # the edge tags too, so that a backend's declared gaps scope these cases as they do the sweep's
        tags = ("hypothesis",) + (("features1",) if F == 1 else ()) + \
            ({1e-4: ("tiny",), 1e3: ("large",)}.get(scale, ())) + (("offset",) if offset else ())
        return C(name, R, F, tags, layout=layout, scale=scale, offset=offset)

    return st.builds(build, R, F, st.sampled_from(["contiguous", "pad:3", "transposed"]),
                     st.sampled_from([1.0, 1e-4, 1e3]), st.sampled_from([0.0, 100.0]))


BENCH = ("bench-R16384-F4096", "bench-R16384-F8192")


def bench_cases(device: str) -> list[Case]:
    return [C(BENCH[0], 16384, 4096), C(BENCH[1], 16384, 8192)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # the floor: forward reads x once and writes y; the backward reads x and dy and writes dx
    n = p["rows"] * p["features"]
    es = torch.empty((), dtype=dtype).element_size()
    return {"fwd_bytes": 2 * n * es, "bwd_bytes": 3 * n * es, "floor_bytes": 5 * n * es,
            "fwd_flops": 7 * n, "bwd_flops": 11 * n}


SPEC = register_operator(OperatorSpec(
    name="layernorm",
    inputs=("x", "w", "b"),
    differentiable=("x", "w", "b"),
    outputs=("y",),
    graded_outputs=("y",),
    reference=layernorm,
    make_inputs=make_inputs,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="x",
    dims={"x": ("row", "feature"), "w": ("feature",), "b": ("feature",), "y": ("row", "feature")},
    # errors along the features are grouped per kernel block, along the rows per row tile
    dim_blocks={"row": "BLOCK_R", "feature": "BLOCK_F"},
    # rows are independent: the oracle of a large case row chunk by row chunk (dw, db partial sums)
    separable=Separable((SplitAxis("row", {"x": 0, "y": 0}),)),
    invariants=invariants,
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    perf_targets=tuple(
        # issue 47: forward + backward no slower than torch.compile of the eager backend
        PerfTarget("triton", "fwd_bwd_ms", 1.0, versus="torch-compile", case=c, label="fwd+bwd / torch.compile")
        for c in BENCH
    ),
    doc="LayerNorm over the last dimension with weight and bias (specs/layernorm.md)",
))
