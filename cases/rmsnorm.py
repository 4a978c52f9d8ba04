"""``rmsnorm``: inputs, components, invariants, presets, strategy and bench cases (docs/specs/rmsnorm.md).

Case params: ``rows``, ``features``; ``residual`` (the fused residual-add variant: a residual input and a
``residual_out`` output); ``scale`` of x (and of the residual); ``layout`` of x and ``layout_residual``
(harness/model/inputs.py layouts), ``grad_layout`` of the upstream gradients; ``eps`` (default 1e-6);
``dtypes`` restricts a case to those dtypes (the 64-bit-offset case is bf16 only).

The Triton backend's blocks (backends/triton/rmsnorm/wrapper.py): BLOCK_F features x BLOCK_R rows, 32 x 8
under the interpreter and 512 x 16 on a GPU. The presets cross both: one feature, odd features, one block
exactly, one block + 1, several blocks with a partial last one, rows past a row tile.
"""

from __future__ import annotations

import torch
from harness.references.rmsnorm import rmsnorm
from hypothesis import strategies as st

from harness import Case, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator
from harness.model.inputs import place, randn
from harness.model.twins import adversarial, twin, with_twins

EPS = 1e-6


def C(name: str, rows: int, features: int, tags: tuple[str, ...] = (), **kw) -> Case:
    return Case(name, {"rows": rows, "features": features, **kw}, tags)


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    R, F, s = p["rows"], p["features"], p.get("scale", 1.0)
    x = place(randn((R, F), gen, dtype, scale=s), p.get("layout", "contiguous"), device)
    r = None
    if p.get("residual"):
        r = place(randn((R, F), gen, dtype, scale=s), p.get("layout_residual", "contiguous"), device)
    # weights around 1, as trained RMSNorm weights are
    w = place(randn((F,), gen, dtype, scale=0.5, mean=1.0), "contiguous", device)
    return Inputs({"x": x, "residual": r, "w": w}, {"eps": p.get("eps", EPS)})


def invariants(outputs: dict, grads: dict, inputs: Inputs, case: Case,
               grad_outputs: dict | None = None) -> list[str]:
    """With a residual, h = x + residual: dx and dresidual are one gradient (dh) and must agree bitwise."""
    dx, dr = grads.get("x"), grads.get("residual")
    if dx is None or dr is None or dx.shape != dr.shape:
        return []
    differ = (dx != dr) & ~(dx.isnan() & dr.isnan())
    if differ.any():
        i = differ.nonzero()[0].tolist()
        return [f"dx and dresidual differ at {int(differ.sum())} elements (first {i}: {dx[tuple(i)].item():.6g} vs "
                f"{dr[tuple(i)].item():.6g}); both are dL/dh of h = x + residual"]
    return []


# ---- presets -----------------------------------------------------------------------------------------

def smoke(device: str) -> list[Case]:
    # every feature of the sweep (tests/test_coverage.py) against the interpreter's 32-feature, 8-row blocks:
    # feature < / = / > BLOCK_F, row < / = / > BLOCK_R, each layout class of each tensor, the residual variant
    res = C("R9-F33-res", 9, 33, ("residual",), residual=True)
    plain = C("R3-F40", 3, 40, ("size",))
    return [
        C("R8-F32-xT-res", 8, 32, ("residual", "non-contiguous"), residual=True, layout="transposed",
          layout_residual="pad:3", grad_layout="transposed"),
        C("R5-F7-pad-gstride", 5, 7, ("non-contiguous",), layout="pad:3", grad_layout="stride:3"),
        plain, twin(plain, "stride"),
        res, twin(res, "mixed"), *adversarial(res),
    ]


def _size_tags(F: int, *more: str) -> tuple[str, ...]:
    # one feature: y = w * h / sqrt(h^2 + eps), and dx = w * dy * eps / (h^2 + eps)^1.5 is a cancellation
    return (("features1",) if F == 1 else ("size",)) + more


def _cpu_sweep() -> list[Case]:
    # interpreter blocks: BLOCK_F = 32, BLOCK_R = 8; rows of up to 64 features take the one-read kernels
    grid = [(3, 1), (1, 7), (9, 7), (8, 32), (17, 32), (3, 33), (17, 100), (16, 64), (33, 130)]
    cases = [C(f"R{R}-F{F}", R, F, _size_tags(F)) for R, F in grid]
    res = [C(f"R{R}-F{F}-res", R, F, _size_tags(F, "residual"), residual=True)
           for R, F in ((9, 1), (3, 33), (17, 100))]
    edges = [
        C("R9-F100-xT", 9, 100, ("non-contiguous",), layout="transposed"),
        C("R9-F100-pad", 9, 100, ("non-contiguous",), layout="pad:3"),
        C("R9-F70-gstride", 9, 70, ("non-contiguous",), grad_layout="stride:3"),
        C("R9-F70-gT", 9, 70, ("non-contiguous",), grad_layout="transposed"),
        C("R9-F70-res-xT-rpad", 9, 70, ("residual", "non-contiguous"), residual=True, layout="transposed",
          layout_residual="pad:5"),
        # eps dominates mean(h^2) (|x| ~ 1e-4): a kernel that drops or misplaces eps shows here
        C("R9-F70-tiny", 9, 70, ("tiny", "eps"), scale=1e-4),
        # |x| ~ 1e3: x^2 ~ 1e6 overflows 16 bits (a sum of squares kept in fp16 is inf)
        C("R9-F70-large", 9, 70, ("large",), scale=1e3),
        C("R9-F70-res-large", 9, 70, ("large", "residual"), scale=1e3, residual=True),
        C("R17-F100-eps1e-2", 17, 100, ("eps",), eps=1e-2),
    ]
    return with_twins(cases + res + edges, only=("R17-F100", "R17-F100-res"))


def _gpu_sweep() -> list[Case]:
    # GPU blocks: BLOCK_F = 512, BLOCK_R = 16; rows of up to 8192 features take the one-read kernels, wider
    # ones (8193) the looped kernels
    grid = [(3, 1), (1, 7), (17, 511), (16, 512), (17, 513), (1000, 1500), (1000, 4096), (4096, 1024),
            (33, 8192), (17, 8193)]
    cases = [C(f"R{R}-F{F}", R, F, _size_tags(F)) for R, F in grid]
    res = [C(f"R{R}-F{F}-res", R, F, _size_tags(F, "residual"), residual=True)
           for R, F in ((17, 1), (17, 513), (1000, 1500))]
    edges = [
        C("R100-F1500-xT", 100, 1500, ("non-contiguous",), layout="transposed"),
        C("R100-F1500-pad", 100, 1500, ("non-contiguous",), layout="pad:3"),
        C("R100-F1500-gT", 100, 1500, ("non-contiguous",), grad_layout="transposed"),
        C("R100-F1500-res-xT-rpad", 100, 1500, ("residual", "non-contiguous"), residual=True,
          layout="transposed", layout_residual="pad:5"),
        C("R100-F1500-tiny", 100, 1500, ("tiny", "eps"), scale=1e-4),
        C("R100-F1500-large", 100, 1500, ("large",), scale=1e3),
        C("R100-F1500-res-large", 100, 1500, ("large", "residual"), scale=1e3, residual=True),
    ]
    return with_twins(cases + res + edges, only=("R1000-F1500", "R1000-F1500-res"))


def sweep(device: str) -> list[Case]:
    return _cpu_sweep() if device == "cpu" else _gpu_sweep()


def full(device: str) -> list[Case]:
    cases = sweep(device)
    if device == "cpu":
        return cases
    for F in (4096, 8192):
        cases.append(C(f"full-R16384-F{F}", 16384, F, ("full",)))
        cases.append(C(f"full-R16384-F{F}-res", 16384, F, ("full", "residual"), residual=True))
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

    def build(R: int, F: int, residual: bool, layout: str, scale: float) -> Case:
        name = f"hyp-R{R}-F{F}{'-res' if residual else ''}-{layout.replace(':', '')}-s{scale:g}"
        # the edge tags too, so that a backend's declared gaps scope these cases as they do the sweep's
        tags = ("hypothesis",) + (("features1",) if F == 1 else ()) + \
            ({1e-4: ("tiny",), 1e3: ("large",)}.get(scale, ())) + (("residual",) if residual else ())
        return C(name, R, F, tags, residual=residual, layout=layout, scale=scale)

    return st.builds(build, R, F, st.booleans(), st.sampled_from(["contiguous", "pad:3", "transposed"]),
                     st.sampled_from([1.0, 1e-4, 1e3]))


BENCH = ("bench-R16384-F4096-res", "bench-R16384-F8192-res")


def bench_cases(device: str) -> list[Case]:
    # a transformer layer's pre-norm: residual add + RMSNorm over 16k tokens
    return [C(BENCH[0], 16384, 4096, residual=True), C(BENCH[1], 16384, 8192, residual=True),
            C("bench-R16384-F4096", 16384, 4096)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # the floor: forward reads x (and the residual) once and writes y (and residual_out); the backward reads
    # h's inputs, dy (and d residual_out) and writes dx (and dresidual)
    n = p["rows"] * p["features"]
    es = torch.empty((), dtype=dtype).element_size()
    k = 2 if p.get("residual") else 1
    fwd, bwd = 2 * k * n * es, (k + 1 + k) * n * es
    return {"fwd_bytes": fwd, "bwd_bytes": bwd, "floor_bytes": fwd + bwd, "fwd_flops": 4 * n, "bwd_flops": 8 * n}


def output_dtypes(t: dict) -> dict:
    return {"y": t["x"].dtype, "residual_out": t["x"].dtype}


SPEC = register_operator(OperatorSpec(
    name="rmsnorm",
    inputs=("x", "residual", "w"),
    differentiable=("x", "residual", "w"),
    outputs=("y", "residual_out"),
    graded_outputs=("y", "residual_out"),
    reference=rmsnorm,
    make_inputs=make_inputs,
    output_dtypes=output_dtypes,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="x",
    dims={"x": ("row", "feature"), "residual": ("row", "feature"), "w": ("feature",),
          "y": ("row", "feature"), "residual_out": ("row", "feature")},
    # errors along the features are grouped per kernel block, along the rows per row tile
    dim_blocks={"row": "BLOCK_R", "feature": "BLOCK_F"},
    # rows are independent: the oracle of a large case row chunk by row chunk (dw a partial sum)
    separable=Separable((SplitAxis("row", {"x": 0, "residual": 0, "y": 0, "residual_out": 0}),)),
    invariants=invariants,
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    perf_targets=tuple(
        # issue 47: forward + backward no slower than torch.compile of the eager backend
        PerfTarget("triton", "fwd_bwd_ms", 1.0, versus="torch-compile", case=c, label="fwd+bwd / torch.compile")
        for c in BENCH
    ),
    doc="RMSNorm over the last dimension, optionally fused with a residual add (specs/rmsnorm.md)",
))
