"""Figures of a chunked cell (harness/measure/chunking.py), measured chunk by chunk.

When a case's oracle was evaluated in chunks (oracle.py, ``_oracle_and_floor_chunked``), the components of
tensors that have every axis of its plan are measured here without their whole float64 oracle: for each
chunk the oracle and the unnudged floor are evaluated again and compared with the backend's part of the
result, and the figures of figures.measure and the per-slice sums of localize.profiles are gathered as
sums, counts and maxima. Maxima, counts and positions are exact; sums equal the whole tensor's up to
their order (float64's 1e-16, relative). A second pass, only for components near or past their bound,
gathers what needs the bound first: the per-slice profiles, the first and worst positions, the heatmap
and the fit of a uniform scale. Nothing here keeps a tensor of the whole case's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..judge.verdict import FloorSummary, bounds, verdict_of
from ..model.records import PROFILE_FROM_RATIO, ComponentFigures
from ..model.registry import Backend
from ..model.spec import Case, Component, OperatorSpec
from . import localize as loc
from .chunking import PartialSums
from .figures import check_shape
from .oracle import _err, chunk_references, reference_run, rounded, view_box

Tensor = torch.Tensor
Box = tuple[tuple[int, int], ...]


def _lex_min(a: tuple[int, ...] | None, b: tuple[int, ...]) -> tuple[int, ...]:
    return b if a is None or b < a else a


@dataclass
class _Compared:
    """One chunk of a component, as figures.measure sees the whole: backend k, oracle o (float64), the
    positions whose non-finite status differs, the finite ones and the excess error there."""

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
    def of(k: Tensor, o: Tensor, extra: Tensor | None) -> _Compared:
        k, o = k.detach().to(torch.float64), o.detach().to(torch.float64)
        k_nan, o_nan, k_inf, o_inf = torch.isnan(k), torch.isnan(o), torch.isinf(k), torch.isinf(o)
        mismatch = (k_nan != o_nan) | (k_inf != o_inf) | (k_inf & o_inf & (torch.sign(k) != torch.sign(o)))
        fin = torch.isfinite(o) & torch.isfinite(k)
        ko, oo = k[fin], o[fin]
        eb = extra.detach().to(torch.float64)[fin] if extra is not None else None
        diff = (ko - oo).abs()
        e = (diff - eb).clamp_min(0) if eb is not None else diff
        return _Compared(k, o, mismatch, fin, ko, oo, diff, e, eb)

    def excess(self) -> Tensor:
        """e over the whole chunk: 0 at non-finite positions that agree, inf where they differ."""
        out = torch.zeros_like(self.o)
        out[self.fin] = self.e
        out[self.mismatch] = math.inf
        return out


class _Figures:
    """figures.measure's figures of one component, gathered chunk by chunk."""

    def __init__(self) -> None:
        self.numel = self.nonfinite = self.mismatch = self.mismatch_inf = self.mismatch_nan = 0
        self.mismatch_first: tuple[int, ...] | None = None
        self.n = 0
        self.max_diff = self.sum_diff = self.ss_diff = self.max_e = self.ss_e = 0.0
        self.floor_max = self.floor_ss = 0.0
        self.has_floor = False
        self.floor_all_zero = True
        self.o_max = self.ss_o = self.ss_k = self.s_ko = 0.0
        self.n_nz = self.n_zero = 0
        self.k_all_zero = True
        self.eb_max = 0.0

    def add(self, c: _Compared, floor: Tensor | None, start: tuple[int, ...]) -> None:
        self.numel += c.o.numel()
        self.nonfinite += int((torch.isnan(c.k) | torch.isinf(c.k)).sum())
        o_fin = torch.isfinite(c.o)
        self.mismatch += int(c.mismatch.sum())
        self.mismatch_inf += int((c.mismatch & torch.isinf(c.k) & o_fin).sum())
        self.mismatch_nan += int((c.mismatch & torch.isnan(c.k) & o_fin).sum())
        if c.mismatch.any():
            at = tuple(int(i) + s for i, s in zip(c.mismatch.nonzero()[0].tolist(), start, strict=True))
            self.mismatch_first = _lex_min(self.mismatch_first, at)
        if floor is not None:
            self.has_floor = True
            r = floor.detach().to(torch.float64)
            self.floor_all_zero &= bool(torch.equal(r[c.fin], c.oo.abs()))
            r = torch.where(torch.isfinite(r), r, torch.zeros_like(r))[c.fin]
            if r.numel():
                self.floor_max = max(self.floor_max, float(r.max()))
                self.floor_ss += float(r.pow(2).sum())
        if c.eb is not None and c.eb.numel():
            self.eb_max = max(self.eb_max, float(c.eb.max()))
        if not c.diff.numel():
            return
        self.n += c.diff.numel()
        self.max_diff = max(self.max_diff, float(c.diff.max()))
        self.sum_diff += float(c.diff.sum())
        self.ss_diff += float(c.diff.pow(2).sum())
        self.max_e = max(self.max_e, float(c.e.max()))
        self.ss_e += float(c.e.pow(2).sum())
        self.o_max = max(self.o_max, float(c.oo.abs().max()))
        self.ss_o += float((c.oo * c.oo).sum())
        self.ss_k += float((c.ko * c.ko).sum())
        self.s_ko += float((c.ko * c.oo).sum())
        nz = c.oo != 0
        self.n_nz += int(nz.sum())
        self.n_zero += int((c.ko[nz] == 0).sum())
        self.k_all_zero &= bool((c.ko == 0).all())

    def figures(self, name: str, dtype: str, summaries: list[FloorSummary]) -> ComponentFigures:
        fig = ComponentFigures(name, numel=self.numel, dtype=dtype)
        if self.numel == 0:
            return fig
        n = max(self.n, 1)
        fig.nonfinite, fig.mismatch = self.nonfinite, self.mismatch
        fig.mismatch_inf, fig.mismatch_nan = self.mismatch_inf, self.mismatch_nan
        fig.mismatch_first = list(self.mismatch_first or [])
        fig.max_err, fig.mean_err = self.max_diff, self.sum_diff / n if self.n else 0.0
        fig.max_excess, fig.rms_excess = self.max_e, math.sqrt(self.ss_e / n)
        floor = [(self.floor_max, math.sqrt(self.floor_ss / n))] if self.has_floor else []
        fig.floor_max = max([m for m, _ in floor] + [s.max for s in summaries])
        fig.floor_rms = max([r for _, r in floor] + [s.rms for s in summaries])
        fig.oracle_max, fig.oracle_rms = self.o_max, math.sqrt(self.ss_o / n)
        fig.rel_rms = math.sqrt(self.ss_diff / n) / fig.oracle_rms if fig.oracle_rms > 0 else 0.0
        nk, no = math.sqrt(self.ss_k), math.sqrt(self.ss_o)
        fig.cosine = self.s_ko / (nk * no) if nk > 0 and no > 0 else (1.0 if nk == no else 0.0)
        fig.zero_frac = self.n_zero / self.n_nz if self.n_nz else 0.0
        fig.all_zero = self.n_nz > 0 and self.k_all_zero
        fig.floor_all_zero = self.has_floor and self.floor_all_zero
        fig.extra_bound_max = self.eb_max
        return fig


class _Profiles:
    """localize.profiles of one component, from per-index sums and maxima along each axis."""

    SUMS = ("count", "ko", "oo", "kk", "nzero", "nonz_o", "err_ss", "floor_ss", "nonfinite")
    MAXIMA = ("err_max", "floor_max", "oracle_max")

    def __init__(self, comp: Component, shape: tuple[int, ...], blocks: dict[str, int], params: dict) -> None:
        self.blocks, self.params, self.shape = blocks, params, shape
        self.axes = [ax for ax in comp.axes if ax.dim < len(shape)]
        self.per: list[dict[str, Tensor]] = []

    def add(self, c: _Compared, e: Tensor, floor: Tensor | None, box: Box) -> None:
        k, o = c.k, c.o
        if not self.per:  # on the device of the results: a chunk's per-index sums need no copy
            self.per = [{**{s: torch.zeros(self.shape[ax.dim], dtype=torch.float64, device=o.device)
                            for s in self.SUMS},
                         **{m: torch.full((self.shape[ax.dim],), -math.inf, dtype=torch.float64, device=o.device)
                            for m in self.MAXIMA}} for ax in self.axes]
        fin = torch.isfinite(k) & torch.isfinite(o)
        kf, of = torch.where(fin, k, 0.0), torch.where(fin, o, 0.0)
        e_fin = torch.where(torch.isfinite(e), e, 0.0)
        fl = torch.zeros_like(e_fin) if floor is None else torch.where(
            torch.isfinite(floor), floor.detach().to(torch.float64), 0.0)
        x = {"count": torch.ones_like(e_fin), "ko": kf * of, "oo": of * of, "kk": kf * kf,
             "nzero": ((k == 0) & (o != 0)).double(), "nonz_o": (o != 0).double(), "err_ss": e_fin * e_fin,
             "floor_ss": fl * fl, "nonfinite": (~torch.isfinite(e)).double(),
             "err_max": e, "floor_max": fl, "oracle_max": of.abs()}
        for ax, per in zip(self.axes, self.per, strict=True):
            a, b = box[ax.dim]
            for s, v in x.items():
                flat = v.movedim(ax.dim, 0).reshape(v.shape[ax.dim], -1)
                if s in self.MAXIMA:
                    per[s][a:b] = torch.maximum(per[s][a:b], flat.amax(1))
                else:
                    per[s][a:b] += flat.sum(1)

    def profiles(self) -> list:
        out = []
        for ax, per in zip(self.axes, self.per, strict=True):
            per = {s: v.cpu() for s, v in per.items()}
            n = per["count"].numel()
            size, ns, bucket, group, nb = loc.slicing(ax, n, self.blocks, self.params)
            pad = nb * group - n
            sums = {s: torch.nn.functional.pad(v, (0, pad)).reshape(nb, group).sum(1) for s, v in per.items()
                    if s in self.SUMS}
            sums.update({m: torch.nn.functional.pad(per[m], (0, pad), value=-math.inf).reshape(nb, group).amax(1)
                         for m in self.MAXIMA})
            out.append(loc.slice_profile(ax.name, size, n, ns, bucket, sums))
        return out


@dataclass
class _Second:
    """What the second pass gathers for a component near or past its bound."""

    tol_max: float
    scale: float | None
    profiles: _Profiles | None
    grid: tuple | None
    grid_values: Tensor | None = None
    first: tuple[int, ...] | None = None
    worst: tuple[float, tuple[int, ...]] | None = None
    rest_max: float = 0.0
    rest_ss: float = 0.0

    def add(self, c: _Compared, floor: Tensor | None, box: Box) -> None:
        start = tuple(a for a, _ in box)
        if self.scale is not None and c.ko.numel():
            rest = (c.ko - self.scale * c.oo).abs()
            self.rest_max = max(self.rest_max, float(rest.max()))
            self.rest_ss += float(rest.pow(2).sum())
        if self.profiles is None:
            return
        e = c.excess()
        self.profiles.add(c, e, floor, box)
        if e.dim():
            bad = (e > self.tol_max) | torch.isinf(e)
            if bad.any():
                self.first = _lex_min(self.first, tuple(int(i) + s for i, s in zip(bad.nonzero()[0].tolist(), start,
                                                                                   strict=True)))
            x = torch.nan_to_num(e, posinf=math.inf)
            at = tuple(int(i) + s for i, s in zip(torch.unravel_index(x.argmax(), e.shape), start, strict=True))
            top = float(x.max())
            if self.worst is None or top > self.worst[0] or (top == self.worst[0] and at < self.worst[1]):
                self.worst = (top, at)
        if self.grid is not None:
            self._grid(e, box)

    def _grid(self, e: Tensor, box: Box) -> None:
        a, b, sizes = self.grid
        x = torch.where(torch.isfinite(e), e, torch.full_like(e, float("inf")))
        la, lb = e.shape[a.dim], e.shape[b.dim]
        x = x.movedim((a.dim, b.dim), (0, 1)).reshape(la, lb, -1).amax(-1)
        assert self.grid_values is not None
        na, nb = self.grid_values.shape
        ia = (box[a.dim][0] + torch.arange(la, device=x.device)) // sizes[0]
        ib = (box[b.dim][0] + torch.arange(lb, device=x.device)) // sizes[1]
        # blocks start at 0, as the whole heatmap's padding: every e is >= 0, so the maxima are the same
        cols = torch.zeros((la, nb), dtype=x.dtype, device=x.device).scatter_reduce_(
            1, ib[None, :].expand(la, lb), x, "amax")
        blocks = torch.zeros((na, nb), dtype=x.dtype, device=x.device).scatter_reduce_(
            0, ia[:, None].expand(la, nb), cols, "amax")
        self.grid_values.copy_(torch.maximum(self.grid_values, blocks.cpu()))


@dataclass
class _Split:
    """A component measured chunk by chunk: the backend's whole result and what is gathered of it."""

    comp: Component
    k: Tensor
    dtype: torch.dtype
    shape: tuple[int, ...]
    figs: _Figures = field(default_factory=_Figures)
    fig: ComponentFigures | None = None
    second: _Second | None = None


def _chunks(op: OperatorSpec, ref: dict, floor: bool = True) -> Iterator[tuple]:
    """Each chunk of a chunked entry with its oracle (float64) and unnudged floor (rounded), again."""
    inputs, contract = ref["inputs"], ref["contract"]
    for chunk, oo, og, ro, rg in chunk_references(op, ref["plan"], inputs, ref["grad_outputs"], ref["tf32"],
                                                  floor=floor):
        ro = {n: rounded("out", n, v, inputs, contract) for n, v in ro.items()}
        rg = {n: rounded("grad", n, v, inputs, contract) for n, v in rg.items()}
        yield chunk, {"out": oo, "grad": og}, {"out": ro, "grad": rg}


def _part(s: _Split, ref: dict, chunk: tuple, oracle: dict, floor: dict, params: dict
          ) -> tuple[_Compared, Tensor | None, Box]:
    comp, plan = s.comp, ref["plan"]
    name = comp.tensor_name
    o = oracle[comp.kind][name]
    r = floor[comp.kind].get(name)
    box = view_box(comp, plan, chunk, s.shape, params)
    extra = ref["extra"].get(comp.name)
    if isinstance(extra, Tensor):
        extra = extra[tuple(slice(a, b) for a, b in box)]
    c = _Compared.of(comp.select(plan.take(name, s.k, chunk), params), comp.select(o, params), extra)
    err = _err(r, o)
    return c, (comp.select(err, params) if err is not None else None), box


def measure_split(op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict) -> dict[str, ComponentFigures]:
    """The figures (cell.measure_all's) of the components that a chunked entry keeps no whole oracle of."""
    plan, params = ref["plan"], case.params
    rows: dict[str, ComponentFigures] = {}
    todo: list[_Split] = []
    for comp in op.components:
        name = comp.tensor_name
        o = (ref["o_out"] if comp.kind == "out" else ref["o_grad"]).get(name)
        if not plan.split(name) or o is None:
            continue
        contract = ref["contract"].get(name, o.dtype) if comp.kind == "out" else ref["inputs"].tensors[name].dtype
        k = (got["outs"] if comp.kind == "out" else got["grads"]).get(name)
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            rows[comp.name] = bad
            continue
        todo.append(_Split(comp, k, contract, tuple(o.shape)))
    if not todo:
        return rows
    for chunk, oracle, floor in _chunks(op, ref):
        for s in todo:
            c, r, box = _part(s, ref, chunk, oracle, floor, params)
            s.figs.add(c, r, tuple(a for a, _ in box))
    again = []
    for s in todo:
        comp = s.comp
        s.fig = fig = s.figs.figures(comp.name, str(s.dtype).replace("torch.", ""),
                                     list(ref["r_summaries"].get(comp.name, [])))
        fig.poisoned = comp.source in got.get("poisoned", ())
        rows[comp.name] = fig
        if fig.numel == 0:
            continue
        tol_max, tol_rms = bounds(fig, op.k_max, op.k_rms)
        scale = None
        if s.figs.ss_o > 0 and (fig.max_excess > PROFILE_FROM_RATIO * tol_max
                                or fig.rms_excess > PROFILE_FROM_RATIO * tol_rms):
            fig.scale = scale = s.figs.s_ko / s.figs.ss_o
        v = verdict_of(fig, op.k_max, op.k_rms)
        deep = v.failed or v.worst_ratio > PROFILE_FROM_RATIO
        if scale is None and not deep:
            continue
        view = tuple(comp.select(torch.empty(s.shape, device="meta"), params).shape)
        layout = loc.grid_layout(view, comp.axes, backend.blocks, params) if v.failed else None
        s.second = _Second(v.tol_max, scale, _Profiles(comp, view, backend.blocks, params) if deep else None, layout)
        if layout is not None:
            a, b, sizes = layout
            s.second.grid_values = torch.zeros((-(-view[a.dim] // sizes[0]), -(-view[b.dim] // sizes[1])),
                                               dtype=torch.float64)
        again.append(s)
    if again:
        for chunk, oracle, floor in _chunks(op, ref):
            for s in again:
                c, r, box = _part(s, ref, chunk, oracle, floor, params)
                assert s.second is not None
                s.second.add(c, r, box)
        for s in again:
            fig, sec = s.fig, s.second
            assert fig is not None and sec is not None
            if sec.scale is not None:
                fig.scaled_max, fig.scaled_rms = sec.rest_max, math.sqrt(sec.rest_ss / max(s.figs.n, 1))
            if sec.profiles is not None:
                fig.slices = sec.profiles.profiles()
                fig.first_bad, fig.worst = list(sec.first or []), list(sec.worst[1] if sec.worst else [])
            if sec.grid is not None and sec.grid_values is not None:
                a, b, sizes = sec.grid
                fig.grid = {"axes": [a.name, b.name], "block": sizes,
                            "values": [[float(v) for v in row] for row in sec.grid_values.tolist()]}
    return rows


# ---- the precision yardstick and the microbatch mistake, of a chunked cell ---------------------------------

def low_precision(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype, rows: list[ComponentFigures]) -> None:
    """cell._low_precision_yardstick of a chunked cell: the reference with its math in ``dtype``, chunk by
    chunk (its partial sums added pairwise in float32 and rounded to ``dtype``, as torch's own 16-bit sums
    accumulate), against the oracle; computed once per entry."""
    if "lowp_figures" not in ref:
        try:
            ref["lowp_figures"] = _low_precision(op, case, ref, dtype)
        except Exception:  # noqa: BLE001 - a reference without a path in that dtype: no yardstick
            ref["lowp_figures"] = None
    figs = ref["lowp_figures"]
    if figs is None:
        return
    for fig in rows:
        if fig.kind == "figures" and figs.get(fig.name) is not None:
            fig.lowp_max, fig.lowp_rms = figs[fig.name]


def _low_precision(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype) -> dict[str, tuple | None]:
    plan, params, inputs, g = ref["plan"], case.params, ref["inputs"], ref["grad_outputs"]
    sums = PartialSums(plan, tree=True)
    acc: dict[str, list[float]] = {}  # component -> [max, sum of squares, count]
    shapes: dict[str, tuple[int, ...]] = {}
    for chunk in plan.chunks:
        cin, cg = plan.chunk_inputs(inputs, g, chunk)
        lo, lg, _ = reference_run(op, cin, cg, dtype)
        oo, og, _ = reference_run(op, cin, cg, torch.float64)
        low, orc = {"out": lo, "grad": lg}, {"out": oo, "grad": og}
        for kind in low:
            for name, t in low[kind].items():
                if t is not None and not plan.split(name):
                    shapes[name] = plan.whole_shape(name, t) if kind == "out" else tuple(inputs.tensors[name].shape)
                    sums.add(name, chunk, t.float())
        for comp in op.components:
            lv, ov = low[comp.kind].get(comp.tensor_name), orc[comp.kind].get(comp.tensor_name)
            if not plan.split(comp.tensor_name) or lv is None or ov is None or lv.shape != ov.shape:
                continue
            d = (comp.select(lv, params).double() - comp.select(ov, params).double()).abs()
            d = d[torch.isfinite(d)]
            a = acc.setdefault(comp.name, [0.0, 0.0, 0])
            if d.numel():
                a[0], a[1], a[2] = max(a[0], float(d.max())), a[1] + float(d.pow(2).sum()), a[2] + d.numel()
    out: dict[str, tuple | None] = {n: (a[0], math.sqrt(a[1] / a[2])) if a[2] else None for n, a in acc.items()}
    whole = {name: sums.result(name, shape) for name, shape in shapes.items()}
    whole = {name: t.to(dtype) if t is not None else None for name, t in whole.items()}
    for comp in op.components:
        if plan.split(comp.tensor_name):
            continue
        lv, ov = whole.get(comp.tensor_name), (ref["o_out"] if comp.kind == "out" else ref["o_grad"]).get(
            comp.tensor_name)
        if lv is None or ov is None or lv.shape != ov.shape:
            continue
        d = (comp.select(lv, params).double() - comp.select(ov, params).double()).abs()
        d = d[torch.isfinite(d)]
        out[comp.name] = (float(d.max()), float(d.pow(2).mean().sqrt())) if d.numel() else None
    return out


def naive_figures(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor]
                  ) -> tuple[dict[str, tuple[float, float | None]], dict[str, float | None]]:
    """Of a chunked cell's per-microbatch-mean gradients ``naive``, against the oracle: per gradient, max |naive
    - o| and rms(naive - o) / rms(o) (None where the oracle is all zero); per gradient component, the rms
    ratio (cell._naive_report and cell._naive_per_component, chunk by chunk where the oracle is not whole)."""
    plan, params = ref["plan"], case.params
    tensors: dict[str, list[float]] = {}  # name -> [max |d|, sum d^2, sum o^2, count]
    comps: dict[str, list[float]] = {}
    gradients = [c for c in op.components if c.kind == "grad"]

    def gather(into: list[float], v: Tensor, o: Tensor, with_max: bool) -> None:
        d, o = v.double() - o.double(), o.double()
        if with_max and d.numel():
            m = float(d.abs().max())
            into[0] = m if math.isnan(m) or math.isnan(into[0]) else max(into[0], m)
        into[1] += float(d.pow(2).sum())
        into[2] += float(o.pow(2).sum())
        into[3] += d.numel()

    for name, v in naive.items():
        o = ref["o_grad"].get(name)
        if o is None:
            continue
        if not plan.split(name):
            gather(tensors.setdefault(name, [0.0, 0.0, 0.0, 0]), v, o, True)
            for comp in gradients:
                if comp.tensor_name == name:
                    gather(comps.setdefault(comp.name, [0.0, 0.0, 0.0, 0]), comp.select(v, params),
                           comp.select(o, params), False)
    if any(plan.split(n) and ref["o_grad"].get(n) is not None for n in naive):
        for chunk, oracle, _ in _chunks(op, ref, floor=False):
            for name, v in naive.items():
                if not plan.split(name) or ref["o_grad"].get(name) is None:
                    continue
                vc, oc = plan.take(name, v, chunk), oracle["grad"][name]
                gather(tensors.setdefault(name, [0.0, 0.0, 0.0, 0]), vc, oc, True)
                for comp in gradients:
                    if comp.tensor_name == name:
                        gather(comps.setdefault(comp.name, [0.0, 0.0, 0.0, 0]), comp.select(vc, params),
                               comp.select(oc, params), False)

    def rel(a: list[float]) -> float | None:
        if not a[3] or a[2] <= 0:
            return None
        return math.sqrt(a[1] / a[3]) / math.sqrt(a[2] / a[3])

    return ({n: (tensors[n][0], rel(tensors[n])) for n in naive if n in tensors},
            {c.name: rel(comps[c.name]) for c in gradients if c.name in comps})


def checksum(t: Any, slab: int = 1 << 22) -> Any:
    """A fingerprint of a tensor's values: its shape, dtype and two index-weighted sums (wrapping int64)
    of its elements' bits, every NaN counted as the same NaN and -0 as 0 (values compared as ``==`` does,
    NaN equal to NaN, as the clones it replaces were), computed ``slab`` elements at a time. What
    the input-unchanged contract compares before and after a backend's call, instead of a clone of each
    input (a [16384, 131073] bfloat16 logits is 4.3 GB)."""
    if not isinstance(t, Tensor):
        return t
    t = t.detach()
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()]
    h1 = h2 = offset = 0
    for x in pieces(t, slab):
        x = x.contiguous()
        if x.is_floating_point():
            x = torch.where(torch.isnan(x), torch.full_like(x, math.nan), torch.where(x == 0, 0.0, x))
        bits = x.view(as_int).reshape(-1).to(torch.int64)
        idx = torch.arange(offset, offset + bits.numel(), dtype=torch.int64, device=bits.device)
        # odd weights: a change of one element always changes both sums; of several, almost never neither
        h1 += int((bits * (2 * idx + 1)).sum())
        h2 += int((bits * ((idx * 0x5851F42D4C957F2D) | 1)).sum())
        offset += bits.numel()
    return tuple(t.shape), t.dtype, h1 % 2**64, h2 % 2**64


def pieces(t: Tensor, slab: int = 1 << 22) -> Iterator[Tensor]:
    """``t`` as consecutive views in row-major order, each of at most ``slab`` elements where a dimension
    allows (a slice of whole rows, or of one row's leading dimension): what a whole-tensor reduction
    walks instead of a float64 copy of a tensor past 2^31 elements (x of mhc_pre's [1, T, n, D])."""
    if t.dim() == 0:
        yield t.reshape(1)
        return
    per = math.prod(t.shape[1:])
    if per <= slab or t.dim() == 1:
        step = max(1, slab // max(1, per))
        for i in range(0, t.shape[0], step):
            yield t[i:i + step]
        return
    for i in range(t.shape[0]):
        yield from pieces(t[i], slab)


def max_abs_diff(v: Tensor, w: Tensor) -> float:
    """max |v - w| over tensors of one shape, piece by piece in float64: NaN where both are NaN counts 0,
    NaN on one side counts inf."""
    spread = 0.0
    for a, b in zip(pieces(v.detach()), pieces(w.detach()), strict=True):
        d = (a.double() - b.double()).abs()
        d = torch.where(torch.isnan(a) & torch.isnan(b), 0.0, d)
        if d.numel():
            spread = max(spread, float(torch.nan_to_num(d, nan=math.inf).max()))
    return spread
