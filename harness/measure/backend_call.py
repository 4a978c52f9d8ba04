"""The backend called on a cell's inputs, as the contracts need it: under NaN-poisoned allocations with guard
bands (harness/measure/alloc.py), its inputs and upstream gradients fingerprinted before and after, and
how it returned its results noted; for a microbatch case once per part, the parts' results combined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..model.registry import Backend
from ..model.spec import Case, Inputs, OperatorSpec
from .alloc import PoisonedAllocations
from .oracle import OutputMismatch, as_dict, combine, evaluate, microbatch_parts, naive_microbatch
from .streaming import checksum

Tensor = torch.Tensor


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def call_backend(
    op: OperatorSpec, backend: Backend, inputs: Inputs, grad_outputs: dict[str, Tensor], device: str,
    returned: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the backend once on fresh inputs under poisoned allocations; report contract data. ``returned``
    gets how the backend returned its outputs (and a backward its gradients): see _returned."""
    fwd, bwd = backend.resolve()
    before = {k: checksum(v) for k, v in inputs.tensors.items()}
    g_before = {k: checksum(v) for k, v in grad_outputs.items()}
    options = {**inputs.options, **backend.options}
    with PoisonedAllocations() as poison:
        note = {} if returned is None else returned
        if bwd is None:
            outs, grads = evaluate(op, _noting(fwd, note), inputs.tensors, options, grad_outputs)
        else:
            outs, saved = fwd(**inputs.tensors, **options)
            note["outputs"] = _returned(outs)
            outs = as_dict(op, outs)
            grads = bwd(saved, grad_outputs)
            note["grads"] = _returned(grads)
        _sync(device)
    modified = [k for k, v in inputs.tensors.items() if isinstance(v, Tensor) and checksum(v) != before[k]]
    modified += [f"grad of {k}" for k, v in grad_outputs.items() if checksum(v) != g_before[k]]
    results = [("out:" + k, v) for k, v in outs.items()] + [("grad:" + k, v) for k, v in grads.items()]
    return {
        "outs": {k: v.detach() for k, v in outs.items() if isinstance(v, Tensor)},
        "grads": {k: (v.detach() if isinstance(v, Tensor) else v) for k, v in grads.items()},
        "modified": modified,
        "guards": poison.violations(),
        "allocations": poison.count,
        # results living in buffers the harness poisoned: a NaN left there was never written
        "poisoned": {src for src, v in results if isinstance(v, Tensor) and poison.owns(v)},
        "impl": fwd,
    }


def _noting(fwd: Callable, note: dict[str, Any]) -> Callable:
    """``fwd``, noting how it returned its outputs before the harness reads them by name or position."""
    def call(**kw: Any) -> Any:
        outs = fwd(**kw)
        note["outputs"] = _returned(outs)
        return outs
    return call


def _returned(x: Any) -> dict[str, Any]:
    """How a backend returned its outputs or gradients: a dict's keys, else the type and length."""
    if isinstance(x, dict):
        return {"type": "dict", "keys": [str(k) for k in x]}
    n = 1 if isinstance(x, Tensor) else len(x) if isinstance(x, (tuple, list)) else None
    return {"type": type(x).__name__, "count": n}


def unexpected_returns(op: OperatorSpec, note: dict[str, Any], outputs: list[str]) -> dict[str, Any] | None:
    """What of ``note`` differs from the case's ``outputs`` (in the operator's order) or names no
    differentiable input. The harness reads outputs by name or position and drops the rest, so only this
    records an extra key or a tuple of the wrong length (`harness check` explains them)."""
    out: dict[str, Any] = {}
    o = note.get("outputs")
    if o is not None and (set(o["keys"]) != set(outputs) if "keys" in o else o["count"] != len(outputs)):
        out["outputs"] = {**o, "expected": outputs}
    g = note.get("grads")
    if g is not None and not set(g.get("keys", op.differentiable)) <= set(op.differentiable):
        out["grads"] = g
    return out or None


def call_microbatched(
    op: OperatorSpec,
    backend: Backend,
    inputs: Inputs,
    grad_outputs: dict[str, Tensor],
    k: int,
    seed: int,
    case: Case,
    device: str,
    returned: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The microbatch property: K unequal parts, each with the global normalizer; recombined."""
    mb = op.microbatch
    assert mb is not None
    split = list(microbatch_parts(op, inputs, grad_outputs, k, case, seed))
    runs = []
    for i, (part, g) in enumerate(split):
        tensors = {
            n: (t.detach().clone() if isinstance(t, Tensor) and t.is_floating_point() else t)
            for n, t in part.tensors.items()
        }
        runs.append(call_backend(op, backend, Inputs(tensors, part.options), g, device, returned))
        _part_conforms(runs[-1], part, g, f"microbatch {i + 1} of {len(split)}")
    combined: dict[str, Any] = {
        "outs": {},
        "grads": {},
        "modified": [],
        "guards": [],
        "allocations": 0,
        "poisoned": set(),
        "impl": runs[0]["impl"],
    }
    for key in ("outs", "grads"):
        for name in runs[0][key]:
            vals = [r[key].get(name) for r in runs]
            combined[key][name] = None if any(v is None for v in vals) else combine(mb, name, vals)
    for r in runs:
        combined["modified"] += r["modified"]
        combined["guards"] += r["guards"]
        combined["allocations"] += r["allocations"]
    combined["naive"] = naive_microbatch(op, split, mb)
    return combined


def _shape_text(t: Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}"


def _part_conforms(run: dict[str, Any], part: Inputs, grad_outputs: dict[str, Tensor], which: str) -> None:
    """A microbatch's results before they are combined (concatenated or summed): each gradient shaped as its
    input, each graded output as its upstream gradient; else OutputMismatch (the cell is SHAPE), not the
    combination's own error about sizes (issue #41: a transposed dlogits of two microbatches raised
    "Sizes of tensors must match except in dimension 0")."""
    for name, v in run["grads"].items():
        x = part.tensors.get(name)
        if v is None or not isinstance(x, Tensor) or (isinstance(v, Tensor) and v.shape == x.shape):
            continue  # a dtype of its own survives the combination: the whole result's check names it
        raise OutputMismatch(name, _shape_text(x), _shape_text(v) if isinstance(v, Tensor) else type(v).__name__,
                             source=f"grad:{name}", what=f"the gradient of input {name!r} ({which})")
    for name, v in run["outs"].items():
        g = grad_outputs.get(name)
        if isinstance(g, Tensor) and v.shape != g.shape:
            raise OutputMismatch(name, f"{list(g.shape)}", f"{list(v.shape)}", what=f"output {name!r} ({which})")
