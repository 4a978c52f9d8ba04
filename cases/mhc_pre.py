"""``mhc_pre``: inputs, components, presets and strategies (specs/mhc_pre.md)."""

from __future__ import annotations

import torch
from harness.references.mhc_pre import mhc_pre
from hypothesis import strategies as st

from harness import Axis, Case, Component, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator
from harness.model.inputs import place, randn, uniform
from harness.model.twins import adversarial, twin, with_twins

OPTIONS = {"norm_eps": 1e-6, "hc_eps": 1e-6, "post_mult": 2.0}


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    B, S, n, D = p["B"], p["S"], p["n"], p["D"]
    M, nD = n * n + 2 * n, n * D
    init = p.get("init", "realistic")
    # a slight per-stream scale, as in DeepSeek's tests
    stream_scale = 1.0 + 0.1 * torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    x = (randn((B, S, n, D), gen) * stream_scale).to(dtype)
    phi_scale = 1.0 if init == "saturating" else nD ** -0.5
    phi = randn((M, nD), gen, scale=phi_scale)
    alpha = torch.full((3,), 0.01) if init == "paper" else uniform((3,), gen, 0.5, 1.5)
    bias = randn((M,), gen, scale=0.5)
    gamma = None if p.get("gamma", True) is False else randn((nD,), gen, scale=0.1, mean=1.0)
    tensors = {"x": place(x, p.get("layout", "contiguous"), device), "phi": phi.to(device),
               "alpha": alpha.to(device), "bias": bias.to(device),
               "gamma": None if gamma is None else gamma.to(device)}
    return Inputs(tensors, dict(OPTIONS))


def output_dtypes(t: dict) -> dict:
    return {"h_in": t["x"].dtype, "h_post": torch.float32, "h_res": torch.float32}


def _tok(t: torch.Tensor, last: int) -> torch.Tensor:
    return t.reshape(-1, last)


TOKEN = Axis("token", 0, block="BLOCK_T", default_block=64)
ND = Axis("nD", 1, block="BLOCK_ND", default_block=256)
STREAM = Axis("stream", 1, group_param="D")


def _rows(lo: str, hi: str):
    def view(t: torch.Tensor, p: dict) -> torch.Tensor:
        n = p["n"]
        bounds = {"0": 0, "n": n, "2n": 2 * n, "M": n * n + 2 * n}
        return t[bounds[lo]:bounds[hi]]
    return view


COMPONENTS = (
    Component("h_in", "out:h_in", lambda t, p: _tok(t, p["D"]), (TOKEN, Axis("feature", 1))),
    Component("h_post", "out:h_post", lambda t, p: _tok(t, p["n"]), (TOKEN, Axis("stream", 1))),
    Component("h_res", "out:h_res", lambda t, p: _tok(t, p["n"] ** 2), (TOKEN, Axis("entry", 1))),
    Component("dx", "grad:x", lambda t, p: _tok(t, p["n"] * p["D"]), (TOKEN, ND, STREAM)),
    Component("dphi.pre", "grad:phi", _rows("0", "n"), (Axis("row", 0), ND)),
    Component("dphi.post", "grad:phi", _rows("n", "2n"), (Axis("row", 0), ND)),
    Component("dphi.res", "grad:phi", _rows("2n", "M"), (Axis("row", 0), ND)),
    Component("dalpha.pre", "grad:alpha", lambda t, p: t[0:1]),
    Component("dalpha.post", "grad:alpha", lambda t, p: t[1:2]),
    Component("dalpha.res", "grad:alpha", lambda t, p: t[2:3]),
    Component("dbias.pre", "grad:bias", _rows("0", "n"), (Axis("row", 0),)),
    Component("dbias.post", "grad:bias", _rows("n", "2n"), (Axis("row", 0),)),
    Component("dbias.res", "grad:bias", _rows("2n", "M"), (Axis("row", 0),)),
    Component("dgamma", "grad:gamma", None, (Axis("nD", 0, block="BLOCK_ND", default_block=256),
                                              Axis("stream", 0, group_param="D"))),
)


def C(name: str, B: int, S: int, n: int, D: int, tags: tuple[str, ...] = (), **kw) -> Case:
    return Case(name, {"B": B, "S": S, "n": n, "D": D, **kw}, tags)


def smoke(device: str) -> list[Case]:
    return [
        C("tiny-n2", 1, 3, 2, 7, ("odd-sizes",)),
        C("n4-xT-gradpad", 2, 5, 4, 40, ("non-contiguous", "nD>BLOCK"),
          layout="perm:0,2,1,3", grad_layout="pad"),
        C("n3-nogamma-paper", 1, 4, 3, 9, ("gamma-absent", "paper-init"), gamma=False, init="paper"),
        # what the sweep has besides (tests/test_coverage.py): T = BLOCK_T and T beyond it, padded x and
        # transposed upstream gradients, and a layout twin (interpreter: BLOCK_T = 16)
        C("T16-xpad-gradT", 2, 8, 2, 24, ("non-contiguous",), layout="pad", grad_layout="perm:1,0,2"),
        twin(C("n2-D24-T17", 1, 17, 2, 24), "mixed"), *adversarial(C("n2-D24-T17", 1, 17, 2, 24)),
    ]


def _n_range(D: int) -> tuple[str, ...]:
    # one feature per stream: the rms normalization's gradient is exactly 0, dx a difference of equal terms
    return ("n-range", "features1") if D == 1 else ("n-range",)


def sweep(device: str) -> list[Case]:
    if device == "cpu":
        cases = [C(f"n{n}-D{D}-T{S}", 1, S, n, D, _n_range(D)) for n, D, S in
                 [(1, 1, 1), (2, 7, 3), (3, 33, 5), (4, 100, 3), (5, 13, 7), (6, 21, 2), (7, 5, 3), (8, 17, 4)]]
        cases += [
            C("nD>1024-odd", 1, 3, 4, 301, ("nD>BLOCK", "not-divisible")),
            C("nD>2BLOCK-T64", 1, 64, 2, 777, ("nD>BLOCK", "token-blocks")),
            C("T127-xT", 1, 127, 4, 32, ("non-contiguous", "odd-T"), layout="perm:0,2,1,3"),
            C("xpad-gradT", 2, 3, 4, 50, ("non-contiguous",), layout="pad", grad_layout="perm:1,0,2"),
            C("saturating", 1, 16, 4, 64, ("saturating",), init="saturating"),
            C("paper-alpha", 1, 16, 4, 64, ("paper-init",), init="paper"),
            C("no-gamma", 1, 8, 4, 40, ("gamma-absent",), gamma=False),
        ]
        return with_twins(cases, only=("n4-D100-T3", "xpad-gradT", "no-gamma"))
    cases = [C(f"n{n}-D{D}-T{S}", 1, S, n, D, _n_range(D)) for n, D, S in
             [(1, 1, 1), (2, 7, 3), (4, 32, 64), (6, 100, 127), (8, 128, 64), (4, 1000, 127)]]
    cases += [
        C("n4-D1280-T4097", 1, 4097, 4, 1280, ("nD>BLOCK", "odd-T")),
        C("n4-D4096-T4097", 1, 4097, 4, 4096, ("production",)),
        C("n4-D7168-T1024", 2, 512, 4, 7168, ("production", "batch")),
        C("n8-D1000-T127", 1, 127, 8, 1000, ("nD>BLOCK", "not-divisible")),
        C("xT-n4-D4096", 2, 257, 4, 4096, ("non-contiguous",), layout="perm:0,2,1,3", grad_layout="pad"),
        C("xpad-n6-D1280", 1, 300, 6, 1280, ("non-contiguous",), layout="pad", grad_layout="perm:1,0,2"),
        C("saturating", 1, 1024, 4, 4096, ("saturating",), init="saturating"),
        C("paper-alpha", 1, 1024, 4, 4096, ("paper-init",), init="paper"),
        C("no-gamma", 1, 512, 4, 1280, ("gamma-absent",), gamma=False),
    ]
    return with_twins(cases, only=("n4-D32-T64", "n8-D1000-T127", "no-gamma"))


def full(device: str) -> list[Case]:
    cases = sweep(device)
    for n in (1, 2, 4, 6, 8):
        for D in (7, 128, 1000, 4096, 7168):
            for S in (1, 4097, 16384):
                if n * D * S <= 4 * 7168 * 16384:
                    cases.append(C(f"full-n{n}-D{D}-T{S}", 1, S, n, D, ("full",)))
    # x's last token starts at (T-1)*n*D = 2^31: a 32-bit token offset overflows there (4.3 GB of bf16 x)
    cases.append(C("T65537-n4-D8192-int64", 1, 65537, 4, 8192, ("64-bit-offsets",), dtypes=["bfloat16"]))
    return cases


def bench_cases(device: str) -> list[Case]:
    return [C("bench-T16384-n4-D4096", 1, 16384, 4, 4096), C("bench-T16384-n4-D7168", 1, 16384, 4, 7168)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    T, n, D = p["B"] * p["S"], p["n"], p["D"]
    es = torch.empty((), dtype=dtype).element_size()
    M = n * n + 2 * n
    fwd = T * n * D * es + T * D * es + T * (M + n) * 4
    bwd = 2 * T * n * D * es + T * D * es + T * (M + n) * 4
    return {"fwd_bytes": fwd, "bwd_bytes": bwd, "fwd_flops": 2 * T * n * D * M, "bwd_flops": 4 * T * n * D * M}


def strategy(device: str):
    # Biased toward block boundaries: nD = k*BLOCK +- 1 for the usual power-of-two blocks.
    boundary = st.sampled_from([63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025])
    n = st.integers(1, 8)

    def build(n: int, nd: int, S: int, layout: str) -> Case:
        D = max(1, nd // n)
        return C(f"hyp-n{n}-D{D}-S{S}-{layout.replace(':', '')}", 1, S, n, D, ("hypothesis",), layout=layout)

    return st.builds(build, n, boundary, st.integers(1, 70),
                     st.sampled_from(["contiguous", "perm:0,2,1,3", "pad"]))


SPEC = register_operator(OperatorSpec(
    name="mhc_pre",
    aliases=("mhc",),
    inputs=("x", "phi", "alpha", "bias", "gamma"),
    differentiable=("x", "phi", "alpha", "bias", "gamma"),
    outputs=("h_in", "h_post", "h_res"),
    graded_outputs=("h_in", "h_post", "h_res"),
    reference=mhc_pre,
    make_inputs=make_inputs,
    output_dtypes=output_dtypes,
    components=COMPONENTS,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="x",
    # tokens (B x S) are independent; dphi, dalpha, dbias and dgamma are sums over them
    separable=Separable((SplitAxis("batch", {"x": 0, "h_in": 0, "h_post": 0, "h_res": 0}),
                         SplitAxis("token", {"x": 1, "h_in": 1, "h_post": 1, "h_res": 1}))),
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    # issue 3: bf16 at T=16384, n=4, D=4096 and 7168; issue 27: the one-read forward of the cuda backend
    perf_targets=(PerfTarget("triton", "fwd_bw_frac", 0.60, "min", label="fwd, fraction of copy bandwidth"),
                  PerfTarget("triton", "bwd_bw_frac", 0.50, "min", label="bwd, fraction of copy bandwidth"),
                  PerfTarget("triton", "speedup_fwd_bwd", 10.0, "min", label="fwd+bwd speedup over golden"),
                  PerfTarget("cuda", "fwd_bw_frac", 0.70, "min", label="fwd, fraction of copy bandwidth"),
                  PerfTarget("cuda", "fwd_bwd_bw_frac", 0.55, "min", label="fwd+bwd, fraction of copy bandwidth")),
    baseline="golden",
    doc="mHC pre-mix: h_in, h_post, h_res from n residual streams (specs/mhc_pre.md)",
))
