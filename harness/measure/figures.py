"""The figures of one component, measured from its tensors in the worker: the errors of the backend and of
the floor reference against the oracle, reduced to what the verdict rule (harness/judge/verdict.py) reads.

A component is measured whole (``measure``) or, in a chunked cell, chunk by chunk
(harness/measure/streaming.py). Both take the same steps, defined here once:

1. ``Compared``: the backend's values against the oracle's: which positions disagree on being finite, and
   the error and the excess over the extra bound on the finite ones;
2. a ``Reduced``: those tensors reduced to counts, maxima, means and sums; ``reduce_whole`` for a whole
   component, streaming's ``_Figures`` by adding chunk after chunk;
3. ``figures_of``: the ComponentFigures made of a ``Reduced``, and ``fitted_scale``, the scale fit's gate.

A new figure is a field of ``Reduced`` and a line of ``figures_of``; a new per-slice figure, a term of
localize.slice_terms. Only the reduction of a new ``Reduced`` field is written twice, in ``reduce_whole`` and
in streaming's ``_Figures``, because the two cannot be one without changing the figures of committed
reports: torch reduces a whole tensor in its own order (a mean on a GPU is its sum times 1/n, ``norm`` is a
kernel of its own), while a chunked component's sums are added chunk after chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..judge.verdict import K_MAX, K_RMS, FloorSummary, Verdict, _dt, _f, _rms, bounds, verdict_of
from ..model.records import PROFILE_FROM_RATIO, ComponentFigures
from ..model.spec import Component

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


def results_of(comp: Component, ref: dict, got: dict) -> tuple[Tensor, Any, torch.dtype] | None:
    """A component's whole tensor in the oracle's results ``ref`` (a cached oracle entry) and in the backend's
    ``got`` (None where it returned none), and the dtype its contract asks for; None where the case has no
    such tensor (an absent optional input or output)."""
    name = comp.tensor_name
    o = (ref["o_out"] if comp.kind == "out" else ref["o_grad"]).get(name)
    if o is None:
        return None
    # an output's dtype is the operator's output contract; a gradient's is its input's
    contract = ref["contract"].get(name, o.dtype) if comp.kind == "out" else ref["inputs"].tensors[name].dtype
    return o, (got["outs"] if comp.kind == "out" else got["grads"]).get(name), contract


@dataclass
class Compared:
    """A backend's values k against the oracle o (both float64) over a whole component or one chunk of it:
    the positions whose non-finite status differs (``mismatch``: matching NaN or Inf agrees), the finite
    positions (``fin``), the values there (``ko``, ``oo``), |k - o| there (``diff``) and its excess over
    the extra bound ``eb`` (``e``)."""

    k: Tensor
    o: Tensor
    mismatch: Tensor
    fin: Tensor
    ko: Tensor
    oo: Tensor
    diff: Tensor
    e: Tensor
    eb: Tensor | None

    @staticmethod
    def of(k: Tensor, o: Tensor, extra: Tensor | None) -> Compared:
        k, o = k.detach().to(torch.float64), o.detach().to(torch.float64)
        k_nan, o_nan, k_inf, o_inf = torch.isnan(k), torch.isnan(o), torch.isinf(k), torch.isinf(o)
        mismatch = (k_nan != o_nan) | (k_inf != o_inf) | (k_inf & o_inf & (torch.sign(k) != torch.sign(o)))
        fin = torch.isfinite(o) & torch.isfinite(k)
        ko, oo = k[fin], o[fin]
        eb = extra.detach().to(torch.float64)[fin] if extra is not None else None
        diff = (ko - oo).abs()
        e = (diff - eb).clamp_min(0) if eb is not None else diff
        return Compared(k, o, mismatch, fin, ko, oo, diff, e, eb)

    def excess(self) -> Tensor:
        """e over every position: 0 where non-finite values agree, inf where they differ (what the per-slice
        profiles, the positions and the heatmap read)."""
        out = torch.zeros_like(self.o)
        out[self.fin] = self.e
        out[self.mismatch] = math.inf
        return out


@dataclass
class Reduced:
    """What the figures of one component are made of: its ``Compared`` reduced to numbers. Differences,
    excess and oracle are taken over the finite positions; ``floors`` holds each floor sample's error (its
    max and rms); ``s_ko`` and ``ss_o`` are the sums of k*o and o*o the scale fit needs."""

    numel: int
    nonfinite: int = 0
    mismatch: int = 0
    mismatch_inf: int = 0
    mismatch_nan: int = 0
    mismatch_first: list[int] = field(default_factory=list)
    max_diff: float = 0.0
    mean_diff: float = 0.0
    rms_diff: float = 0.0
    max_e: float = 0.0
    rms_e: float = 0.0
    extra_bound_max: float = 0.0
    floors: list[FloorSummary] = field(default_factory=list)
    floor_all_zero: bool = False
    o_max: float = 0.0
    o_rms: float = 0.0
    ss_o: float = 0.0
    s_ko: float = 0.0
    norm_k: float = 0.0
    norm_o: float = 0.0
    zero_frac: float = 0.0
    all_zero: bool = False


def figures_of(name: str, dtype: str, red: Reduced) -> ComponentFigures:
    """The figures of one component from its reductions, whole or gathered chunk by chunk (the scale fit
    aside: see fitted_scale)."""
    fig = ComponentFigures(name, numel=red.numel, dtype=dtype)
    if red.numel == 0:
        return fig
    fig.nonfinite, fig.mismatch = red.nonfinite, red.mismatch
    fig.mismatch_inf, fig.mismatch_nan = red.mismatch_inf, red.mismatch_nan
    fig.mismatch_first = red.mismatch_first
    fig.max_err, fig.mean_err = red.max_diff, red.mean_diff
    fig.max_excess, fig.rms_excess = red.max_e, red.rms_e
    # the floor's error is the worst of its samples: one lucky rounding does not set the bar
    fig.floor_max = max([s.max for s in red.floors])
    fig.floor_rms = max([s.rms for s in red.floors])
    fig.oracle_max, fig.oracle_rms = red.o_max, red.o_rms
    fig.rel_rms = red.rms_diff / fig.oracle_rms if fig.oracle_rms > 0 else 0.0
    nk, no = red.norm_k, red.norm_o
    fig.cosine = red.s_ko / (nk * no) if nk > 0 and no > 0 else (1.0 if nk == no else 0.0)
    fig.zero_frac, fig.all_zero = red.zero_frac, red.all_zero
    fig.floor_all_zero = red.floor_all_zero
    fig.extra_bound_max = red.extra_bound_max
    return fig


def fitted_scale(fig: ComponentFigures, red: Reduced, k_max: float = K_MAX, k_rms: float = K_RMS) -> float | None:
    """The least-squares a of k ~ a*o (a scale or normalizer bug leaves little after it), or None: fitted only
    near a failure, as the per-slice profiles, since what is left after it (scaled_max, scaled_rms) costs
    one more float64 copy of the component, and a [128256, 4096] dweight's is 4.2 GB of a GPU that the
    oracle already fills. The gate is the operator's bounds."""
    tol_max, tol_rms = bounds(fig, k_max, k_rms)
    near = fig.max_excess > PROFILE_FROM_RATIO * tol_max or fig.rms_excess > PROFILE_FROM_RATIO * tol_rms
    if red.ss_o > 0 and near:
        return red.s_ko / red.ss_o
    return None


def wants_profiles(v: Verdict) -> bool:
    """Are a component's per-slice profiles and positions kept? Only near or past its bound: a diagnosis
    needs them on failing components, and every component's made the committed reports too large
    (docs/design.md, "The records")."""
    return v.failed or v.global_ratio > PROFILE_FROM_RATIO


def reduce_whole(c: Compared, samples: list[Tensor], summaries: list[FloorSummary]) -> Reduced:
    """The reductions of a whole component, each a torch reduction of the whole tensor. ``samples``: the
    floor's error samples |r_i - o_i| as tensors, ``summaries``: those already reduced."""
    ko, oo, diff, e, eb = c.ko, c.oo, c.diff, c.e, c.eb
    k_nan, k_inf, o_fin = torch.isnan(c.k), torch.isinf(c.k), torch.isfinite(c.o)
    mismatch = int(c.mismatch.sum())
    floors = []
    for x in samples:  # over the positions where both k and o are finite, non-finite floor values as 0
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))[c.fin]
        floors.append(FloorSummary(_f(x.max()) if x.numel() else 0.0, _f(_rms(x))))
    nz = oo != 0
    return Reduced(
        numel=c.o.numel(),
        nonfinite=int((k_nan | k_inf).sum()),
        mismatch=mismatch,
        mismatch_inf=int((c.mismatch & k_inf & o_fin).sum()),
        mismatch_nan=int((c.mismatch & k_nan & o_fin).sum()),
        mismatch_first=[int(i) for i in c.mismatch.nonzero()[0].tolist()] if mismatch else [],
        max_diff=_f(diff.max()) if diff.numel() else 0.0,
        mean_diff=_f(diff.mean()) if diff.numel() else 0.0,
        rms_diff=_f(_rms(ko - oo)),
        max_e=_f(e.max()) if e.numel() else 0.0,
        rms_e=_f(_rms(e)),
        extra_bound_max=_f(eb.max()) if eb is not None and eb.numel() else 0.0,
        floors=floors + summaries,
        floor_all_zero=bool(samples) and bool(torch.equal(samples[0][c.fin], oo.abs())),
        o_max=_f(oo.abs().max()) if oo.numel() else 0.0,
        o_rms=_f(_rms(oo)),
        ss_o=_f((oo * oo).sum()),
        s_ko=_f((ko * oo).sum()),
        norm_k=_f(ko.norm()),
        norm_o=_f(oo.norm()),
        zero_frac=_f((ko[nz] == 0).double().mean()) if nz.any() else 0.0,
        all_zero=bool(nz.any()) and bool((ko == 0).all()),
    )


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
    o = o.detach().to(torch.float64)
    rl = r if isinstance(r, list) else [(r.detach().to(torch.float64) - o).abs()]
    samples = [x.detach().to(torch.float64) for x in rl if isinstance(x, Tensor)]
    summaries = [x for x in rl if isinstance(x, FloorSummary)]
    if o.numel() == 0:
        return ComponentFigures(name, numel=0, dtype=_dt(dtype)), None
    c = Compared.of(k, o, extra_bound)
    red = reduce_whole(c, samples, summaries)
    fig = figures_of(name, _dt(dtype), red)
    scale = fitted_scale(fig, red, k_max, k_rms)
    if scale is not None:
        fig.scale = scale
        rest = (c.ko - scale * c.oo).abs()
        fig.scaled_max, fig.scaled_rms = _f(rest.max()), _f(_rms(rest))
        del rest
    return fig, c.excess()


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
