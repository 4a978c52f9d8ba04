"""The precision yardstick: the reference computed with its math in the case dtype (e.g. bfloat16), its errors
against the oracle per component. What "a kernel that computes in bf16" gives: the figure a precision
diagnosis cites (harness/judge/diagnose.py). Only for 16-bit cells with a component over its bound; computed
once per oracle entry and cached with it, whole or, for a chunked entry, chunk by chunk.
"""

from __future__ import annotations

import math

import torch

from ..judge.verdict import BOUNDS, verdict_of
from ..model.records import ComponentFigures
from ..model.spec import Case, Component, OperatorSpec
from .chunking import PartialSums
from .oracle import reference_run

Tensor = torch.Tensor


def _finite_diff(comp: Component, lv: Tensor, ov: Tensor, params: dict) -> Tensor:
    """|low - oracle| of a component's view, over the positions where it is finite."""
    d = (comp.select(lv, params).double() - comp.select(ov, params).double()).abs()
    return d[torch.isfinite(d)]


def low_precision_yardstick(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype,
                            rows: list[ComponentFigures]) -> None:
    """Into each component's figures, the yardstick's max and rms error (lowp_max, lowp_rms); only for
    16-bit cells with a component over its bound."""
    if dtype == torch.float32 or not any(verdict_of(f, op.k_max, op.k_rms).kind in BOUNDS for f in rows):
        return
    if ref.get("plan") is not None:
        _chunked_yardstick(op, case, ref, dtype, rows)
        return
    if "lowp" not in ref:
        try:
            outs, grads, _ = reference_run(op, ref["inputs"], ref["grad_outputs"], dtype)
            ref["lowp"] = (outs, grads)
        except Exception:  # noqa: BLE001 - a reference without a path in that dtype: no yardstick
            ref["lowp"] = None
    if ref["lowp"] is None:
        return
    outs, grads = ref["lowp"]
    for fig in rows:
        comp = op.component(fig.name)
        got, o = (outs, ref["o_out"]) if comp.kind == "out" else (grads, ref["o_grad"])
        lv, ov = got.get(comp.tensor_name), o.get(comp.tensor_name)
        if lv is None or ov is None or lv.shape != ov.shape or fig.kind != "figures":
            continue
        d = _finite_diff(comp, lv, ov, case.params)
        if d.numel():
            fig.lowp_max, fig.lowp_rms = float(d.max()), float(d.pow(2).mean().sqrt())


def _chunked_yardstick(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype,
                       rows: list[ComponentFigures]) -> None:
    """The yardstick of a chunked cell: the reference with its math in ``dtype``, chunk by chunk (its partial
    sums added pairwise in float32 and rounded to ``dtype``, as torch's own 16-bit sums accumulate), against
    the oracle; computed once per entry."""
    if "lowp_figures" not in ref:
        try:
            ref["lowp_figures"] = _chunked_figures(op, case, ref, dtype)
        except Exception:  # noqa: BLE001 - a reference without a path in that dtype: no yardstick
            ref["lowp_figures"] = None
    figs = ref["lowp_figures"]
    if figs is None:
        return
    for fig in rows:
        if fig.kind == "figures" and figs.get(fig.name) is not None:
            fig.lowp_max, fig.lowp_rms = figs[fig.name]


def _chunked_figures(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype) -> dict[str, tuple | None]:
    """(max, rms) of the yardstick's error per component: of the split tensors gathered chunk by chunk, of
    the others (their sums across chunks) from the whole result."""
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
            d = _finite_diff(comp, lv, ov, params)
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
        d = _finite_diff(comp, lv, ov, params)
        out[comp.name] = (float(d.max()), float(d.pow(2).mean().sqrt())) if d.numel() else None
    return out
