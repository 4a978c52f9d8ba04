"""``softmax_xent``: inputs, components, invariants, presets and strategies (specs/xent.md).

Case params: N, V; ``scale`` of the logits; ``confident`` (fraction of rows whose target logit is
raised by 30, so p_y -> 1); ``extreme`` (entries at +-1e4 in every row); ``ignored`` (fraction of
ignored targets); the loss options ``reduction``, ``label_smoothing``, ``z_loss``, ``ignore_index``,
``normalizer``; ``layout`` of the logits (``pad``: row stride > V); ``dtypes`` restricts the case to
those dtypes (the 64-bit-offset case is bf16 only).
"""

from __future__ import annotations

import torch
from harness.references.softmax_xent import softmax_xent
from hypothesis import strategies as st

from harness import (
    Axis,
    Case,
    Component,
    Inputs,
    MicrobatchSpec,
    OperatorSpec,
    PerfTarget,
    Separable,
    SplitAxis,
    register_operator,
)
from harness.model.inputs import place, randn
from harness.model.twins import adversarial, twin, with_twins

CONFIDENT_MARGIN = 30.0
EXTREME = 1e4


# ---- inputs shared with cases/fused_linear_xent.py -------------------------------------------------

def bounds(N: int, k: int) -> list[int]:
    """Microbatch boundaries with sizes in the ratio 1 : 2 : ... : k (unequal on purpose)."""
    w = [i + 1 for i in range(k)]
    cut = [0] + [round(N * sum(w[: i + 1]) / sum(w)) for i in range(k)]
    return [max(c, i) for i, c in enumerate(cut[:-1])] + [N]


def make_targets(case: Case, N: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """Targets in [0, V) with an exact count of ignored tokens (never ``ignore_index`` by accident).

    Microbatch cases ignore half of the first microbatch and a tenth of the others, so the parts
    have unequal valid-token counts and a per-microbatch mean differs from the global one.
    """
    p = case.params
    ii = p.get("ignore_index", -100)
    t = torch.randint(0, V, (N,), generator=gen)
    if 0 <= ii < V:
        t = torch.where(t == ii, (t + 1) % V, t)
    if case.microbatches > 1:
        cut = bounds(N, case.microbatches)
        for j in range(case.microbatches):
            lo, hi = cut[j], cut[j + 1]
            frac = 0.5 if j == 0 else 0.1
            t[lo + torch.randperm(hi - lo, generator=gen)[: round(frac * (hi - lo))]] = ii
        return t
    n_ign = round(p.get("ignored", 0.0) * N)
    t[torch.randperm(N, generator=gen)[:n_ign]] = ii
    return t


def loss_options(p: dict) -> dict:
    """Every loss option, always passed (normalizer None unless the case sets one)."""
    return {"ignore_index": p.get("ignore_index", -100), "reduction": p.get("reduction", "mean"),
            "label_smoothing": p.get("label_smoothing", 0.0), "z_loss": p.get("z_loss", 0.0),
            "normalizer": p.get("normalizer")}


def split_tokens(token_inputs: tuple[str, ...]):
    """MicrobatchSpec.split: token tensors sliced at ``bounds``, shared ones passed whole, global mean."""
    def split(inputs: Inputs, k: int, gen: torch.Generator) -> list[Inputs]:
        t = inputs.tensors["targets"]
        opts = inputs.options
        n_valid = int((t != opts["ignore_index"]).sum())
        if n_valid == 0:
            raise ValueError("microbatch case with no valid token: the global mean is undefined")
        cut = bounds(t.shape[0], k)
        out = []
        for j in range(k):
            s = slice(cut[j], cut[j + 1])
            tens = {n: (v[s] if n in token_inputs and v is not None else v)
                    for n, v in inputs.tensors.items()}
            out.append(Inputs(tens, {**opts, "reduction": "mean", "normalizer": float(n_valid)}))
        return out
    return split


def naive_options(opts: dict) -> dict:
    # the classic mistake: each microbatch divides by its own valid-token count
    return {**opts, "normalizer": None}


# ---- invariants ------------------------------------------------------------------------------------

def token_weights(targets: torch.Tensor, opts: dict, g: torch.Tensor) -> torch.Tensor:
    """c_i = mu_i * g_i / D in float64: the loss path's factor of row i's logit gradient."""
    mu = (targets != opts["ignore_index"]).to(torch.float64)
    g = g.detach().to(torch.float64)
    if opts["reduction"] == "none":
        return mu * g
    if opts["reduction"] == "sum":
        return mu * g
    D = float(mu.sum()) if opts.get("normalizer") is None else float(opts["normalizer"])
    return mu * (g / D) if D != 0 else torch.zeros_like(mu)


def row_sum_budget(c: torch.Tensor, lse: torch.Tensor, zmax: torch.Tensor, V: int,
                   H_term: torch.Tensor | float, lam: float, out_dtype: torch.dtype,
                   per_element_rounding: bool) -> torch.Tensor:
    """Bound on |sum_j dZ_ij - c_i * 2*lam*LSE_i| for a correct float32-accumulating kernel.

    The terms of row i have magnitude |c_i| (A_i + 1) with A_i = 1 + 2*lam*|LSE_i|. Budget: rounding
    of each term (the output dtype's unit roundoff when dZ is stored per element, plus float32 work);
    the softmax's mass error, |c_i| A_i eps32 (V + 2 max|z_i| + 2 |LSE_i| + H_term): a float32 sum of
    V exponentials (worst case V roundings), exp(z - lse) with the argument rounded at the magnitude
    of z and LSE, and logits recomputed in another order (H_term); plus half a subnormal spacing per
    element (fp16 gradients of a long mean underflow). Everything doubled as a margin.
    """
    e32 = torch.finfo(torch.float32).eps
    fo = torch.finfo(out_dtype)
    u_out = fo.eps / 2 if per_element_rounding else 0.0
    A = 1.0 + 2.0 * lam * lse.abs()
    soft = A * e32 * (V + 2.0 * zmax + 2.0 * lse.abs() + H_term)
    half_sub = fo.smallest_normal * fo.eps / 2 if per_element_rounding else 0.0
    return 2.0 * c.abs() * ((A + 1.0) * (u_out + 2 * e32) + soft) + V * half_sub


def row_stats(z: torch.Tensor, dz: torch.Tensor | None = None,
              chunk_elems: int = 2 ** 26) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """LSE_i, max_j |z_ij| and sum_j dZ_ij in float64, in row chunks (N*V reaches 2^31 on the GPU)."""
    step = max(1, chunk_elems // max(1, z.shape[1]))
    lse, zmax, sums = [], [], []
    device = dz.device if dz is not None else z.device  # z may wait on the host (a large case's draw)
    for i in range(0, z.shape[0], step):
        zc = z[i:i + step].to(device, torch.float64)
        lse.append(torch.logsumexp(zc, dim=1))
        zmax.append(zc.abs().amax(dim=1))
        if dz is not None:
            sums.append(dz[i:i + step].to(torch.float64).sum(dim=1))
    return torch.cat(lse), torch.cat(zmax), (torch.cat(sums) if dz is not None else None)


def invariants(outputs: dict, grads: dict, inputs: Inputs, case: Case,
               grad_outputs: dict | None = None) -> list[str]:
    """Ignored rows of dlogits exactly zero; each valid row sums to c_i * 2*lam*LSE_i (specs/xent.md).

    The row-sum check needs the upstream gradient (``grad_outputs``); without it only the exact
    zeros and finiteness are checked.
    """
    dz = grads.get("logits")
    if dz is None:
        return []
    opts = inputs.options
    t = inputs.tensors["targets"].to(dz.device)
    valid = t != opts["ignore_index"]
    fails = []
    # per row, in row chunks: a [N, V] mask or copy would be the size of dlogits again (N*V reaches 2^31)
    step = max(1, 2 ** 26 // max(1, dz.shape[1]))
    nonfinite = torch.cat([(~torch.isfinite(dz[i:i + step])).any(dim=1) for i in range(0, dz.shape[0], step)]) & valid
    if nonfinite.any():
        fails.append(f"dlogits: non-finite values in {int(nonfinite.sum())} valid rows")
    bad = torch.cat([(dz[i:i + step] != 0).any(dim=1) for i in range(0, dz.shape[0], step)]) & ~valid
    if bad.any():
        rows = bad.nonzero().squeeze(1)[:8].tolist()
        fails.append(f"dlogits: {int(bad.sum())} ignored rows are not exactly zero (rows {rows}...)")
    if grad_outputs is None or "loss" not in grad_outputs or fails:
        return fails
    z = inputs.tensors["logits"]  # where it is: row_stats moves each chunk
    lse, zmax, got = row_stats(z, dz)
    lam = float(opts["z_loss"])
    c = token_weights(t, opts, grad_outputs["loss"].to(dz.device).expand(t.shape))
    want = c * 2.0 * lam * lse
    tol = row_sum_budget(c, lse, zmax, z.shape[1], 0.0, lam, dz.dtype, True)
    off = ((got - want).abs() > tol) & valid
    if off.any():
        i = int(((got - want).abs() / tol.clamp_min(1e-300)).argmax())
        fails.append(f"dlogits: {int(off.sum())} valid rows do not sum to (g/D)*2*z_loss*LSE; worst row {i}: "
                     f"sum {got[i].item():.6g}, expected {want[i].item():.6g}, budget {tol[i].item():.3g}")
    return fails


# ---- the operator ------------------------------------------------------------------------------------

def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    N, V = p["N"], p["V"]
    t = make_targets(case, N, V, gen)
    z = randn((N, V), gen, scale=p.get("scale", 1.0))
    if p.get("confident"):
        rows = torch.randperm(N, generator=gen)[: max(1, round(p["confident"] * N))]
        z[rows, t[rows].clamp(0, V - 1)] += CONFIDENT_MARGIN
    if p.get("extreme"):
        # a few entries per row at +-1e4: exp without the max subtracted overflows
        k = max(1, V // 8)
        cols = torch.rand((N, V), generator=gen).argsort(dim=1)[:, :k]
        sign = torch.randint(0, 2, (N, k), generator=gen).to(torch.float32) * 2 - 1
        z.scatter_(1, cols, sign * EXTREME)
    return Inputs({"logits": place(z.to(dtype), p.get("layout", "contiguous"), device),
                   "targets": t.to(device)}, loss_options(p))


def output_dtypes(t: dict) -> dict:
    return {"loss": torch.float32}


ROW = Axis("row", 0)
COMPONENTS = (
    # a scalar for mean/sum, [N] for none: viewed 1-D so one axis fits every case
    Component("loss", "out:loss", lambda t, p: t.reshape(-1), (ROW,)),
    Component("dlogits", "grad:logits", None, (ROW, Axis("vocab", 1, block="BLOCK_V", default_block=1024))),
)


def C(name: str, N: int, V: int, tags: tuple[str, ...] = (), microbatches: int = 0, **kw) -> Case:
    return Case(name, {"N": N, "V": V, **kw}, tags, microbatches)


def smoke(device: str) -> list[Case]:
    none = C("N4-V1025-zloss-none", 4, 1025, ("V>1024", "z-loss", "none"), ignored=0.2, z_loss=1e-2,
             reduction="none")
    return [
        C("N3-V2", 3, 2, ("tiny",), ignored=0.2),
        C("N5-V31-pad-ls", 5, 31, ("non-contiguous", "smoothing"), layout="pad", ignored=0.2,
          label_smoothing=0.1),
        none,
        # loss.backward(): an upstream gradient of exactly 1, a path kernels may special-case
        C("N6-V1025-ones", 6, 1025, ("V>1024", "grad-ones"), ignored=0.2, grad_ones=True),
        # what the sweep has besides (tests/test_coverage.py): each reduction, ignore_index 0, a global
        # normalizer, microbatches, and a layout twin (logits and the loss gradient with their own strides)
        C("N8-V31-sum-ignore-index0", 8, 31, ("reduction", "ignored"), ignored=0.2, reduction="sum",
          ignore_index=0),
        C("N8-V31-normalizer", 8, 31, ("normalizer",), ignored=0.2, normalizer=25.0),
        C("N8-V31-microbatch2", 8, 31, ("microbatch",), microbatches=2),
        C("N4-V100-confident-none", 4, 100, ("confident", "reduction"), confident=1.0, reduction="none"),
        twin(none, "mixed"), *adversarial(none),
    ]


def _edge_cases(N: int, V: int) -> list[Case]:
    """Every edge class of the spec at one (N, V)."""
    s = f"N{N}-V{V}"
    return [
        C(f"{s}-scale10", N, V, ("scale",), scale=10.0, ignored=0.2),
        C(f"{s}-confident", N, V, ("confident",), confident=0.5, ignored=0.2),
        C(f"{s}-confident-ls", N, V, ("confident", "smoothing"), confident=1.0, label_smoothing=0.1),
        # each row's loss ~ 1e-10 on its own (issue #44): log(1 + r) where log1p(r) was meant rounds it to 0
        C(f"{s}-confident-none", N, V, ("confident", "reduction"), confident=1.0, ignored=0.2, reduction="none"),
        C(f"{s}-extreme", N, V, ("extreme",), extreme=True, ignored=0.2),
        C(f"{s}-extreme-zloss-ls", N, V, ("extreme", "z-loss", "smoothing"), extreme=True, z_loss=1e-3,
          label_smoothing=0.05),
        C(f"{s}-ign0", N, V, ("ignored",), ignored=0.0),
        C(f"{s}-ign100-mean", N, V, ("ignored", "nan-mean"), ignored=1.0),
        C(f"{s}-ign100-sum", N, V, ("ignored",), ignored=1.0, reduction="sum"),
        C(f"{s}-sum", N, V, ("reduction",), ignored=0.2, reduction="sum"),
        C(f"{s}-none", N, V, ("reduction",), ignored=0.2, reduction="none"),
        C(f"{s}-ls", N, V, ("smoothing",), ignored=0.2, label_smoothing=0.1),
        C(f"{s}-zloss", N, V, ("z-loss",), ignored=0.2, z_loss=1e-2),
        C(f"{s}-ls-zloss-none", N, V, ("smoothing", "z-loss", "reduction"), ignored=0.2,
          label_smoothing=0.2, z_loss=1e-2, reduction="none"),
        C(f"{s}-pad", N, V, ("non-contiguous",), ignored=0.2, layout="pad"),
        C(f"{s}-pad-wide", N, V, ("non-contiguous",), ignored=0.2, layout="pad:123"),
        C(f"{s}-ignore-index0", N, V, ("ignored",), ignored=0.2, ignore_index=0),
        C(f"{s}-normalizer", N, V, ("normalizer",), ignored=0.2, normalizer=float(3 * N + 1)),
        C(f"{s}-microbatch2", N, V, ("microbatch",), microbatches=2),
    ]


# edge classes repeated at a small vocabulary (one tile): scale, stability, the NaN mean, layout
SMALL_V_EDGES = ("scale10", "confident", "confident-none", "extreme", "ign100-mean", "pad", "none")


# GPU sweep bound: the float64 oracle and its float32 floors keep ~100 bytes per logit on the device
# (N=8192, V=128256 ran out of memory alone on a 140 GB H200), so the sweep stays under 2^28 logits
# (~27 GB) and the N=8192, V=128256 shapes are in the full preset.
SWEEP_MAX_NV = 2 ** 28
# the sweep cases that also run as layout twins (harness/model/twins.py): each reduction, the microbatches, and
# the longest rows (the gradient of the loss is a tensor only under reduction="none")
TWINNED = ("N3-V32000", "N{N}-V1025-sum", "N{N}-V1025-ls-zloss-none", "N{N}-V1025-microbatch2")


def sweep(device: str) -> list[Case]:
    if device == "cpu":
        grid = [(1, 2), (3, 2), (128, 2), (1, 31), (3, 31), (128, 31), (3, 1000), (3, 1024), (1, 1025),
                (3, 1025), (128, 1025), (3, 2004), (3, 32000)]
        cases = [C(f"N{N}-V{V}", N, V, ("size",), ignored=0.2) for N, V in grid]
        small = [c for c in _edge_cases(8, 31) if c.name.split("-", 2)[2] in SMALL_V_EDGES]
        ones = [C("N16-V1025-ones", 16, 1025, ("grad-ones",), ignored=0.2, grad_ones=True)]
        return with_twins(cases + _edge_cases(16, 1025) + small + ones, only=[n.format(N=16) for n in TWINNED])
    grid = [(1, 128256), (1, 2), (3, 1025), (3, 32000), (128, 2), (128, 1024), (128, 1025), (4096, 1000),
            (4096, 2004), (4096, 50257), (8192, 32000), (1024, 128256)]
    cases = [C(f"N{N}-V{V}", N, V, ("size",), ignored=0.2) for N, V in grid]
    ones = [C("N1024-V128256-ones", 1024, 128256, ("grad-ones",), ignored=0.2, grad_ones=True),
            C("N4096-V32000-ones-sum", 4096, 32000, ("grad-ones",), ignored=0.2, grad_ones=True, reduction="sum")]
    cases = with_twins(cases + _edge_cases(4096, 32000) + _edge_cases(128, 1025) + ones,
                       only=[n.format(N=128) for n in TWINNED])
    for c in cases:
        assert c.params["N"] * c.params["V"] <= SWEEP_MAX_NV, c.name
    return cases


def full(device: str) -> list[Case]:
    cases = sweep(device)
    if device == "cpu":
        return cases
    for N in (1, 3, 128, 4096, 8192):
        for V in (2, 31, 1000, 1024, 1025, 2004, 32000, 50257, 128256):
            cases.append(C(f"full-N{N}-V{V}", N, V, ("full",), ignored=0.2))
    cases.append(C("N8192-V128256-confident", 8192, 128256, ("confident",), confident=1.0))
    cases.append(C("N8192-V128256-ones", 8192, 128256, ("grad-ones",), ignored=0.2, grad_ones=True))
    # the last row starts at (N-1)*V = 2,147,500,032 > 2^31 - 1: a 32-bit row offset overflows there (at
    # N=16384 it starts at 2,147,368,959 and does not), and so does any flat index over the N*V logits
    # (bf16 only: 4.3 GB of logits; the oracle runs chunk by chunk, README "64-bit offsets")
    cases.append(C("N16385-V131073-int64", 16385, 131073, ("64-bit-offsets",), ignored=0.2,
                   dtypes=["bfloat16"]))
    return cases


_BENCH_BACKWARD = "bench-N8192-V128256-backward"


def bench_cases(device: str) -> list[Case]:
    # loss.backward() (upstream gradient 1, what training does), then a scaled loss (any g): a kernel
    # may special-case the first, and both are shown
    return [C(_BENCH_BACKWARD, 8192, 128256, grad_ones=True),
            C("bench-N8192-V128256-scaled", 8192, 128256)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # the floor: read the logits once, write dlogits once
    N, V = p["N"], p["V"]
    es = torch.empty((), dtype=dtype).element_size()
    return {"fwd_bytes": N * V * es, "bwd_bytes": N * V * es, "floor_bytes": 2 * N * V * es,
            "fwd_flops": 4 * N * V, "bwd_flops": 3 * N * V}


def strategy(device: str):
    # biased to the CUDA block size (1024 threads) and the power-of-two tiles around it
    V = st.one_of(st.sampled_from([2, 1023, 1024, 1025, 2047, 2048, 2049]),
                  st.integers(1, 1100).map(lambda v: 2 * v + 1))
    N = st.integers(1, 9 if device == "cpu" else 300)

    def build(N: int, V: int, ignored: float, reduction: str, ls: float, zl: float, layout: str) -> Case:
        name = f"hyp-N{N}-V{V}-ign{ignored}-{reduction}-ls{ls}-z{zl}-{layout.replace(':', '')}"
        return C(name, N, V, ("hypothesis",), ignored=ignored, reduction=reduction, label_smoothing=ls,
                 z_loss=zl, layout=layout)

    return st.builds(build, N, V, st.sampled_from([0.0, 0.2, 1.0]), st.sampled_from(["mean", "sum", "none"]),
                     st.sampled_from([0.0, 0.1]), st.sampled_from([0.0, 1e-2]),
                     st.sampled_from(["contiguous", "pad"]))


def chunk_options(inputs: Inputs) -> dict:
    """What each chunk of rows gets (OperatorSpec.separable): a mean over the whole case's valid tokens."""
    opts = inputs.options
    if opts.get("reduction", "mean") != "mean" or opts.get("normalizer") is not None:
        return {}
    return {"normalizer": float((inputs.tensors["targets"] != opts["ignore_index"]).sum())}


SPEC = register_operator(OperatorSpec(
    name="softmax_xent",
    aliases=("xent",),
    inputs=("logits", "targets"),
    differentiable=("logits",),
    outputs=("loss",),
    graded_outputs=("loss",),
    reference=softmax_xent,
    make_inputs=make_inputs,
    output_dtypes=output_dtypes,
    components=COMPONENTS,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="logits",
    microbatch=MicrobatchSpec(split=split_tokens(("logits", "targets")),
                              combine={"logits": "cat0", "loss": "sum"}, naive_options=naive_options),
    # rows are independent: the oracle of a large case row chunk by row chunk (the loss, when reduced, a sum)
    separable=Separable((SplitAxis("row", {"logits": 0, "targets": 0, "loss": 0}),), options=chunk_options),
    invariants=invariants,
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    perf_targets=(
        # issue 6: loss.backward() at N=8192, V=128256, bf16, at least 3x faster than torch
        PerfTarget("cuda", "speedup_fwd_bwd", 3.0, "min", case=_BENCH_BACKWARD, label="fwd+bwd speedup over torch"),
        # issue 31: within 1.15x of the floor's time (one read of the logits, one write of dlogits at the
        # measured copy bandwidth); in place within 1.45x at no extra memory beyond per-row statistics
        PerfTarget("cuda", "fwd_bwd_bw_frac", 1 / 1.15, "min", case=_BENCH_BACKWARD,
                   label="fwd+bwd: floor time / time (1.15x of the floor)"),
        PerfTarget("cuda-inplace", "fwd_bwd_bw_frac", 1 / 1.45, "min", case=_BENCH_BACKWARD,
                   label="fwd+bwd: floor time / time (1.45x of the floor)"),
        PerfTarget("cuda-inplace", "peak_extra_gb", 0.01, "max", case=_BENCH_BACKWARD,
                   label="fwd+bwd peak extra GB (0 GB: no dlogits buffer)"),
        # issue 45: the Gluon TMA ring within 1.2x of the floor, in place within 1.3x at no extra memory
        PerfTarget("gluon", "fwd_bwd_bw_frac", 1 / 1.2, "min", case=_BENCH_BACKWARD,
                   label="fwd+bwd: floor time / time (1.2x of the floor)"),
        PerfTarget("gluon-inplace", "fwd_bwd_bw_frac", 1 / 1.3, "min", case=_BENCH_BACKWARD,
                   label="fwd+bwd: floor time / time (1.3x of the floor)"),
        PerfTarget("gluon-inplace", "peak_extra_gb", 0.01, "max", case=_BENCH_BACKWARD,
                   label="fwd+bwd peak extra GB (0 GB: no dlogits buffer)"),
    ),
    doc="cross-entropy of materialized logits: loss and dlogits (specs/xent.md)",
))
