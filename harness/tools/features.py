"""Features of a cell, derived from its generated tensors and options, not from hand-written tags.

A preset covers another (smoke covers sweep) when, for every backend, each feature of the other's cells is
a feature of one of its own cells. The features, all operator-agnostic:

- layouts, per input and upstream gradient (``grad:<output>``) eligible for layout twins (floating, rank
  >= 1, more than one element), over its dimensions longer than 1: ``innermost stride > 1`` (the
  fastest-moving dimension has gaps: a slice of a wider buffer), ``transposed`` (dimensions stored in
  another order than row-major), ``padded`` (rows further apart than the dimensions below them need);
  ``stride 0`` (broadcast along a dimension), ``storage offset`` (a view that starts past its storage's
  start), ``unaligned`` (a data pointer off a 16-byte boundary); and per pair of them ``distinct strides``
  (same shape, different strides) and ``distinct innermost strides`` (last dimensions' strides differ);
- sizes, along each component axis (by its name): ``> 1`` (more than one slice: H > 1, B > 1), and against
  the backend's declared block of that axis: ``< BLOCK``, ``= BLOCK``, ``> BLOCK, not a multiple`` (a
  multiple beyond it is none of these);
- options passed to the backend (each value class: a string or integer's value, a float's sign, on/off,
  unset) and ``microbatches > 1``.

:func:`uncovered` lists, per backend, what one preset has that another lacks (tests/test_coverage.py asserts
that smoke lacks nothing of sweep, for every operator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..measure.oracle import gen_grad_outputs, gen_inputs, output_contract, reference_run
from ..model.registry import Backend
from ..model.spec import Case, OperatorSpec, dtype_of
from ..model.twins import ALIGN, GRAD, eligible
from ..run.plan import plan

Tensor = torch.Tensor


@dataclass
class CaseFacts:
    """What a case's draw says, before any backend: its layout and option features, and the size of each
    component axis (axis name, block key or None, size along the axis, number of slices)."""

    features: set[str] = field(default_factory=set)
    sizes: list[tuple[str, str | None, int, int]] = field(default_factory=list)

    def for_backend(self, blocks: dict[str, int]) -> set[str]:
        """The features of this case's cell of a backend with these declared blocks."""
        out = set(self.features)
        for axis, key, size, slices in self.sizes:
            if slices > 1:
                out.add(f"{axis} > 1")
            cls = block_class(axis, key, size, blocks[key]) if key is not None and key in blocks else None
            if cls is not None:
                out.add(cls)
        return out


def block_class(axis: str, key: str, size: int, block: int) -> str | None:
    """Where ``size`` stands against a block: below it, equal to it, or beyond it with a partial last block
    (None: a multiple beyond it, several whole blocks)."""
    if size < block:
        return f"{axis} < {key}"
    if size == block:
        return f"{axis} = {key}"
    return f"{axis} > {key}, not a multiple" if size % block else None


def layout_features(tensors: dict[str, object]) -> set[str]:
    """Layout classes of each eligible tensor, and of each pair of them (names in the given order)."""
    named = [(n, t) for n, t in tensors.items() if eligible(t)]
    out: set[str] = set()
    for name, t in named:
        assert isinstance(t, Tensor)
        dims = [d for d in range(t.dim()) if t.size(d) > 1]
        if not dims:
            continue
        if t.storage_offset() > 0:
            out.add(f"{name}: storage offset")
        if t.data_ptr() % ALIGN:
            out.add(f"{name}: unaligned")
        if any(t.stride(d) == 0 for d in dims):
            out.add(f"{name}: stride 0")  # broadcast: no memory order to speak of
            continue
        order = sorted(dims, key=lambda d: (-t.stride(d), -d))  # memory order, slowest first
        if order != dims:
            out.add(f"{name}: transposed")
        if t.stride(order[-1]) > 1:
            out.add(f"{name}: innermost stride > 1")
        if any(t.stride(slow) > t.stride(fast) * t.size(fast) for slow, fast in zip(order, order[1:], strict=False)):
            out.add(f"{name}: padded")
    for i, (a, ta) in enumerate(named):
        for b, tb in named[i + 1:]:
            assert isinstance(ta, Tensor) and isinstance(tb, Tensor)
            if ta.shape == tb.shape and _strides(ta) != _strides(tb):
                out.add(f"{a}, {b}: distinct strides")
            if ta.size(-1) > 1 and tb.size(-1) > 1 and ta.stride(-1) != tb.stride(-1):
                out.add(f"{a}, {b}: distinct innermost strides")
    return out


def _strides(t: Tensor) -> tuple[int, ...]:
    # a dimension of one element is never stepped along: its stride says nothing
    return tuple(t.stride(d) for d in range(t.dim()) if t.size(d) > 1)


def option_features(options: dict[str, object], microbatches: int) -> set[str]:
    """One feature per option: its value class (floats by sign: a strength such as smoothing is on or off)."""
    out = {"microbatches > 1"} if microbatches > 1 else set()
    for k, v in options.items():
        if v is None:
            out.add(f"{k} unset")
        elif isinstance(v, bool):
            out.add(k if v else f"not {k}")
        elif isinstance(v, (int, str)):
            out.add(f"{k} = {v}")
        elif isinstance(v, float):
            out.add(f"{k} > 0" if v > 0 else f"{k} < 0" if v < 0 else f"{k} = 0")
    return out


def case_facts(op: OperatorSpec, case: Case, dtype: str, device: str = "cpu") -> CaseFacts:
    """Draw the case's inputs and upstream gradients as a cell does (seed 0) and read its features off them."""
    inputs = gen_inputs(op, case, dtype_of(dtype), 0, device)
    outs, _, _ = reference_run(op, inputs, None, torch.float64)
    grads = gen_grad_outputs(op, case, 0, inputs.tensors, {k: tuple(v.shape) for k, v in outs.items()},
                             output_contract(op, inputs.tensors), device)
    facts = CaseFacts()
    facts.features = layout_features({**inputs.tensors, **{GRAD + k: v for k, v in grads.items()}})
    facts.features |= option_features(inputs.options, case.microbatches)
    for comp in op.components:
        t = (outs if comp.kind == "out" else inputs.tensors).get(comp.tensor_name)
        if not isinstance(t, Tensor):
            continue
        view = comp.select(t, case.params)
        for axis in comp.axes:
            if axis.dim >= view.dim():
                continue
            size = view.shape[axis.dim]
            group = max(1, int(case.params.get(axis.group_param, 1))) if axis.group_param else 1
            facts.sizes.append((axis.name, axis.block, size, math.ceil(size / group)))
    return facts


def preset_features(op: OperatorSpec, preset: str, backends: list[Backend], device: str = "cpu") -> dict[str, set[str]]:
    """Per backend, the union of the features of the preset's cells it runs (or would run on a machine that
    has its device): cells it declares unsupported take no part."""

    tasks = plan([op.name], preset, [b.name for b in backends], None, device).tasks
    facts: dict[str, CaseFacts] = {}
    out: dict[str, set[str]] = {b.name: set() for b in backends}
    blocks = {b.name: dict(b.blocks) for b in backends}
    for t in tasks:
        if t.skip_kind == "unsupported":
            continue
        if t.case.name not in facts:
            facts[t.case.name] = case_facts(op, t.case, t.dtype, device)
        out[t.backend] |= facts[t.case.name].for_backend(blocks[t.backend])
    return out


def uncovered(op: OperatorSpec, backends: list[Backend], covering: str = "smoke", covered: str = "sweep",
              device: str = "cpu") -> dict[str, list[str]]:
    """Per backend, the features of preset ``covered`` that no cell of preset ``covering`` has."""
    small = preset_features(op, covering, backends, device)
    large = preset_features(op, covered, backends, device)
    return {b: sorted(large[b] - small[b]) for b in large if large[b] - small[b]}
