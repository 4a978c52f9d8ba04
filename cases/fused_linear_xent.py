"""``fused_linear_xent``: inputs, components, invariants, presets and strategies (specs/xent.md).

Case params: N, H, V; ``scale`` of the logits (weight ~ N(0, scale^2/H), hidden ~ N(0, 1), so the
logits are ~ N(0, scale^2)); ``bias`` (default True); ``confident`` (fraction of tokens whose hidden
state is pushed along their target's weight row, raising that logit by 30); ``ignored``; the loss
options of cases/softmax_xent.py plus ``softcap`` and ``return_lse``; ``layout_hidden`` and
``layout_weight`` (e.g. ``pad``, ``perm:1,0``); ``dtypes`` restricts the case to those dtypes.
"""

from __future__ import annotations

import torch
from harness.cases.softmax_xent import (
    CONFIDENT_MARGIN,
    chunk_options,
    loss_options,
    make_targets,
    naive_options,
    row_stats,
    row_sum_budget,
    split_tokens,
    token_weights,
)
from harness.references.fused_linear_xent import fused_linear_xent
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


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    N, H, V = p["N"], p["H"], p["V"]
    t = make_targets(case, N, V, gen)
    h = randn((N, H), gen)
    w = randn((V, H), gen, scale=p.get("scale", 1.0) / H ** 0.5)
    if p.get("confident"):
        rows = torch.randperm(N, generator=gen)[: max(1, round(p["confident"] * N))]
        wy = w[t[rows].clamp(0, V - 1)]
        h[rows] += CONFIDENT_MARGIN * wy / wy.pow(2).sum(dim=1, keepdim=True)
    b = randn((V,), gen, scale=0.5) if p.get("bias", True) else None
    tensors = {"hidden": place(h.to(dtype), p.get("layout_hidden", "contiguous"), device),
               "weight": place(w.to(dtype), p.get("layout_weight", "contiguous"), device),
               "bias": None if b is None else b.to(dtype).to(device),
               "targets": t.to(device)}
    opts = {**loss_options(p), "softcap": p.get("softcap"), "return_lse": bool(p.get("return_lse", False))}
    return Inputs(tensors, opts)


def output_dtypes(t: dict) -> dict:
    return {"loss": torch.float32, "lse": torch.float32}


def invariants(outputs: dict, grads: dict, inputs: Inputs, case: Case,
               grad_outputs: dict | None = None) -> list[str]:
    """Without an LSE gradient: ignored tokens' dhidden rows exactly zero, and (bias, no softcap)
    sum_v dbias_v = sum_i c_i * 2*lam*LSE_i, dbias being the column sum of dZ (specs/xent.md).

    The dbias check needs the upstream gradient (``grad_outputs``).
    """
    opts = inputs.options
    if opts.get("return_lse") or (grad_outputs is not None and "lse" in grad_outputs):
        return []
    fails = []
    dh, db = grads.get("hidden"), grads.get("bias")
    t = inputs.tensors["targets"]
    valid = t != opts["ignore_index"]
    if dh is not None:
        valid = valid.to(dh.device)
        nonfinite = (~torch.isfinite(dh[valid])).any(dim=1)
        if nonfinite.any():
            fails.append(f"dhidden: non-finite values in {int(nonfinite.sum())} valid token rows")
        bad = (dh[~valid] != 0).any(dim=1)
        if bad.any():
            rows = (~valid).nonzero().squeeze(1)[bad][:8].tolist()
            fails.append(f"dhidden: {int(bad.sum())} ignored token rows are not exactly zero "
                         f"(rows {rows}...)")
    if db is None or opts.get("softcap") or grad_outputs is None or "loss" not in grad_outputs:
        return fails
    if not torch.isfinite(db).all():
        return fails + ["dbias: non-finite values"]
    hd = inputs.tensors["hidden"].to(db.device, torch.float64)
    wd = inputs.tensors["weight"].to(db.device, torch.float64)
    N, H, V = hd.shape[0], hd.shape[1], wd.shape[0]
    step = max(1, 2 ** 26 // V)
    stats = [row_stats(hd[i:i + step] @ wd.T + inputs.tensors["bias"].to(db.device, torch.float64))
             for i in range(0, N, step)]
    lse, zmax = torch.cat([s[0] for s in stats]), torch.cat([s[1] for s in stats])
    lam = float(opts["z_loss"])
    c = token_weights(t.to(db.device), opts, grad_outputs["loss"].to(db.device).expand(t.shape))
    # logits recomputed in another order differ by up to H roundings of |h_i| |w_j|
    h_term = H * hd.norm(dim=1) * wd.norm(dim=1).max()
    rows = row_sum_budget(c, lse, zmax, V, h_term, lam, torch.float32, False)
    e32 = torch.finfo(torch.float32).eps
    fo = torch.finfo(db.dtype)
    A = 1.0 + 2.0 * lam * lse.abs()
    # dbias: float32 accumulation over N tokens, then one rounding per element to its dtype
    tol = float(rows.sum() + 2.0 * N * e32 * (2.0 * c.abs() * (A + 1.0)).sum()
                + fo.eps * db.double().abs().sum() + V * fo.smallest_normal * fo.eps)
    got = float(db.double().sum())
    want = float((c * 2.0 * lam * lse).sum())
    if abs(got - want) > tol:
        fails.append(f"dbias: sums to {got:.6g}, expected sum_i (g_i/D)*2*z_loss*LSE_i = {want:.6g} "
                     f"(budget {tol:.3g})")
    return fails


TOKEN = Axis("token", 0, block="BLOCK_N", default_block=64)
VOCAB = Axis("vocab", 0, block="BLOCK_V", default_block=64)
HIDDEN = Axis("hidden", 1, block="BLOCK_H", default_block=64)
COMPONENTS = (
    # a scalar for mean/sum, [N] for none: viewed 1-D so one axis fits every case
    Component("loss", "out:loss", lambda t, p: t.reshape(-1), (TOKEN,)),
    Component("lse", "out:lse", None, (TOKEN,)),
    Component("dhidden", "grad:hidden", None, (TOKEN, HIDDEN)),
    Component("dweight", "grad:weight", None, (VOCAB, HIDDEN)),
    Component("dbias", "grad:bias", None, (VOCAB,)),
)


def C(name: str, N: int, H: int, V: int, tags: tuple[str, ...] = (), microbatches: int = 0, **kw) -> Case:
    return Case(name, {"N": N, "H": H, "V": V, **kw}, tags, microbatches)


def smoke(device: str) -> list[Case]:
    return [
        C("N7-H16-V31", 7, 16, 31, ("tiny",), ignored=0.2),
        C("N12-H20-V100-softcap-zloss-lse-none", 12, 20, 100, ("softcap", "z-loss", "lse", "reduction"),
          bias=False, scale=3.0, softcap=3.0, z_loss=1e-2, return_lse=True, reduction="none", ignored=0.2),
        C("N24-H16-V67-mb2", 24, 16, 67, ("microbatch",), microbatches=2),
        # what the sweep has besides (tests/test_coverage.py): N = BLOCK_N, H < BLOCK_H and V > BLOCK_V
        # (interpreter blocks 16, 16, 128), padded hidden and transposed weight, ignore_index 0, a global
        # normalizer, each reduction, smoothing, and a layout twin of every input and upstream gradient
        C("N16-H8-V129-strided-ii0-normalizer", 16, 8, 129, ("non-contiguous", "ignored", "normalizer"),
          ignored=0.2, ignore_index=0, normalizer=49.0, layout_hidden="pad", layout_weight="perm:1,0"),
        C("N9-H16-V40-sum-ls", 9, 16, 40, ("reduction", "smoothing"), ignored=0.2, reduction="sum",
          label_smoothing=0.1),
        C("N6-H64-V40-confident-none", 6, 64, 40, ("confident", "reduction"), confident=1.0, reduction="none"),
        twin(C("N10-H16-V50-lse-none", 10, 16, 50, ("lse", "reduction"), ignored=0.2, return_lse=True,
               reduction="none"), "mixed"), *adversarial(C("N10-H16-V50-lse-none", 10, 16, 50, ("lse", "reduction"),
                                                         ignored=0.2, return_lse=True, reduction="none")),
    ]


def _edge_cases(N: int, H: int, V: int) -> list[Case]:
    """Every edge class of the spec at one (N, H, V)."""
    s = f"N{N}-H{H}-V{V}"
    return [
        C(f"{s}-nobias", N, H, V, ("bias-absent",), bias=False, ignored=0.2),
        C(f"{s}-scale5", N, H, V, ("scale",), scale=5.0, ignored=0.2),
        C(f"{s}-ign0", N, H, V, ("ignored",), ignored=0.0),
        C(f"{s}-ign100-mean", N, H, V, ("ignored", "nan-mean"), ignored=1.0),
        C(f"{s}-ign100-sum", N, H, V, ("ignored",), ignored=1.0, reduction="sum"),
        C(f"{s}-confident", N, H, V, ("confident",), confident=0.5, ignored=0.2),
        # each token's loss ~ 1e-10 on its own (issue #44): log(1 + r) where log1p(r) was meant rounds it to 0
        C(f"{s}-confident-none", N, H, V, ("confident", "reduction"), confident=1.0, ignored=0.2,
          reduction="none"),
        C(f"{s}-sum", N, H, V, ("reduction",), ignored=0.2, reduction="sum"),
        C(f"{s}-none", N, H, V, ("reduction",), ignored=0.2, reduction="none"),
        C(f"{s}-ls", N, H, V, ("smoothing",), ignored=0.2, label_smoothing=0.1),
        C(f"{s}-zloss", N, H, V, ("z-loss",), ignored=0.2, z_loss=1e-2),
        C(f"{s}-softcap", N, H, V, ("softcap",), ignored=0.2, scale=3.0, softcap=4.0),
        C(f"{s}-lse", N, H, V, ("lse",), ignored=0.2, return_lse=True),
        C(f"{s}-lse-all", N, H, V, ("lse", "z-loss", "softcap", "smoothing", "reduction"), ignored=0.2,
          return_lse=True, z_loss=1e-2, softcap=4.0, scale=3.0, label_smoothing=0.05, reduction="none"),
        C(f"{s}-lse-ign100", N, H, V, ("lse", "ignored"), ignored=1.0, return_lse=True, reduction="sum"),
        C(f"{s}-normalizer", N, H, V, ("normalizer",), ignored=0.2, normalizer=float(3 * N + 1)),
        C(f"{s}-ignore-index0", N, H, V, ("ignored",), ignored=0.2, ignore_index=0),
        C(f"{s}-strided", N, H, V, ("non-contiguous",), ignored=0.2, layout_hidden="pad",
          layout_weight="perm:1,0"),
        C(f"{s}-mb2", N, H, V, ("microbatch",), microbatches=2),
        C(f"{s}-mb3-zloss-lse", N, H, V, ("microbatch", "z-loss", "lse"), microbatches=3, z_loss=1e-2,
          return_lse=True),
    ]


# GPU sweep bound: the float64 oracle materializes [N, V] logits and their gradient
SWEEP_MAX_NV, SWEEP_MAX_NHV = 2 ** 27, 2 ** 37


def sweep(device: str) -> list[Case]:
    if device == "cpu":
        grid = [(1, 16, 2), (7, 16, 1025), (64, 48, 1000), (64, 8, 1100), (5, 48, 2)]
        cases = [C(f"N{N}-H{H}-V{V}", N, H, V, ("size",), ignored=0.2) for N, H, V in grid]
        cases.append(C("N63-H47-V123-odd", 63, 47, 123, ("odd-sizes",), ignored=0.2))
        cases.append(C("N16-H16-V1025-zloss-lse", 16, 16, 1025, ("V>1024", "z-loss", "lse"), ignored=0.2,
                       z_loss=1e-2, return_lse=True))
        # layout twins (harness/model/twins.py): bias absent, and every output with its gradient (reduction none)
        return with_twins(cases + _edge_cases(32, 24, 129), only=("N32-H24-V129-nobias", "N32-H24-V129-lse-all"))
    grid = [(1, 4096, 128256), (7, 100, 1025), (128, 256, 32000), (128, 4096, 128256), (1000, 2048, 32000),
            (1000, 4096, 1000), (1000, 256, 128256), (4096, 256, 32000), (4096, 2048, 1025), (8192, 16, 1025),
            (8192, 2048, 2), (8192, 2048, 1000), (8192, 100, 1025)]
    cases = [C(f"N{N}-H{H}-V{V}", N, H, V, ("size",), ignored=0.2) for N, H, V in grid]
    cases.append(C("N252-H507-V123-odd", 252, 507, 123, ("odd-sizes",), ignored=0.2))
    cases += _edge_cases(1000, 256, 32000)
    cases.append(C("N1000-H100-V1025-mb3", 1000, 100, 1025, ("microbatch",), microbatches=3))
    cases = with_twins(cases, only=("N7-H100-V1025", "N8192-H16-V1025", "N1000-H256-V32000-lse-all"))
    for c in cases:
        p = c.params
        assert p["N"] * p["V"] <= SWEEP_MAX_NV and p["N"] * p["H"] * p["V"] <= SWEEP_MAX_NHV, c.name
    return cases


def full(device: str) -> list[Case]:
    cases = sweep(device)
    if device == "cpu":
        return cases
    for N, H, V in [(4096, 4096, 32000), (8192, 4096, 32000), (8192, 2048, 128256), (4096, 4096, 128256)]:
        cases.append(C(f"full-N{N}-H{H}-V{V}", N, H, V, ("full",), ignored=0.2))
    cases.append(C("full-N8192-H4096-V128256-mb2", 8192, 4096, 128256, ("full", "microbatch"),
                   microbatches=2, dtypes=["bfloat16"]))
    cases.append(C("full-N8192-H4096-V128256", 8192, 4096, 128256, ("full", "production"), ignored=0.2,
                   dtypes=["bfloat16"]))
    # a [N, V] logits tensor (what an unfused backend holds) whose last row starts past 2^31 - 1:
    # (N-1)*V = 2,147,500,032; H small, so that the float64 oracle's GEMMs stay cheap
    cases.append(C("N16385-H256-V131073-int64", 16385, 256, 131073, ("64-bit-offsets",), ignored=0.2,
                   dtypes=["bfloat16"]))
    return cases


def bench_cases(device: str) -> list[Case]:
    return [C("bench-N8192-H4096-V128256", 8192, 4096, 128256, dtypes=["bfloat16"])]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # logits formed once per chunk: 2NHV forward, 4NHV backward (dhidden and dweight GEMMs)
    N, H, V = p["N"], p["H"], p["V"]
    es = torch.empty((), dtype=dtype).element_size()
    return {"flops": 6 * N * H * V, "fwd_flops": 2 * N * H * V, "bwd_flops": 4 * N * H * V,
            "floor_bytes": 2 * (N * H + V * H) * es}


def strategy(device: str):
    # biased to the usual tile sizes (16..128) and to the 1024 boundary, odd sizes otherwise
    V = st.one_of(st.sampled_from([2, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025]),
                  st.integers(1, 550).map(lambda v: 2 * v + 1))
    H = st.one_of(st.sampled_from([15, 16, 17, 31, 32, 33, 47]), st.integers(1, 48))
    N = st.integers(1, 70 if device == "cpu" else 300)

    def build(N: int, H: int, V: int, ignored: float, reduction: str, bias: bool, softcap: float | None,
              zl: float, lse: bool) -> Case:
        name = f"hyp-N{N}-H{H}-V{V}-ign{ignored}-{reduction}-b{int(bias)}-cap{softcap}-z{zl}-lse{int(lse)}"
        return C(name, N, H, V, ("hypothesis",), ignored=ignored, reduction=reduction, bias=bias,
                 softcap=softcap, z_loss=zl, return_lse=lse)

    return st.builds(build, N, H, V, st.sampled_from([0.0, 0.2, 1.0]),
                     st.sampled_from(["mean", "sum", "none"]), st.booleans(),
                     st.sampled_from([None, 4.0]), st.sampled_from([0.0, 1e-2]), st.booleans())


SPEC = register_operator(OperatorSpec(
    name="fused_linear_xent",
    aliases=("xent",),
    inputs=("hidden", "weight", "bias", "targets"),
    differentiable=("hidden", "weight", "bias"),
    outputs=("loss", "lse"),
    graded_outputs=("loss", "lse"),
    reference=fused_linear_xent,
    make_inputs=make_inputs,
    output_dtypes=output_dtypes,
    components=COMPONENTS,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="hidden",
    microbatch=MicrobatchSpec(split=split_tokens(("hidden", "targets")),
                              combine={"hidden": "cat0", "weight": "sum", "bias": "sum", "loss": "sum",
                                       "lse": "cat0"},
                              naive_options=naive_options),
    # tokens are independent (dweight and dbias: sums over them); per token the float64 reference holds its
    # [V] logits and their gradient several times over, not its [H] hidden state
    separable=Separable((SplitAxis("token", {"hidden": 0, "targets": 0, "loss": 0, "lse": 0}),),
                        options=chunk_options,
                        slice_bytes=lambda i: 24 * 8 * (i.tensors["weight"].shape[0] + i.tensors["hidden"].shape[1])),
    invariants=invariants,
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    # bf16, N=8192, H=4096, V=128256, against torch eager (logits materialized): issue 5's targets,
    # tightened by issue 31 (fast at or below torch's time, lean within 1.3x at 1.2 GB)
    perf_targets=(PerfTarget("triton", "fwd_bwd_ms", 1.0, versus="torch", label="fast: fwd+bwd / torch"),
                  PerfTarget("triton", "peak_extra_gb", 3.5, label="fast: peak extra GB"),
                  PerfTarget("triton-lean", "fwd_bwd_ms", 1.3, versus="torch", label="lean: fwd+bwd / torch"),
                  PerfTarget("triton-lean", "peak_extra_gb", 1.2, label="lean: peak extra GB")),
    doc="linear unembedding + cross-entropy without [N, V] logits: loss, lse, dhidden, dweight, dbias "
        "(specs/xent.md)",
))
