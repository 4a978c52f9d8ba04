"""The classic microbatch mistake, measured beside a microbatch cell: the gradients a backend would give if it
normalized each microbatch by its own count (a per-microbatch mean), against the oracle. A diagnosis sets the
backend's error beside it (harness/judge/diagnose.py). Whole, or chunk by chunk where a chunked entry keeps
no whole oracle of a gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..model.records import ComponentFigures
from ..model.spec import Case, OperatorSpec
from .streaming import chunks

Tensor = torch.Tensor


def _rel_rms(v: Tensor, o: Tensor) -> float | None:
    """rms(v - o) / rms(o), or None where the oracle is all zero or empty."""
    d, o = v.double() - o.double(), o.double()
    denom = float(o.pow(2).mean().sqrt()) if o.numel() else 0.0
    return float(d.pow(2).mean().sqrt()) / denom if denom > 0 else None


def naive_per_component(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor],
                        rows: list[ComponentFigures]) -> None:
    """Per gradient component, the relative rms error the classic microbatch mistake (each microbatch
    normalized by its own count) would make: a diagnosis compares the backend's error with it."""
    if ref.get("plan") is not None:
        per_comp = _chunked(op, case, ref, naive)[1]
        for fig in rows:
            if fig.kind == "figures" and per_comp.get(fig.name) is not None:
                fig.naive_rel_rms = per_comp[fig.name]
        return
    for fig in rows:
        comp = op.component(fig.name)
        v, o = naive.get(comp.tensor_name), ref["o_grad"].get(comp.tensor_name)
        if comp.kind != "grad" or v is None or o is None or fig.kind != "figures":
            continue
        rel = _rel_rms(comp.select(v, case.params), comp.select(o, case.params))
        if rel is not None:
            fig.naive_rel_rms = rel


def naive_report(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor]) -> dict[str, Any]:
    """The cell's ``microbatch`` record: per gradient, the mistake's max error and relative rms error."""
    out = {}
    if ref.get("plan") is not None:
        for n, (max_err, rel) in _chunked(op, case, ref, naive)[0].items():
            rel = rel or 0.0
            out[n] = {"max_err": max_err, "rel_rms": rel if math.isfinite(rel) else str(rel)}
        return {"k": case.microbatches, "per_microbatch_mean_error": out}
    for n, v in naive.items():
        o = ref["o_grad"].get(n)
        if o is None:
            continue
        d = (v - o).double()
        rel = _rel_rms(v, o) or 0.0
        out[n] = {
            "max_err": float(d.abs().max()) if d.numel() else 0.0,
            "rel_rms": rel if math.isfinite(rel) else str(rel),
        }
    return {"k": case.microbatches, "per_microbatch_mean_error": out}


def _gather(into: list[float], v: Tensor, o: Tensor, with_max: bool) -> None:
    """Add a part of ``v`` against the oracle's ``o`` to [max |d|, sum d^2, sum o^2, count]."""
    d, o = v.double() - o.double(), o.double()
    if with_max and d.numel():
        m = float(d.abs().max())
        into[0] = m if math.isnan(m) or math.isnan(into[0]) else max(into[0], m)
    into[1] += float(d.pow(2).sum())
    into[2] += float(o.pow(2).sum())
    into[3] += d.numel()


def _chunked(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor]
             ) -> tuple[dict[str, tuple[float, float | None]], dict[str, float | None]]:
    """Of a chunked cell's per-microbatch-mean gradients ``naive``, against the oracle: per gradient, max |naive
    - o| and rms(naive - o) / rms(o) (None where the oracle is all zero); per gradient component, the rms
    ratio (naive_report and naive_per_component, chunk by chunk where the oracle is not whole)."""
    plan, params = ref["plan"], case.params
    tensors: dict[str, list[float]] = {}  # name -> [max |d|, sum d^2, sum o^2, count]
    comps: dict[str, list[float]] = {}
    gradients = [c for c in op.components if c.kind == "grad"]

    def gather(name: str, v: Tensor, o: Tensor) -> None:
        _gather(tensors.setdefault(name, [0.0, 0.0, 0.0, 0]), v, o, True)
        for comp in gradients:
            if comp.tensor_name == name:
                _gather(comps.setdefault(comp.name, [0.0, 0.0, 0.0, 0]), comp.select(v, params),
                        comp.select(o, params), False)

    for name, v in naive.items():
        o = ref["o_grad"].get(name)
        if o is not None and not plan.split(name):
            gather(name, v, o)
    if any(plan.split(n) and ref["o_grad"].get(n) is not None for n in naive):
        for chunk, oracle, _ in chunks(op, ref, floor=False):
            for name, v in naive.items():
                if plan.split(name) and ref["o_grad"].get(name) is not None:
                    gather(name, plan.take(name, v, chunk), oracle["grad"][name])

    def rel(a: list[float]) -> float | None:
        if not a[3] or a[2] <= 0:
            return None
        return math.sqrt(a[1] / a[3]) / math.sqrt(a[2] / a[3])

    return ({n: (tensors[n][0], rel(tensors[n])) for n in naive if n in tensors},
            {c.name: rel(comps[c.name]) for c in gradients if c.name in comps})
