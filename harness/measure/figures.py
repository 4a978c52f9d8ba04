"""The figures of one component, measured from its tensors in the worker: the errors of the backend and of
the floor reference against the oracle, reduced to what the verdict rule (harness/judge/verdict.py) reads."""

from __future__ import annotations

import math

import torch

from ..judge.verdict import K_MAX, K_RMS, FloorSummary, Verdict, _dt, _f, _rms, bounds, verdict_of
from ..model.records import PROFILE_FROM_RATIO, ComponentFigures

Tensor = torch.Tensor


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
