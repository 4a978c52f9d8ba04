"""The verdict rule of docs/design.md: the figures it reads (measured in the worker) and the verdict
computed from them (anywhere, any time: `harness report` re-judges stored figures).

For each component, with backend k, oracle o (float64) and floor reference r (float32 math,
rounded to the contract dtype):

    SHAPE  if shape or dtype differs from the contract
    FAIL   if the NaN/Inf positions of k differ from o's (matching NaN agrees)
    FAIL   if k == 0 everywhere while o is not
    e    = max(|k - o| - extra_bound, 0)
    u    = eps(dtype) * max|o|
    PASS iff max(e) <= K_MAX * max|r - o| + 2u  and  rms(e) <= K_RMS * rms(r - o) + 0.5 * eps * rms(o)

One recorded change to the pinned rule: the rms criterion applies to components of at least
RMS_MIN_NUMEL elements. Over a handful of values (a scalar dalpha, a loss, dtau of 4 heads) an rms
is one sample of the floor's luck, not a statistic: a correct fp32 reduction in another summation
order failed it at 1.8x (dalpha.pre, paper init) while its max error was 0.64x of the max bound.
Such components are judged by the max criterion alone, whose 2u term covers reordering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .records import PROFILE_FROM_RATIO, ComponentFigures

Tensor = torch.Tensor

EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23, torch.float64: 2.0**-52}
K_MAX = 3.0
K_RMS = 2.0
RMS_MIN_NUMEL = 16


def eps_of(dtype: torch.dtype) -> float:
    return EPS.get(dtype, 2.0**-23)


@dataclass(frozen=True)
class FloorSummary:
    """One floor-reference error sample reduced to what the verdict reads of it: its max and rms over
    the positions where the oracle is finite. Kept instead of the sample (a float64 tensor as large as
    the component) so that the memory of a cell does not grow with the number of draws."""

    max: float
    rms: float

    @staticmethod
    def of(err: Tensor, oracle: Tensor) -> FloorSummary:
        x = torch.where(torch.isfinite(err), err, torch.zeros_like(err))[torch.isfinite(oracle)]
        return FloorSummary(_f(x.max()) if x.numel() else 0.0, _f(_rms(x)))


def _f(x: Tensor) -> float:
    return float(x.item()) if x.numel() else 0.0


def _rms(x: Tensor) -> Tensor:
    return x.pow(2).mean().sqrt() if x.numel() else torch.zeros((), dtype=torch.float64)




def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


EPS_BY_NAME = {_dt(k): v for k, v in EPS.items()}


def check_shape(name: str, got: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> ComponentFigures | None:
    """The figures of a missing or misshapen result (before any view is applied); None when conforming."""
    if got is None:
        return ComponentFigures(name, kind="missing", dtype=_dt(dtype))
    want = f"{list(shape)} {_dt(dtype)}"
    if not isinstance(got, Tensor):
        return ComponentFigures(name, kind="shape", dtype=_dt(dtype), expected=want, got=type(got).__name__)
    if tuple(got.shape) != tuple(shape) or got.dtype != dtype:
        return ComponentFigures(name, kind="shape", dtype=_dt(got.dtype), expected=want,
                                got=f"{list(got.shape)} {_dt(got.dtype)}")
    return None


def transposed(fig: ComponentFigures) -> str:
    """The words a SHAPE component's reason adds where it came back with the expected shape reversed (a
    gradient returned as ``d.t()``), else ""."""
    def dims(text: str) -> list[str] | None:
        text = text.strip()
        if not text.startswith("[") or "]" not in text:
            return None
        return [d.strip() for d in text[1:text.index("]")].split(",") if d.strip()]

    want, have = dims(fig.expected or ""), dims(fig.got or "")
    if want is None or have is None or len(want) < 2 or have == want or have != want[::-1]:
        return ""
    if "transpose" in (fig.got or ""):
        return ""  # autograd's refusal, read back by the oracle, says so already
    return " (transposed: the expected shape reversed)"


def measure(
    name: str,
    k: Tensor,
    o: Tensor,
    r: Tensor | list[Tensor | FloorSummary],
    dtype: torch.dtype,
    extra_bound: Tensor | None = None,
    k_max: float = K_MAX,
    k_rms: float = K_RMS,
) -> tuple[ComponentFigures, Tensor | None]:
    """The figures of one component and the elementwise excess error e (inf where non-finite positions
    differ; None when the component is empty).

    ``r`` is the floor reference, or a list of floor-reference error samples |r_i - o_i| (the floor
    evaluated on inputs perturbed at the float32 rounding level, each against its own oracle): the
    floor's error is then the largest of the samples, so one lucky rounding does not set the bar.
    Samples after the first may be ``FloorSummary``s, reduced over the oracle's finite positions.
    """
    k = k.detach().to(torch.float64)
    o = o.detach().to(torch.float64)
    rl = r if isinstance(r, list) else [(r.detach().to(torch.float64) - o).abs()]
    samples = [x.detach().to(torch.float64) for x in rl if isinstance(x, Tensor)]
    summaries = [x for x in rl if isinstance(x, FloorSummary)]
    fig = ComponentFigures(name, numel=o.numel(), dtype=_dt(dtype))
    if o.numel() == 0:
        return fig, None
    k_nan, o_nan = torch.isnan(k), torch.isnan(o)
    k_inf, o_inf = torch.isinf(k), torch.isinf(o)
    fig.nonfinite = int((k_nan | k_inf).sum())
    mismatch = (k_nan != o_nan) | (k_inf != o_inf) | (k_inf & o_inf & (torch.sign(k) != torch.sign(o)))
    o_fin = torch.isfinite(o)
    fig.mismatch = int(mismatch.sum())
    fig.mismatch_inf = int((mismatch & k_inf & o_fin).sum())
    fig.mismatch_nan = int((mismatch & k_nan & o_fin).sum())
    if fig.mismatch:
        fig.mismatch_first = [int(i) for i in mismatch.nonzero()[0].tolist()]
    fin = o_fin & torch.isfinite(k)
    ko, oo = k[fin], o[fin]
    refs = [torch.where(torch.isfinite(x), x, torch.zeros_like(x))[fin] for x in samples]
    eb = extra_bound.detach().to(torch.float64)[fin] if extra_bound is not None else None
    diff = (ko - oo).abs()
    e = (diff - eb).clamp_min(0) if eb is not None else diff
    fig.max_err = _f(diff.max()) if diff.numel() else 0.0
    fig.mean_err = _f(diff.mean()) if diff.numel() else 0.0
    fig.max_excess = _f(e.max()) if e.numel() else 0.0
    fig.rms_excess = _f(_rms(e))
    fig.floor_max = max([(_f(x.max()) if x.numel() else 0.0) for x in refs] + [x.max for x in summaries])
    fig.floor_rms = max([_f(_rms(x)) for x in refs] + [x.rms for x in summaries])
    fig.oracle_max = _f(oo.abs().max()) if oo.numel() else 0.0
    fig.oracle_rms = _f(_rms(oo))
    fig.rel_rms = _f(_rms(ko - oo)) / fig.oracle_rms if fig.oracle_rms > 0 else 0.0
    nk, no = ko.norm(), oo.norm()
    fig.cosine = _f((ko * oo).sum() / (nk * no)) if nk > 0 and no > 0 else (1.0 if nk == no else 0.0)
    nz = oo != 0
    fig.zero_frac = _f((ko[nz] == 0).double().mean()) if nz.any() else 0.0
    fig.all_zero = bool(nz.any()) and bool((ko == 0).all())
    fig.floor_all_zero = bool(samples) and bool(torch.equal(samples[0][fin], oo.abs()))
    fig.extra_bound_max = _f(eb.max()) if eb is not None and eb.numel() else 0.0
    oo2 = _f((oo * oo).sum())
    tol_max, tol_rms = bounds(fig, k_max, k_rms)  # the operator's bounds, as the per-slice profiles' gate
    if oo2 > 0 and (fig.max_excess > PROFILE_FROM_RATIO * tol_max or fig.rms_excess > PROFILE_FROM_RATIO * tol_rms):
        # k ~ a*o by least squares: what is left after the best uniform scale (a scale or normalizer bug).
        # Only near a failure (as the per-slice profiles): one more float64 copy of a [128256, 4096] dweight
        # is 4.2 GB of a GPU that the oracle already fills
        fig.scale = _f((ko * oo).sum()) / oo2
        rest = (ko - fig.scale * oo).abs()
        fig.scaled_max, fig.scaled_rms = _f(rest.max()), _f(_rms(rest))
        del rest
    e_full = torch.zeros_like(o)
    e_full[fin] = e
    e_full[mismatch] = math.inf
    return fig, e_full


@dataclass
class Verdict:
    """The pinned rule applied to one component's figures. ``kind`` says which clause decided it:
    "bound", "nonfinite", "all-zero", "shape", "missing" ("" for a pass)."""

    verdict: str  # PASS | FAIL | SHAPE
    reason: str = ""
    kind: str = ""
    tol_max: float = 0.0
    tol_rms: float = 0.0
    ratio_max: float = 0.0
    ratio_rms: float = 0.0
    rms_applies: bool = True
    figures: ComponentFigures | None = None

    @property
    def failed(self) -> bool:
        return self.verdict != "PASS"

    @property
    def worst_ratio(self) -> float:
        return max(self.ratio_max, self.ratio_rms if self.rms_applies else 0.0)

    @property
    def cosine(self) -> float:
        return self.figures.cosine if self.figures else 1.0


def bounds(fig: ComponentFigures, k_max: float = K_MAX, k_rms: float = K_RMS) -> tuple[float, float]:
    """(tol_max, tol_rms) of a component: what a careful float32 kernel achieves, with room."""
    eps = EPS_BY_NAME.get(fig.dtype, 2.0**-23)
    return k_max * fig.floor_max + 2 * eps * fig.oracle_max, k_rms * fig.floor_rms + 0.5 * eps * fig.oracle_rms


def _ratio(x: float, tol: float) -> float:
    return x / tol if tol > 0 else (0.0 if x == 0 else math.inf)


def verdict_of(fig: ComponentFigures, k_max: float = K_MAX, k_rms: float = K_RMS) -> Verdict:
    """PASS / FAIL / SHAPE of one component from its figures (see the module docstring)."""
    if fig.kind == "missing":
        return Verdict("FAIL", "not computed: the backend returned no tensor (None)", "missing", figures=fig)
    if fig.kind == "shape":
        return Verdict("SHAPE", f"expected {fig.expected}, got {fig.got}{transposed(fig)}", "shape", figures=fig)
    tol_max, tol_rms = bounds(fig, k_max, k_rms)
    v = Verdict("PASS", tol_max=tol_max, tol_rms=tol_rms, ratio_max=_ratio(fig.max_excess, tol_max),
                ratio_rms=_ratio(fig.rms_excess, tol_rms), rms_applies=fig.numel >= RMS_MIN_NUMEL, figures=fig)
    if not v.rms_applies:
        v.ratio_rms = 0.0  # not a statistic at this size (see the module docstring)
    if fig.mismatch:
        v.verdict, v.kind = "FAIL", "nonfinite"
        v.reason = (f"non-finite at {fig.mismatch} position(s) where the oracle differs"
                    + (f"; first at {fig.mismatch_first}" if fig.mismatch_first else ""))
    elif fig.all_zero and not fig.floor_all_zero:
        v.verdict, v.kind, v.reason = "FAIL", "all-zero", "all zeros while the oracle is not"
    elif v.ratio_max > 1 or v.ratio_rms > 1:
        which = [(w, r) for w, r in (("max", v.ratio_max), ("rms", v.ratio_rms)) if r > 1]
        v.verdict, v.kind = "FAIL", "bound"
        v.reason = " and ".join(f"{w} error {r:.3g}x its bound" for w, r in which)
    return v


def judge(
    name: str,
    k: Tensor,
    o: Tensor,
    r: Tensor | list[Tensor | FloorSummary],
    dtype: torch.dtype,
    extra_bound: Tensor | None = None,
    k_max: float = K_MAX,
    k_rms: float = K_RMS,
) -> tuple[Verdict, Tensor | None]:
    """measure() then verdict_of(): the verdict of one component and its excess error e."""
    fig, e = measure(name, k, o, r, dtype, extra_bound, k_max, k_rms)
    return verdict_of(fig, k_max, k_rms), e
