"""The figures of every component of a cell: its shape first (SHAPE where the backend returned another shape or
dtype than the contract's), then its errors, floor and, near a failure, its per-slice profiles, positions and
heatmap; whole (harness/measure/figures.py) or, for a chunked entry's split tensors, chunk by chunk
(harness/measure/streaming.py).
"""

from __future__ import annotations

import torch

from ..judge.verdict import absolute_floor, transposed, verdict_of
from ..model.records import CellRecord, ComponentFigures, Status
from ..model.registry import Backend
from ..model.spec import Case, OperatorSpec
from . import localize as loc
from . import streaming
from .figures import check_shape, measure, results_of, wants_profiles
from .oracle import OutputMismatch, floor_envelope, floor_samples

Tensor = torch.Tensor


def misshapen(op: OperatorSpec, ref: dict, got: dict) -> dict[str, ComponentFigures]:
    """The SHAPE figures of each output and gradient the backend returned in another shape or dtype than the
    contract's (or as no tensor at all), by source ("out:loss", "grad:logits"). Run on a backend's results
    before anything reads them: the operator's invariants and the error figures index a result by its
    input's shape, so a gradient that a backward returned transposed raised inside them (an ERROR "raised at
    cases/softmax_xent.py:164 (in invariants), outside the adapter's files", issue #41) instead of being
    named SHAPE. A result that is missing (None) is not misshapen: it is a FAIL of its own (measure_all)."""
    out: dict[str, ComponentFigures] = {}
    for comp in op.components:
        if comp.source in out:
            continue
        res = results_of(comp, ref, got)
        if res is None or res[1] is None:
            continue
        o, k, contract = res
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            out[comp.source] = bad
    return out


def misshapen_note(op: OperatorSpec, bad: dict[str, ComponentFigures]) -> str:
    """The cell's note naming each misshapen result (see misshapen)."""
    parts = []
    for source, fig in bad.items():
        kind, name = source.split(":", 1)
        what = f"output {name!r}" if kind == "out" else f"the gradient of input {name!r}"
        parts.append(f"{what}: expected {fig.expected}, got {fig.got}{transposed(fig)}")
    return "; ".join(parts) + ("; the invariants were not checked" if op.invariants is not None else "")


def output_mismatch(op: OperatorSpec, cell: CellRecord, e: OutputMismatch) -> CellRecord:
    """SHAPE: an output missing or misshapen (checked before autograd sees it; its gradients are not judged,
    since no upstream gradient could be applied), or a gradient its autograd.Function returned misshapen."""
    cell.components = [ComponentFigures(c.name, kind="shape", expected=e.expected, got=e.got)
                       for c in op.components if c.source == e.source]
    cell.status = Status.SHAPE
    cell.notes.append(f"{e}: gradients not judged")
    return cell


def measure_all(op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict) -> list[ComponentFigures]:
    """The figures of every component of the case (shape, errors, floor, per-slice profiles)."""
    rows = []
    extra = ref["extra"]
    plan = ref.get("plan")  # a chunked entry: what it keeps no whole oracle of is measured chunk by chunk
    streamed = streaming.measure_split(op, backend, case, ref, got) if plan is not None else {}
    for comp in op.components:
        if plan is not None and plan.split(comp.tensor_name):
            if comp.name in streamed:
                rows.append(streamed[comp.name])
            continue
        res = results_of(comp, ref, got)
        if res is None:
            continue  # not part of this case (an absent optional input or output)
        o, k, contract = res
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            rows.append(bad)
            continue
        kv, ov = comp.select(k, case.params), comp.select(o, case.params)
        rv = floor_samples(ref, comp, case.params)
        fig, e = measure(comp.name, kv, ov, rv, contract, extra.get(comp.name), op.k_max, op.k_rms)
        fig.poisoned = comp.source in got.get("poisoned", ())
        floor_err = rv[0] if rv and isinstance(rv[0], Tensor) else None
        if e is not None:
            env = floor_envelope(ref, comp, case.params)
            fig.local = loc.local_figures(e, absolute_floor(contract), floor_err if env is None else env,
                                          ov.detach().double(), comp.axes, backend.blocks, case.params)
        v = verdict_of(fig, op.k_max, op.k_rms)
        if e is not None and wants_profiles(v):
            fig.slices = loc.profiles(e, kv, ov, floor_err, comp.axes, backend.blocks, case.params)
            fig.first_bad, fig.worst = loc.first_and_worst(e, v.tol_max)
            if v.failed:
                fig.grid = loc.grid(e, comp.axes, backend.blocks, case.params)
        rows.append(fig)
    return rows
