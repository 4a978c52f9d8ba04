"""The verdict rule of harness-design.md, and the figures that went into it.

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
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor

EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23, torch.float64: 2.0**-52}
K_MAX = 3.0
K_RMS = 2.0
RMS_MIN_NUMEL = 16


def eps_of(dtype: torch.dtype) -> float:
    return EPS.get(dtype, 2.0**-23)


@dataclass
class ComponentResult:
    """One row of a component table (field order = column order)."""

    name: str
    verdict: str  # PASS | FAIL | SHAPE
    reason: str = ""
    max_err: float = 0.0
    mean_err: float = 0.0
    rms_err: float = 0.0
    ref_max: float = 0.0
    ref_rms: float = 0.0
    tol_max: float = 0.0
    tol_rms: float = 0.0
    ratio_max: float = 0.0  # max(e) / tol_max: > 1 fails
    ratio_rms: float = 0.0  # rms(e) / tol_rms: > 1 fails
    rel_rms: float = 0.0  # rms(k - o) / rms(o)
    cosine: float = 1.0
    zero_frac: float = 0.0  # fraction of k exactly 0 where o is not
    nonfinite: int = 0  # non-finite entries of k
    extra_bound_max: float = 0.0
    max_abs_oracle: float = 0.0
    numel: int = 0
    dtype: str = ""
    localization: dict[str, Any] = field(default_factory=dict)
    hint: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d


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


def check_shape(name: str, got: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> ComponentResult | None:
    """SHAPE (or FAIL for a missing gradient) before any view is applied; None when conforming."""
    if got is None:
        return ComponentResult(
            name,
            "FAIL",
            reason="not computed: the backend returned no tensor (None)",
            hint="gradient never produced: the input is not connected to the outputs",
        )
    if not isinstance(got, Tensor):
        return ComponentResult(
            name, "SHAPE", reason=f"expected a tensor {list(shape)} {dtype}, got {type(got).__name__}"
        )
    if tuple(got.shape) != tuple(shape) or got.dtype != dtype:
        return ComponentResult(
            name,
            "SHAPE",
            reason=f"expected {list(shape)} {str(dtype).replace('torch.', '')}, "
            f"got {list(got.shape)} {str(got.dtype).replace('torch.', '')}",
            dtype=str(got.dtype).replace("torch.", ""),
        )
    return None


def judge(
    name: str,
    k: Tensor,
    o: Tensor,
    r: Tensor | list[Tensor | FloorSummary],
    dtype: torch.dtype,
    extra_bound: Tensor | None = None,
    k_max: float = K_MAX,
    k_rms: float = K_RMS,
) -> tuple[ComponentResult, Tensor | None]:
    """Apply the verdict; returns the row and the elementwise excess error e (None when not computed).

    ``r`` is the floor reference, or a list of floor-reference error samples |r_i - o_i| (the floor
    evaluated on inputs perturbed at the float32 rounding level, each against its own oracle): the
    floor's error is then the largest of the samples, so one lucky rounding does not set the bar.
    Samples after the first may be ``FloorSummary``s, reduced over the oracle's finite positions (the
    positions where only the backend is not finite are a FAIL anyway).
    """
    k = k.detach().to(torch.float64)
    o = o.detach().to(torch.float64)
    rl = r if isinstance(r, list) else [(r.detach().to(torch.float64) - o).abs()]
    samples = [x.detach().to(torch.float64) for x in rl if isinstance(x, Tensor)]
    summaries = [x for x in rl if isinstance(x, FloorSummary)]
    res = ComponentResult(name, "PASS", numel=o.numel(), dtype=str(dtype).replace("torch.", ""))
    if o.numel() == 0:
        return res, None
    k_nan, o_nan = torch.isnan(k), torch.isnan(o)
    k_inf, o_inf = torch.isinf(k), torch.isinf(o)
    res.nonfinite = int((k_nan | k_inf).sum())
    mismatch = (k_nan != o_nan) | (k_inf != o_inf) | (k_inf & o_inf & (torch.sign(k) != torch.sign(o)))
    fin = torch.isfinite(o) & torch.isfinite(k)
    ko, oo = k[fin], o[fin]
    refs = [torch.where(torch.isfinite(x), x, torch.zeros_like(x))[fin] for x in samples]
    eb = extra_bound.detach().to(torch.float64)[fin] if extra_bound is not None else None
    diff = (ko - oo).abs()
    e = (diff - eb).clamp_min(0) if eb is not None else diff
    eps = eps_of(dtype)
    max_o = _f(oo.abs().max()) if oo.numel() else 0.0
    rms_o = _f(_rms(oo))
    res.max_err = _f(diff.max()) if diff.numel() else 0.0
    res.mean_err = _f(diff.mean()) if diff.numel() else 0.0
    res.rms_err = _f(_rms(e))
    res.ref_max = max([(_f(x.max()) if x.numel() else 0.0) for x in refs] + [x.max for x in summaries])
    res.ref_rms = max([_f(_rms(x)) for x in refs] + [x.rms for x in summaries])
    res.tol_max = k_max * res.ref_max + 2 * eps * max_o
    res.tol_rms = k_rms * res.ref_rms + 0.5 * eps * rms_o
    max_e = _f(e.max()) if e.numel() else 0.0
    res.ratio_max = max_e / res.tol_max if res.tol_max > 0 else (0.0 if max_e == 0 else math.inf)
    res.ratio_rms = res.rms_err / res.tol_rms if res.tol_rms > 0 else (0.0 if res.rms_err == 0 else math.inf)
    if e.numel() < RMS_MIN_NUMEL:
        res.ratio_rms = 0.0  # not a statistic at this size (see the module docstring)
    res.rel_rms = _f(_rms(ko - oo)) / rms_o if rms_o > 0 else 0.0
    nk, no = ko.norm(), oo.norm()
    res.cosine = _f((ko * oo).sum() / (nk * no)) if nk > 0 and no > 0 else (1.0 if nk == no else 0.0)
    nz = oo != 0
    res.zero_frac = _f((ko[nz] == 0).double().mean()) if nz.any() else 0.0
    res.extra_bound_max = _f(eb.max()) if eb is not None and eb.numel() else 0.0
    res.max_abs_oracle = max_o

    e_full = torch.zeros_like(o)
    e_full[fin] = e
    e_full[mismatch] = math.inf
    if mismatch.any():
        idx = mismatch.nonzero()[0].tolist()
        res.verdict, res.reason = (
            "FAIL",
            (
                f"non-finite at {int(mismatch.sum())} position(s) where the oracle "
                f"is {'finite' if torch.isfinite(o[tuple(idx)]) else 'not'}; first at {idx}"
            ),
        )
    elif nz.any() and bool((ko == 0).all()) and not _floor_all_zero(samples, fin, oo):
        res.verdict, res.reason = "FAIL", "all zeros while the oracle is not"
    elif res.ratio_max > 1 or res.ratio_rms > 1:
        which = [w for w, bad in (("max", res.ratio_max > 1), ("rms", res.ratio_rms > 1)) if bad]
        res.verdict = "FAIL"
        res.reason = " and ".join(
            f"{w} error {res.ratio_max if w == 'max' else res.ratio_rms:.3g}x its bound" for w in which
        )
    return res, e_full


def _floor_all_zero(samples: list[Tensor], fin: Tensor, oo: Tensor) -> bool:
    """The floor reference itself is all zeros (its error equals |oracle|): zeros are what float32 gives
    (e.g. the loss of fully confident rows), so "all zeros" is no evidence of an unwritten result."""
    return bool(samples) and bool(torch.equal(samples[0][fin], oo.abs()))


def tolerances(res: ComponentResult) -> tuple[float, float]:
    return res.tol_max, res.tol_rms
