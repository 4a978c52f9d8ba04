"""Chunk plans of a separable operator (``OperatorSpec.separable``): which chunks a case is cut into, how
each input, output, upstream gradient and gradient slices, and how partial sums over chunks combine.

The oracle and the floor of a large case are evaluated chunk by chunk (harness/measure/oracle.py) and judged as
they come (harness/measure/streaming.py), so that neither the float64 autograd graph of the whole problem nor its
float64 results exist at once. A case is cut only when its estimated float64 working set exceeds the
budget (``HARNESS_ORACLE_CHUNK_MB``, default ``DEFAULT_MB``); ``HARNESS_ORACLE_CHUNK`` forces a number of
slices per chunk (tests force tiny chunks to compare with the whole evaluation). The plan depends on the
shapes and these two settings only, never on the memory free at the time, so that figures reproduce.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..judge.verdict import FloorSummary
from ..model.spec import Inputs, OperatorSpec

Tensor = torch.Tensor
Range = tuple[int, int]
Chunk = tuple[Range, ...]  # one (start, stop) per axis, outer axes first

ENV_SLICES = "HARNESS_ORACLE_CHUNK"
ENV_MB = "HARNESS_ORACLE_CHUNK_MB"
DEFAULT_MB = 2048
# Bytes that one element of a sliced input costs in a chunk's working set, when the operator does not say
# (Separable.slice_bytes): the float64 reference's autograd graph (about ten tensors of the input's size in
# references/softmax_xent.py), then the measurement's float64 temporaries (oracle, floor, backend, masks,
# errors: about a dozen). 24 float64 values per element.
SLICE_FACTOR = 24 * 8


@dataclass(frozen=True)
class ChunkPlan:
    """How one case is cut: ``chunks`` in order, each a range per axis; ``dims`` maps every tensor that
    runs along an axis (inputs and, once resolved, outputs; gradients and upstream gradients go with
    their input and output) to {axis index: its dim}; ``options`` go to every chunk's reference call."""

    axes: tuple[str, ...]
    extents: tuple[int, ...]
    dims: dict[str, dict[int, int]]
    chunks: tuple[Chunk, ...]
    options: dict[str, Any]
    # outputs named on the axes, before resolve() has seen which of them have those dimensions
    declared: dict[str, dict[int, int]]
    resolved: bool = False
    # where each chunk is evaluated when the whole case's tensors are kept on the host (see on_host):
    # None, the chunks stay where the tensors are
    device: str | None = None

    def describe(self) -> str:
        """What a cell's note says of it."""
        sizes = {math.prod(b - a for a, b in c) for c in self.chunks}
        return (f"oracle and floor evaluated in {len(self.chunks)} chunks of at most {max(sizes)} slices along "
                f"{' x '.join(self.axes)}: the float32 floor's library calls (GEMMs) ran at the chunk's shape, "
                "where they may round less than at the whole case's (docs/design.md, 'Large cases')")

    def split(self, name: str) -> bool:
        """Does this tensor have every axis (its chunks are its parts, not partial sums)?"""
        return len(self.dims.get(name, {})) == len(self.axes)

    def index(self, name: str, chunk: Chunk) -> tuple[slice, ...]:
        own = self.dims.get(name, {})
        idx = [slice(None)] * (max(own.values()) + 1 if own else 0)
        for i, d in own.items():
            idx[d] = slice(*chunk[i])
        return tuple(idx)

    def take(self, name: str, t: Any, chunk: Chunk) -> Any:
        """The chunk's part of tensor ``name`` (a view; the whole tensor if it has no axis)."""
        return t[self.index(name, chunk)] if isinstance(t, Tensor) and name in self.dims else t

    def box(self, name: str, chunk: Chunk, shape: tuple[int, ...]) -> tuple[Range, ...]:
        """Where the chunk's part of tensor ``name`` lies in the whole: a range per dimension."""
        own = {d: chunk[i] for i, d in self.dims.get(name, {}).items()}
        return tuple(own.get(d, (0, n)) for d, n in enumerate(shape))

    def region(self, name: str, chunk: Chunk) -> tuple[tuple[int, Range], ...]:
        """The key of the part of a partially summed tensor that this chunk adds to."""
        return tuple(sorted((i, chunk[i]) for i in self.dims.get(name, {})))

    def chunk_inputs(self, inputs: Inputs, grad_outputs: dict[str, Tensor] | None, chunk: Chunk,
                     signs: dict[str, Tensor] | None = None, rel: float = 0.0
                     ) -> tuple[Inputs, dict[str, Tensor] | None]:
        """The chunk's inputs and upstream gradients, nudged by ``signs`` (see draw_signs) when given."""
        if grad_outputs is not None and not self.resolved:
            raise AssertionError("a plan slices upstream gradients once its outputs are resolved (resolve())")

        def part(name: str, v: Any) -> Any:
            v = self.take(name, v, chunk)
            if self.device is not None and isinstance(v, Tensor):
                v = v.to(self.device, non_blocking=False)
            if signs is None or name not in signs:
                return v
            sign = signs[name]
            if isinstance(sign, ChunkSigns):
                return nudge(v, sign.draw(v, chunk), rel)
            return nudge(v, self.take(name, sign, chunk).to(v.device), rel)

        tensors = {n: part(n, v) for n, v in inputs.tensors.items()}
        g = None if grad_outputs is None else {n: part(n, v) for n, v in grad_outputs.items()}
        return Inputs(tensors, {**inputs.options, **self.options}), g

    def whole_shape(self, name: str, t: Tensor) -> tuple[int, ...]:
        """The shape of tensor ``name`` in the whole case, from its part ``t`` in a chunk."""
        shape = list(t.shape)
        for i, d in self.dims.get(name, {}).items():
            shape[d] = self.extents[i]
        return tuple(shape)

    def resolve(self, outs: dict[str, Tensor]) -> tuple[ChunkPlan, dict[str, tuple[int, ...]]]:
        """The plan with its outputs' dims, from the outputs of the first chunk, and the whole case's
        output shapes: an output with every dimension it is named on runs along those axes; one with none
        of them (a loss reduced to a scalar) is a partial sum."""
        dims = dict(self.dims)
        shapes: dict[str, tuple[int, ...]] = {}
        first = self.chunks[0]
        for name, t in outs.items():
            shape = list(t.shape)
            decl = self.declared.get(name, {})
            have = {i: d for i, d in decl.items() if d < t.dim()}
            if have and len(have) != len(decl):
                raise ValueError(f"output {name!r} of shape {list(t.shape)} has some of the dims its separable "
                                 f"axes name ({decl}) but not all: expected all of them or none")
            for i, d in have.items():
                if shape[d] != first[i][1] - first[i][0]:
                    raise ValueError(f"output {name!r}: dim {d} has {shape[d]} entries for a chunk of "
                                     f"{first[i][1] - first[i][0]} along axis {self.axes[i]!r}: the separable "
                                     "axis does not describe this output")
                shape[d] = self.extents[i]
            if have:
                dims[name] = have
            shapes[name] = tuple(shape)
        return replace(self, dims=dims, resolved=True), shapes


def plan(op: OperatorSpec, inputs: Inputs, single: bool = False) -> ChunkPlan | None:
    """The chunks of this case, or None when the operator declares no separable axis or (unless ``single``)
    the whole case fits one chunk. Outputs are resolved later (ChunkPlan.resolve), from a chunk's outputs."""
    sep = op.separable
    if sep is None:
        return None
    dims: dict[str, dict[int, int]] = {}
    declared: dict[str, dict[int, int]] = {}
    extents = []
    for i, ax in enumerate(sep.axes):
        extent = None
        for name, d in ax.dims.items():
            if name in op.outputs:
                declared.setdefault(name, {})[i] = d
                continue
            t = inputs.tensors.get(name)
            if not isinstance(t, Tensor):
                continue
            if d >= t.dim():
                raise ValueError(f"operator {op.name!r}: separable axis {ax.name!r} names dim {d} of input "
                                 f"{name!r}, which has shape {list(t.shape)}")
            if extent is not None and t.shape[d] != extent:
                raise ValueError(f"operator {op.name!r}: separable axis {ax.name!r}: input {name!r} has "
                                 f"{t.shape[d]} entries along it (dim {d}), another input {extent}")
            extent = t.shape[d]
            dims.setdefault(name, {})[i] = d
        if extent is None:
            raise ValueError(f"operator {op.name!r}: no input of this case runs along separable axis "
                             f"{ax.name!r} ({ax.dims})")
        extents.append(extent)
    total = math.prod(extents)
    k = slices_per_chunk(op, inputs, dims, total)
    if (total <= 1 or k >= total) and not single:
        return None
    options = sep.options(inputs) if sep.options is not None else {}
    return ChunkPlan(tuple(ax.name for ax in sep.axes), tuple(extents), dims, tuple(_chunks(extents, k)),
                     dict(options), declared)


def slices_per_chunk(op: OperatorSpec, inputs: Inputs, dims: dict[str, dict[int, int]], total: int) -> int:
    """How many slices (indices of the axes, flattened) one chunk takes: forced by HARNESS_ORACLE_CHUNK,
    else as many as the budget HARNESS_ORACLE_CHUNK_MB holds at the operator's bytes per slice."""
    forced = os.environ.get(ENV_SLICES, "").strip()
    if forced:
        if not forced.isdigit() or int(forced) < 1:
            raise ValueError(f"{ENV_SLICES}={forced!r}: expected a positive number of slices per chunk")
        return int(forced)
    budget = _budget()
    sep = op.separable
    assert sep is not None
    if sep.slice_bytes is not None:
        per = float(sep.slice_bytes(inputs))
    else:
        sliced = sum(t.numel() for n, t in inputs.tensors.items() if n in dims and isinstance(t, Tensor))
        per = SLICE_FACTOR * sliced / max(total, 1)
    return max(1, int(budget // max(per, 1.0)))


def _chunks(extents: list[int], k: int) -> list[Chunk]:
    """Boxes of at most ``k`` slices in row-major order: whole ranges of the outer axis when ``k`` covers
    the inner axes, else one outer index at a time with the inner axes cut likewise."""
    if not extents:
        return [()]
    inner = math.prod(extents[1:])
    if k >= inner:
        step = k // inner
        rest = tuple((0, e) for e in extents[1:])
        return [((a, min(a + step, extents[0])), *rest) for a in range(0, extents[0], step)]
    return [((a, a + 1), *r) for a in range(extents[0]) for r in _chunks(extents[1:], k)]


# ---- the floor's nudged samples -------------------------------------------------------------------------

def draw_signs(tensors: dict[str, Any], gen: torch.Generator, per_chunk: bool = False) -> dict[str, Any]:
    """The sign (0 or 1) of every element's nudge, for each float tensor in order: a seed from ``gen``, then
    the draw on the tensor's own device (drawn on the CPU and copied, they cost seconds per sample for a
    [4096, 32000] input). One byte per element: the values are those of a float32 draw (torch.randint
    draws the same integers whatever the dtype). ``per_chunk``: only the seed (ChunkSigns), each chunk
    drawing its own signs where it is evaluated; for a case kept on the host (ChunkPlan.device), whose
    whole-size draw on the host would cost a minute per sample and on the device the memory it saves."""
    out: dict[str, Any] = {}
    for k, v in tensors.items():
        if isinstance(v, Tensor) and v.is_floating_point():
            seed = int(torch.randint(0, 2**62, (1,), generator=gen))
            if per_chunk:
                out[k] = ChunkSigns(seed)
                continue
            dev_gen = torch.Generator(device=v.device)
            dev_gen.manual_seed(seed)
            out[k] = torch.randint(0, 2, tuple(v.shape), generator=dev_gen, device=v.device, dtype=torch.uint8)
    return out


@dataclass(frozen=True)
class ChunkSigns:
    """The signs of one tensor's nudge drawn chunk by chunk: from its seed and the chunk, on the chunk's
    device. Another sample of the floor's rounding than the whole draw's, as good a one."""

    seed: int

    def draw(self, part: Tensor, chunk: Chunk) -> Tensor:
        gen = torch.Generator(device=part.device)
        gen.manual_seed(hash((self.seed, chunk)) % 2**62)
        return torch.randint(0, 2, tuple(part.shape), generator=gen, device=part.device, dtype=torch.uint8)


def on_host(tensors: dict[str, Any]) -> dict[str, Any]:
    """The tensors copied to the host (values only: the oracle's math does not depend on their layout)."""
    return {k: v.detach().to("cpu") if isinstance(v, Tensor) else v for k, v in tensors.items()}


def nudge(v: Tensor, sign: Tensor, rel: float) -> Tensor:
    """``v`` in float32 times 1 +- ``rel``: one more sample of the floor's rounding."""
    return v.detach().to(torch.float32) * (1 + rel * (sign.to(torch.float32) * 2 - 1))


# ---- partial sums over chunks ---------------------------------------------------------------------------

class _Tree:
    """A pairwise (tree) sum of partials as they come, in their own dtype: what a careful kernel's tree
    reduction of per-block partials gives. It holds one partial per level of the tree, at most ``levels``
    of them; the trees of 2**levels partials that complete past that are added to a running sum."""

    def __init__(self, levels: int = 62) -> None:
        self.levels: list[Tensor | None] = []
        self.cap = levels
        self.top: Tensor | None = None

    def add(self, x: Tensor) -> None:
        for i, y in enumerate(self.levels):
            if y is None:
                self.levels[i] = x
                return
            x = y.add_(x)  # a fresh partial of the caller's, or a sum of them
            self.levels[i] = None
        if len(self.levels) < self.cap:
            self.levels.append(x)
        else:
            self.top = x if self.top is None else self.top.add_(x)

    def total(self) -> Tensor:
        out = self.top
        for y in reversed(self.levels):  # the oldest, largest trees first
            if y is not None:
                out = y if out is None else out.add_(y)
        assert out is not None
        return out


def tree_levels(nbytes: int) -> int:
    """How many levels of pairwise partial sums of ``nbytes`` each the chunk budget holds: all that a
    gradient of a few MB needs; none for fused_linear_xent's dweight at V=128256, H=4096 (2.1 GB in float32),
    whose partials are then added in a running float32 sum, as kernels accumulate it over row blocks."""
    return max(0, min(62, int(_budget() // max(nbytes, 1)) - 1))


def _budget() -> float:
    mb = os.environ.get(ENV_MB, "").strip()
    try:
        return float(mb) * 2**20 if mb else DEFAULT_MB * 2**20
    except ValueError:
        raise ValueError(f"{ENV_MB}={mb!r}: expected a number of megabytes") from None


class _Running:
    """A running sum in place (the float64 oracle: its rounding is far below any figure)."""

    def __init__(self) -> None:
        self.acc: Tensor | None = None

    def add(self, x: Tensor) -> None:
        # the partials are the caller's fresh results, never seen again: added in place
        self.acc = x if self.acc is None else self.acc.add_(x)

    def total(self) -> Tensor:
        assert self.acc is not None
        return self.acc


class PartialSums:
    """The partial sums of the tensors that lack an axis, per region (the part of the tensor a chunk adds
    to: the whole tensor when it has no axis at all), combined pairwise (``tree``, as far as the chunk
    budget holds the tree's levels: tree_levels) or in a running sum."""

    def __init__(self, plan: ChunkPlan, tree: bool) -> None:
        self.plan, self.tree = plan, tree
        self.parts: dict[str, dict[tuple, _Tree | _Running]] = {}
        self.none: set[str] = set()

    def add(self, name: str, chunk: Chunk, t: Tensor | None) -> None:
        if t is None:
            self.none.add(name)
            return
        key = self.plan.region(name, chunk)
        regions = self.parts.setdefault(name, {})
        if key not in regions:
            regions[key] = _Tree(tree_levels(t.numel() * t.element_size())) if self.tree else _Running()
        regions[key].add(t)

    def result(self, name: str, shape: tuple[int, ...]) -> Tensor | None:
        if name in self.none or name not in self.parts:
            return None
        regions = self.parts.pop(name)
        if len(regions) == 1 and next(iter(regions)) == ():
            return regions[()].total()
        out = None
        for key, acc in regions.items():
            t = acc.total()
            if out is None:
                out = torch.zeros(shape, dtype=t.dtype, device=t.device)
            idx = [slice(None)] * len(shape)
            own = self.plan.dims[name]
            for i, r in key:
                idx[own[i]] = slice(*r)
            out[tuple(idx)] = t
        return out


class SummaryAcc:
    """A FloorSummary (verdict.py) gathered chunk by chunk: the max exactly, the rms from a float64 sum of
    squares (equal to the whole tensor's up to the order of that sum)."""

    def __init__(self) -> None:
        self.max, self.ss, self.n, self.seen = 0.0, 0.0, 0, False

    def add(self, err: Tensor, oracle: Tensor) -> None:
        self.seen = True
        x = torch.where(torch.isfinite(err), err, torch.zeros_like(err))[torch.isfinite(oracle)]
        if x.numel():
            self.max = max(self.max, float(x.max()))
            self.ss += float(x.pow(2).sum())
            self.n += x.numel()

    def summary(self) -> FloorSummary:
        return FloorSummary(self.max, math.sqrt(self.ss / self.n) if self.n else 0.0)
