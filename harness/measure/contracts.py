"""The contracts of a backend's run besides its numbers (docs/design.md, "Contracts"): its inputs unchanged, no
write past an allocation's guard bands, the operator's invariants, and determinism across two runs, with
each component's spread between the runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..model.records import ComponentFigures, ContractResult
from ..model.registry import Backend
from ..model.spec import Case, OperatorSpec
from .streaming import max_abs_diff

Tensor = torch.Tensor


def run_contracts(op: OperatorSpec, backend: Backend, case: Case, got: dict, fresh: Callable,
                  invariants: bool = True) -> list[ContractResult]:
    """The contracts of one run; ``invariants=False`` where a result is misshapen (the invariants read the
    results in the contract's shapes). ``fresh()``: the inputs and upstream gradients the invariants read."""
    out = [
        ContractResult("input-unchanged", not got["modified"],
                       ("modified: " + ", ".join(got["modified"])) if got["modified"] else ""),
        ContractResult("guard-bands", not got["guards"], "; ".join(got["guards"][:3]),
                       {"allocations": got["allocations"]}),
    ]
    if op.invariants is not None and case.microbatches <= 1 and invariants:
        inp, g = fresh()
        fails = op.invariants(got["outs"], got["grads"], inp, case, grad_outputs=g)
        out.append(ContractResult("invariants", not fails, "; ".join(fails[:3])))
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _spread(a: dict, b: dict) -> float:
    """max |run1 - run2| over every output and gradient (0: bitwise the same; inf: NaN or shape apart)."""
    spread = 0.0
    for key in ("outs", "grads"):
        for n, v in a[key].items():
            w = b[key].get(n)
            if isinstance(v, Tensor) and isinstance(w, Tensor) and not _same(v, w):
                if v.shape != w.shape:
                    return math.inf
                spread = max(spread, max_abs_diff(v, w))
    return spread


def determinism(backend: Backend, a: dict, b: dict) -> ContractResult:
    """The determinism contract of two runs ``a`` and ``b`` (call_backend's dicts): reported either way,
    violated only by a backend that declares itself deterministic."""
    spread = _spread(a, b)
    ok = spread == 0 or not backend.deterministic
    kind = "bitwise" if spread == 0 else "different"
    return ContractResult(
        "determinism", ok,
        kind + ("" if ok else " across two runs although the backend declares itself deterministic"),
        {"max_spread": spread})


def component_spreads(op: OperatorSpec, case: Case, a: dict, b: dict, figures: list[ComponentFigures]) -> None:
    """Each component's max |run1 - run2| (matching NaNs agree): what a comparison with an earlier run must
    exceed before it calls a change in error a change in the numerics."""
    by_name = {f.name: f for f in figures}
    for c in op.components:
        fig = by_name.get(c.name)
        key = "outs" if c.kind == "out" else "grads"
        v, w = a[key].get(c.tensor_name), b[key].get(c.tensor_name)
        if fig is None or fig.kind != "figures" or not isinstance(v, Tensor) or not isinstance(w, Tensor):
            continue
        v, w = c.select(v.detach(), case.params), c.select(w.detach(), case.params)
        if v.shape != w.shape:
            fig.spread = math.inf
            continue
        fig.spread = max_abs_diff(v, w)
