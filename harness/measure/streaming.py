"""Reductions that walk a tensor or a case too large to copy whole in float64.

A chunked cell's figures (harness/measure/chunking.py). When a case's oracle was evaluated in chunks
(oracle.py, ``_oracle_and_floor_chunked``), the components of tensors that have every axis of its plan are
measured here without their whole float64 oracle: for each chunk the oracle and the unnudged floor are
evaluated again and compared with the backend's part of the result (figures.Compared, as for a whole
component), and the reductions of figures.measure (a figures.Reduced) and the per-slice sums of
localize.profiles (localize.slice_terms) are gathered as sums, counts and maxima; figures.figures_of makes
the figures of them, as of a whole component's. Maxima, counts and positions are exact; sums equal the whole
tensor's up to their order (float64's 1e-16, relative). A second pass, only for components near or past
their bound, gathers what needs the bound first: the per-slice profiles, the first and worst positions, the
heatmap and the fit of a uniform scale. Nothing here keeps a tensor of the whole case's size.

Whole tensors walked piece by piece (checksum, max_abs_diff): what the input-unchanged contract and the
determinism re-run compare, without a clone or a float64 copy of a tensor past 2^31 elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..judge.verdict import FloorSummary, absolute_floor, verdict_of
from ..model.records import ComponentFigures
from ..model.registry import Backend
from ..model.spec import Case, Component, OperatorSpec
from . import localize as loc
from .figures import Compared, Reduced, check_shape, figures_of, fitted_scale, results_of, wants_profiles
from .oracle import _err, chunk_references, floor_envelope, rounded, view_box

Tensor = torch.Tensor
Box = tuple[tuple[int, int], ...]


def _lex_min(a: tuple[int, ...] | None, b: tuple[int, ...]) -> tuple[int, ...]:
    return b if a is None or b < a else a


def _shifted(at: list[int], start: tuple[int, ...]) -> tuple[int, ...]:
    """A position in a chunk as a position in the whole component (the chunk starts at ``start``)."""
    return tuple(int(i) + s for i, s in zip(at, start, strict=True))


class _Figures:
    """The reductions of figures.measure (a figures.Reduced) of one component, gathered chunk by chunk."""

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

    def add(self, c: Compared, floor: Tensor | None, start: tuple[int, ...]) -> None:
        self.numel += c.o.numel()
        self.nonfinite += int((torch.isnan(c.k) | torch.isinf(c.k)).sum())
        o_fin = torch.isfinite(c.o)
        self.mismatch += int(c.mismatch.sum())
        self.mismatch_inf += int((c.mismatch & torch.isinf(c.k) & o_fin).sum())
        self.mismatch_nan += int((c.mismatch & torch.isnan(c.k) & o_fin).sum())
        if c.mismatch.any():
            self.mismatch_first = _lex_min(self.mismatch_first, _shifted(c.mismatch.nonzero()[0].tolist(), start))
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

    def reduced(self, summaries: list[FloorSummary]) -> Reduced:
        """What was gathered, as figures.figures_of reads it; ``summaries``: the nudged floor samples'
        errors (the unnudged one was gathered here)."""
        n = max(self.n, 1)
        floor = [FloorSummary(self.floor_max, math.sqrt(self.floor_ss / n))] if self.has_floor else []
        return Reduced(
            numel=self.numel, nonfinite=self.nonfinite, mismatch=self.mismatch,
            mismatch_inf=self.mismatch_inf, mismatch_nan=self.mismatch_nan,
            mismatch_first=list(self.mismatch_first or []),
            max_diff=self.max_diff, mean_diff=self.sum_diff / n if self.n else 0.0,
            rms_diff=math.sqrt(self.ss_diff / n), max_e=self.max_e, rms_e=math.sqrt(self.ss_e / n),
            extra_bound_max=self.eb_max, floors=floor + summaries,
            floor_all_zero=self.has_floor and self.floor_all_zero,
            o_max=self.o_max, o_rms=math.sqrt(self.ss_o / n), ss_o=self.ss_o, s_ko=self.s_ko,
            norm_k=math.sqrt(self.ss_k), norm_o=math.sqrt(self.ss_o),
            zero_frac=self.n_zero / self.n_nz if self.n_nz else 0.0, all_zero=self.n_nz > 0 and self.k_all_zero)


class _Profiles:
    """localize.profiles of one component, from per-index sums and maxima along each axis."""

    def __init__(self, comp: Component, shape: tuple[int, ...], blocks: dict[str, int], params: dict) -> None:
        self.blocks, self.params, self.shape = blocks, params, shape
        self.axes = [ax for ax in comp.axes if ax.dim < len(shape)]
        self.per: list[dict[str, Tensor]] = []

    def add(self, c: Compared, e: Tensor, floor: Tensor | None, box: Box) -> None:
        if not self.per:  # on the device of the results: a chunk's per-index sums need no copy
            self.per = [{**{s: torch.zeros(self.shape[ax.dim], dtype=torch.float64, device=c.o.device)
                            for s in loc.SLICE_SUMS},
                         **{m: torch.full((self.shape[ax.dim],), -math.inf, dtype=torch.float64, device=c.o.device)
                            for m in loc.SLICE_MAXIMA}} for ax in self.axes]
        for s, term in loc.slice_terms(e, c.k, c.o, floor).items():
            v = term()
            for ax, per in zip(self.axes, self.per, strict=True):
                a, b = box[ax.dim]
                flat = v.movedim(ax.dim, 0).reshape(v.shape[ax.dim], -1)
                if s in loc.SLICE_MAXIMA:
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
                    if s in loc.SLICE_SUMS}
            sums.update({m: torch.nn.functional.pad(per[m], (0, pad), value=-math.inf).reshape(nb, group).amax(1)
                         for m in loc.SLICE_MAXIMA})
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

    def add(self, c: Compared, floor: Tensor | None, box: Box) -> None:
        start = tuple(a for a, _ in box)
        if self.scale is not None and c.ko.numel():
            rest = (c.ko - self.scale * c.oo).abs()
            self.rest_max = max(self.rest_max, float(rest.max()))
            self.rest_ss += float(rest.pow(2).sum())
        if self.profiles is None:
            return
        e = c.excess()
        self.profiles.add(c, e, floor, box)
        first, worst = loc.first_and_worst(e, self.tol_max)
        if first:
            self.first = _lex_min(self.first, _shifted(first, start))
        if worst:
            # the chunk's largest e (NaN counted as 0, as argmax saw it); the first position of the largest wins
            top, at = float(torch.nan_to_num(e[tuple(worst)], posinf=math.inf)), _shifted(worst, start)
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

    def finish(self, fig: ComponentFigures, n: int) -> None:
        """Into ``fig``, what the pass gathered (``n``: the component's finite positions)."""
        if self.scale is not None:
            fig.scaled_max, fig.scaled_rms = self.rest_max, math.sqrt(self.rest_ss / max(n, 1))
        if self.profiles is not None:
            fig.slices = self.profiles.profiles()
            fig.first_bad, fig.worst = list(self.first or []), list(self.worst[1] if self.worst else [])
        if self.grid is not None and self.grid_values is not None:
            a, b, sizes = self.grid
            fig.grid = loc.grid_record(a, b, sizes, self.grid_values)


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
    tiles: loc.LocalTiles | None = None  # the local rule's, gathered in the first pass


def chunks(op: OperatorSpec, ref: dict, floor: bool = True) -> Iterator[tuple]:
    """Each chunk of a chunked entry with its oracle (float64) and unnudged floor (rounded), again."""
    inputs, contract = ref["inputs"], ref["contract"]
    for chunk, oo, og, ro, rg in chunk_references(op, ref["plan"], inputs, ref["grad_outputs"], ref["tf32"],
                                                  floor=floor):
        ro = {n: rounded("out", n, v, inputs, contract) for n, v in ro.items()}
        rg = {n: rounded("grad", n, v, inputs, contract) for n, v in rg.items()}
        yield chunk, {"out": oo, "grad": og}, {"out": ro, "grad": rg}


def _part(s: _Split, ref: dict, chunk: tuple, oracle: dict, floor: dict, params: dict
          ) -> tuple[Compared, Tensor | None, Box]:
    comp, plan = s.comp, ref["plan"]
    name = comp.tensor_name
    o = oracle[comp.kind][name]
    r = floor[comp.kind].get(name)
    box = view_box(comp, plan, chunk, s.shape, params)
    extra = ref["extra"].get(comp.name)
    if isinstance(extra, Tensor):
        extra = extra[tuple(slice(a, b) for a, b in box)]
    c = Compared.of(comp.select(plan.take(name, s.k, chunk), params), comp.select(o, params), extra)
    err = _err(r, o)
    return c, (comp.select(err, params) if err is not None else None), box


def _split_components(op: OperatorSpec, ref: dict, got: dict, blocks: dict[str, int], params: dict
                      ) -> tuple[dict[str, ComponentFigures], list[_Split]]:
    """The components a chunked entry keeps no whole oracle of: the SHAPE figures of those misshapen, and
    the others to measure chunk by chunk."""
    rows: dict[str, ComponentFigures] = {}
    todo: list[_Split] = []
    for comp in op.components:
        res = results_of(comp, ref, got) if ref["plan"].split(comp.tensor_name) else None
        if res is None:
            continue
        o, k, contract = res
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            rows[comp.name] = bad
            continue
        s = _Split(comp, k, contract, tuple(o.shape))
        view = tuple(comp.select(torch.empty(s.shape, device="meta"), params).shape)
        layout = loc.local_layout(view, comp.axes, blocks, params)
        if layout is not None and math.prod(view):
            s.tiles = loc.LocalTiles(view, layout, k.device)
        todo.append(s)
    return rows, todo


def _first_figures(op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict, s: _Split) -> bool:
    """The figures of a component after the first pass, in ``s.fig``; True where it needs a second pass
    (a scale fit, per-slice profiles and positions, a heatmap), which ``s.second`` is then set up for."""
    comp, params = s.comp, case.params
    red = s.figs.reduced(list(ref["r_summaries"].get(comp.name, [])))
    s.fig = fig = figures_of(comp.name, str(s.dtype).replace("torch.", ""), red)
    fig.poisoned = comp.source in got.get("poisoned", ())
    fig.local = s.tiles.figures(absolute_floor(s.dtype)) if s.tiles is not None and fig.numel else None
    if fig.numel == 0:
        return False
    scale = fitted_scale(fig, red, op.k_max, op.k_rms)
    if scale is not None:
        fig.scale = scale
    v = verdict_of(fig, op.k_max, op.k_rms)
    deep = wants_profiles(v)
    if scale is None and not deep:
        return False
    view = tuple(comp.select(torch.empty(s.shape, device="meta"), params).shape)
    layout = loc.grid_layout(view, comp.axes, backend.blocks, params) if v.failed else None
    s.second = _Second(v.tol_max, scale, _Profiles(comp, view, backend.blocks, params) if deep else None, layout)
    if layout is not None:
        a, b, sizes = layout
        s.second.grid_values = torch.zeros((-(-view[a.dim] // sizes[0]), -(-view[b.dim] // sizes[1])),
                                           dtype=torch.float64)
    return True


def measure_split(op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict) -> dict[str, ComponentFigures]:
    """The figures (cell.measure_all's) of the components that a chunked entry keeps no whole oracle of."""
    rows, todo = _split_components(op, ref, got, backend.blocks, case.params)
    if not todo:
        return rows
    envelopes = {s.comp.name: floor_envelope(ref, s.comp, case.params) for s in todo}
    for chunk, oracle, floor in chunks(op, ref):
        for s in todo:
            c, r, box = _part(s, ref, chunk, oracle, floor, case.params)
            s.figs.add(c, r, tuple(a for a, _ in box))
            if s.tiles is not None:
                env = envelopes[s.comp.name]  # the local rule's floor, as for a whole case (oracle.Envelope)
                floor_err = r if env is None else env[tuple(slice(a, b) for a, b in box)].to(c.o.device)
                s.tiles.add(c.excess(), floor_err, c.o, tuple(a for a, _ in box))
    again = []
    for s in todo:
        if _first_figures(op, backend, case, ref, got, s):
            again.append(s)
        assert s.fig is not None
        rows[s.comp.name] = s.fig
    if again:
        for chunk, oracle, floor in chunks(op, ref):
            for s in again:
                c, r, box = _part(s, ref, chunk, oracle, floor, case.params)
                assert s.second is not None
                s.second.add(c, r, box)
        for s in again:
            assert s.fig is not None and s.second is not None
            s.second.finish(s.fig, s.figs.n)
    return rows


# ---- whole tensors, piece by piece ---------------------------------------------------------------------------

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
