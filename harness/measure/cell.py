"""One cell: (operator, backend, case, dtype) run, compared with the oracle and the floor reference.

This module runs inside a worker process (see worker.py) or in-process; it returns a CellRecord of
figures (harness/model/records.py), never a verdict's wording: reports judge the figures when they render.
"""

from __future__ import annotations

import inspect
import math
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ..judge.verdict import transposed, verdict_of
from ..model.records import PROFILE_FROM_RATIO, CellRecord, ComponentFigures, ContractResult, Status
from ..model.registry import Backend
from ..model.spec import Case, Inputs, OperatorSpec, dtype_of
from ..store.provenance import file_record
from . import localize as loc
from . import streaming
from .alloc import PoisonedAllocations
from .digests import input_digest, oracle_code
from .figures import check_shape, measure
from .oracle import (
    OutputMismatch,
    as_dict,
    clear_cache,
    combine,
    evaluate,
    floor_samples,
    gen_grad_outputs,
    gen_inputs,
    microbatch_parts,
    naive_microbatch,
    oracle_and_floor,
    reference_run,
)

Tensor = torch.Tensor


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def call_backend(
    op: OperatorSpec, backend: Backend, inputs: Inputs, grad_outputs: dict[str, Tensor], device: str,
    returned: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the backend once on fresh inputs under poisoned allocations; report contract data. ``returned``
    gets how the backend returned its outputs (and a backward its gradients): see _returned."""
    fwd, bwd = backend.resolve()
    before = {k: streaming.checksum(v) for k, v in inputs.tensors.items()}
    g_before = {k: streaming.checksum(v) for k, v in grad_outputs.items()}
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
    modified = [k for k, v in inputs.tensors.items() if isinstance(v, Tensor) and streaming.checksum(v) != before[k]]
    modified += [f"grad of {k}" for k, v in grad_outputs.items() if streaming.checksum(v) != g_before[k]]
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


def _unexpected(op: OperatorSpec, note: dict[str, Any], outputs: list[str]) -> dict[str, Any] | None:
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


def misshapen(op: OperatorSpec, ref: dict, got: dict[str, Any]) -> dict[str, ComponentFigures]:
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
        name = comp.tensor_name
        o = (ref["o_out"] if comp.kind == "out" else ref["o_grad"]).get(name)
        k = (got["outs"] if comp.kind == "out" else got["grads"]).get(name)
        if o is None or k is None:
            continue
        contract = ref["contract"].get(name, o.dtype) if comp.kind == "out" else ref["inputs"].tensors[name].dtype
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            out[comp.source] = bad
    return out


def _misshapen_note(op: OperatorSpec, bad: dict[str, ComponentFigures]) -> str:
    parts = []
    for source, fig in bad.items():
        kind, name = source.split(":", 1)
        what = f"output {name!r}" if kind == "out" else f"the gradient of input {name!r}"
        parts.append(f"{what}: expected {fig.expected}, got {fig.got}{transposed(fig)}")
    return "; ".join(parts) + ("; the invariants were not checked" if op.invariants is not None else "")


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
        table_o = ref["o_out"] if comp.kind == "out" else ref["o_grad"]
        table_k = got["outs"] if comp.kind == "out" else got["grads"]
        name = comp.tensor_name
        o = table_o.get(name)
        if o is None:
            continue  # not part of this case (an absent optional input or output)
        contract = ref["contract"].get(name, o.dtype) if comp.kind == "out" else ref["inputs"].tensors[name].dtype
        k = table_k.get(name)
        bad = check_shape(comp.name, k, tuple(o.shape), contract)
        if bad is not None:
            rows.append(bad)
            continue
        kv, ov = comp.select(k, case.params), comp.select(o, case.params)
        rv = floor_samples(ref, comp, case.params)
        fig, e = measure(comp.name, kv, ov, rv, contract, extra.get(comp.name), op.k_max, op.k_rms)
        fig.poisoned = comp.source in got.get("poisoned", ())
        v = verdict_of(fig, op.k_max, op.k_rms)
        if e is not None and (v.failed or v.worst_ratio > PROFILE_FROM_RATIO):
            floor_err = rv[0] if rv and isinstance(rv[0], Tensor) else None
            fig.slices = loc.profiles(e, kv, ov, floor_err, comp.axes, backend.blocks, case.params)
            fig.first_bad, fig.worst = loc.first_and_worst(e, v.tol_max)
            if v.failed:
                fig.grid = loc.grid(e, comp.axes, backend.blocks, case.params)
        rows.append(fig)
    return rows


def _low_precision_yardstick(op: OperatorSpec, case: Case, ref: dict, dtype: torch.dtype,
                             rows: list[ComponentFigures]) -> None:
    """The reference computed with its math in the case dtype (e.g. bfloat16), its errors against the
    oracle per failing component: what "a kernel that computes in bf16" gives, the yardstick a precision
    diagnosis cites. Only for 16-bit cells with a component over its bound; cached with the oracle."""
    if dtype == torch.float32 or not any(verdict_of(f, op.k_max, op.k_rms).kind == "bound" for f in rows):
        return
    if ref.get("plan") is not None:
        streaming.low_precision(op, case, ref, dtype, rows)
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
        d = (comp.select(lv, case.params).double() - comp.select(ov, case.params).double()).abs()
        d = d[torch.isfinite(d)]
        if d.numel():
            fig.lowp_max, fig.lowp_rms = float(d.max()), float(d.pow(2).mean().sqrt())


def _determinism(a: dict, b: dict) -> float:
    """max |run1 - run2| over every output and gradient (0: bitwise the same; inf: NaN or shape apart)."""
    spread = 0.0
    for key in ("outs", "grads"):
        for n, v in a[key].items():
            w = b[key].get(n)
            if isinstance(v, Tensor) and isinstance(w, Tensor) and not _same(v, w):
                if v.shape != w.shape:
                    return math.inf
                spread = max(spread, streaming.max_abs_diff(v, w))
    return spread


def _component_spreads(op: OperatorSpec, case: Case, a: dict, b: dict, figures: list[ComponentFigures]) -> None:
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
        fig.spread = streaming.max_abs_diff(v, w)


def run_cell(
    op: OperatorSpec, backend: Backend, case: Case, dtype_name: str, device: str, seed: int = 0, repeats: int = 2
) -> CellRecord:
    """Everything measured about one cell."""
    t0 = time.time()
    dtype = dtype_of(dtype_name)
    cell = CellRecord(operator=op.name, backend=backend.name, dtype=dtype_name, case=case, device=device,
                      seed=seed, matmul_precision=backend.matmul_precision, blocks=dict(backend.blocks))
    tf32 = backend.matmul_precision == "tf32"
    try:
        ref = oracle_and_floor(op, case, dtype, seed, device, tf32)
    except torch.cuda.OutOfMemoryError as e:
        raise OracleOutOfMemory(str(e)) from e
    # the blocks the draw and the oracle's chunks left cached would count in this cell's peak (reserved)
    # beside the backend's, and need not fit the backend's tensors (H100, mhc_pre T65537: 8.2 GB of them)
    _release(device)
    t_ref = time.time() - t0
    if ref.get("plan") is not None:
        cell.notes.append(ref["plan"].describe())

    def fresh() -> tuple[Inputs, dict[str, Tensor]]:
        inp = gen_inputs(op, case, dtype, seed, device)
        shapes = {k: tuple(v.shape) for k, v in ref["o_out"].items()}
        return inp, gen_grad_outputs(op, case, seed, inp.tensors, shapes, ref["contract"], device)

    returned: dict[str, Any] = {}

    def once() -> dict[str, Any]:
        inp, g = fresh()
        if case.microbatches > 1:
            return call_microbatched(op, backend, inp, g, case.microbatches, seed, case, device, returned)
        return call_backend(op, backend, inp, g, device, returned)

    t1 = time.time()
    outputs = [n for n in op.outputs if n in ref["o_out"]]
    try:
        got, cell.backend_peak_mb = _alone(device, once)
    except OutputMismatch as e:
        cell.returned = _unexpected(op, returned, outputs)
        return _output_mismatch(op, cell, e)
    cell.returned = _unexpected(op, returned, outputs)
    cell.backend_s = round(time.time() - t1, 4)
    impl = got.pop("impl")
    try:
        cell.impl_file = file_record(inspect.getsourcefile(impl) or "")
    except TypeError:
        cell.impl_file = None
    # every result's shape and dtype before anything reads it (the invariants, the error figures)
    bad = misshapen(op, ref, got)
    if bad:
        cell.notes.append(_misshapen_note(op, bad))
    cell.components = measure_all(op, backend, case, ref, got)
    _low_precision_yardstick(op, case, ref, dtype, cell.components)
    marked = ref["extra"].get("_marked")
    if marked is not None:
        cell.kink_marked = int(marked)
    def readable() -> tuple[Inputs, dict[str, Tensor]]:
        """The inputs the invariants read: a chunked case's oracle copy (never written; on the host when
        large, so that no second copy of a case past 2^31 elements lands on the GPU), else a fresh one."""
        if ref.get("plan") is not None:
            return ref["inputs"], ref["grad_outputs"]
        return fresh()

    cell.contracts = _contracts(op, backend, case, got, readable, invariants=not bad)
    if "naive" in got:
        cell.microbatch = _naive_report(op, case, ref, got["naive"])
        _naive_per_component(op, case, ref, got["naive"], cell.components)
    if repeats > 1:
        # a chunked case's results wait on the host while the backend runs again: the GPU then holds one
        # run's results, as the backend alone does (the two runs are compared there)
        parked = ref.get("plan") is not None and device.startswith("cuda")
        if parked:
            got = _to_host(got)
            _release(device)
        t2 = time.time()
        again = once()
        if parked:
            again = _to_host(again)
        # the same call again: next to backend_s, what compilation and other first-call costs took
        cell.backend_again_s = round(time.time() - t2, 4)
        again.pop("impl")
        _component_spreads(op, case, got, again, cell.components)
        spread = _determinism(got, again)
        ok = spread == 0 or not backend.deterministic
        kind = "bitwise" if spread == 0 else "different"
        cell.contracts.append(ContractResult(
            "determinism", ok,
            kind + ("" if ok else " across two runs although the backend declares itself deterministic"),
            {"max_spread": spread}))
    verdicts = [verdict_of(f, op.k_max, op.k_rms).verdict for f in cell.components]
    if any(v == "FAIL" for v in verdicts) or not all(c.ok for c in cell.contracts):
        cell.status = Status.FAIL
    elif any(v == "SHAPE" for v in verdicts):
        cell.status = Status.SHAPE
    cell.reference_s = round(t_ref, 4)
    cell.duration_s = round(time.time() - t0, 4)
    return cell


def _to_host(got: dict[str, Any]) -> dict[str, Any]:
    """A backend run's results (call_backend's dict) with every tensor moved to the host."""
    def host(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.detach().to("cpu")
        return {k: host(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {k: host(v) for k, v in got.items()}


class _Peaks:
    """The GPU peaks of the running cell before _alone reset the allocator's counters to measure the
    backend's call on its own (the worker records the cell's peaks: peak_reserved_mb, peak_allocated_mb)."""

    reserved = 0
    allocated = 0


def reset_peaks() -> None:
    """At a cell's start, on a GPU."""
    _Peaks.reserved = _Peaks.allocated = 0
    torch.cuda.reset_peak_memory_stats()


def peak_reserved_mb() -> float:
    """What the cell held on the GPU at most (reserved by the caching allocator), across _alone's resets."""
    return round(max(_Peaks.reserved, torch.cuda.max_memory_reserved()) / 2**20)


def peak_allocated_mb() -> float:
    """What the cell's tensors took on the GPU at most, across _alone's resets: on the basis of
    backend_peak_mb (reserved memory adds the allocator's fragmentation, an eager backend's most of all)."""
    return round(max(_Peaks.allocated, torch.cuda.max_memory_allocated()) / 2**20)


def _alone(device: str, call: Callable[[], Any]) -> tuple[Any, float | None]:
    """``call()``, and on a GPU the memory it allocated at most beyond what was allocated before it: what the
    backend's call needs on its own (its inputs, outputs, gradients, workspace), to set the harness's
    share of the cell's peak against."""
    if not device.startswith("cuda"):
        return call(), None
    torch.cuda.synchronize()
    _Peaks.reserved = max(_Peaks.reserved, torch.cuda.max_memory_reserved())
    _Peaks.allocated = max(_Peaks.allocated, torch.cuda.max_memory_allocated())
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    return result, round((torch.cuda.max_memory_allocated() - base) / 2**20)


def _output_mismatch(op: OperatorSpec, cell: CellRecord, e: OutputMismatch) -> CellRecord:
    """SHAPE: an output missing or misshapen (checked before autograd sees it; its gradients are not judged,
    since no upstream gradient could be applied), or a gradient its autograd.Function returned misshapen."""
    cell.components = [ComponentFigures(c.name, kind="shape", expected=e.expected, got=e.got)
                       for c in op.components if c.source == e.source]
    cell.status = Status.SHAPE
    cell.notes.append(f"{e}: gradients not judged")
    return cell


def _contracts(op: OperatorSpec, backend: Backend, case: Case, got: dict, fresh: Callable,
               invariants: bool = True) -> list[ContractResult]:
    """The contracts of one run; ``invariants=False`` where a result is misshapen (the invariants read the
    results in the contract's shapes)."""
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


def _rel_rms(v: Tensor, o: Tensor) -> float | None:
    """rms(v - o) / rms(o), or None where the oracle is all zero or empty."""
    d, o = v.double() - o.double(), o.double()
    denom = float(o.pow(2).mean().sqrt()) if o.numel() else 0.0
    return float(d.pow(2).mean().sqrt()) / denom if denom > 0 else None


def _naive_per_component(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor],
                         rows: list[ComponentFigures]) -> None:
    """Per gradient component, the relative rms error the classic microbatch mistake (each microbatch
    normalized by its own count) would make: a diagnosis compares the backend's error with it."""
    if ref.get("plan") is not None:
        per_comp = streaming.naive_figures(op, case, ref, naive)[1]
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


def _naive_report(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor]) -> dict[str, Any]:
    out = {}
    if ref.get("plan") is not None:
        for n, (max_err, rel) in streaming.naive_figures(op, case, ref, naive)[0].items():
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


def error_cell(
    op_name: str, backend: str, case: Case, dtype: str, device: str, seed: int, status: str, message: str, tb: str = ""
) -> CellRecord:
    """A cell without figures: SKIP, ERROR, CRASH or TIMEOUT, with its message."""
    return CellRecord(operator=op_name, backend=backend, dtype=dtype, case=case, device=device, seed=seed,
                      status=Status(status), error=message, traceback=tb)


def _release(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _is_out_of_memory(msg: str) -> bool:
    return any(m in msg for m in ("[CUDA]: out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                                  "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"))


class OracleOutOfMemory(torch.cuda.OutOfMemoryError):
    """The harness's own float64 oracle or float32 floor ran out of device memory (not the backend)."""


def safe_run_cell(
    op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int = 0, repeats: int = 2
) -> CellRecord:
    """run_cell, with an exception in the backend turned into an ERROR cell; a failing cell carries the
    digest of its inputs for its repro bundle (see _with_input_digest)."""
    cell = _run_cell_or_error(op, backend, case, dtype, device, seed, repeats)
    return _with_input_digest(cell, op, case, device)


def _with_input_digest(cell: CellRecord, op: OperatorSpec, case: Case, device: str) -> CellRecord:
    """Every cell names its inputs by digest (a repro bundle checks its replay against it; a comparison with
    an earlier run needs the same inputs), and the code of its oracle. Taken here from the worker's own
    draws (cached), not regenerated later by the parent one cell after another: for the 18 failing cells
    of a V=128256 sweep that regeneration (13 s each on 2 cores) added over a minute to the run's end.
    Not after a device fault, whose CUDA context is gone, nor after running out of memory: the runner
    reruns such a cell, and its draws were just dropped to free the GPU (drawing them again for a
    digest would cost seconds per try)."""
    if cell.status in (Status.SKIP, Status.CRASH, Status.TIMEOUT) or is_oom(cell):
        return cell
    try:
        cell.oracle_code = oracle_code(op.name)
    except Exception:  # noqa: BLE001 - without it the cell is only "not comparable"
        pass

    try:
        cell.inputs_sha256, cell.inputs_bytes = input_digest(op, case, dtype_of(cell.dtype), cell.seed, device)
    except Exception:  # noqa: BLE001 - the bundle then regenerates them, as before
        pass
    return cell


def _run_cell_or_error(
    op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int, repeats: int
) -> CellRecord:
    try:
        return run_cell(op, backend, case, dtype, device, seed, repeats)
    except torch.cuda.OutOfMemoryError as e:
        return _out_of_memory_cell(op, backend, case, dtype, device, seed, e)
    except Exception as e:  # the backend's failure is data, not a crash of the sweep
        msg = f"{type(e).__name__}: {e}"
        if _is_out_of_memory(msg):
            # a Triton launch or a CUDA call that could not get memory says so in its own words
            # ("Triton Error [CUDA]: out of memory", seen on an H100 shared by 8 workers)
            return _out_of_memory_cell(op, backend, case, dtype, device, seed, e)
        status = "CRASH" if _is_device_fault(msg) else "ERROR"
        _release(device)
        return error_cell(
            op.name, backend.name, case, dtype, device, seed, status, msg[:2000], traceback.format_exc(limit=12)
        )


def is_oom(cell: CellRecord) -> bool:
    """An ERROR cell of _out_of_memory_cell (the runner reruns those)."""
    return cell.status == Status.ERROR and cell.error.startswith("OutOfMemoryError")


def _out_of_memory_cell(op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int,
                        e: Exception) -> CellRecord:
    clear_cache()
    # the "OutOfMemoryError" prefix is what the runner looks for to rerun the cell alone
    who = ("in the harness's oracle (float64 reference and float32 floors: the case is too large "
           "for this GPU, whatever the backend)" if isinstance(e, OracleOutOfMemory) else
           "in the backend or the harness's checks")
    detail = str(e) if isinstance(e, torch.cuda.OutOfMemoryError) else f"{type(e).__name__}: {e}"
    shared = os.environ.get("HARNESS_GPU_SHARED") == "1"
    return error_cell(
        op.name,
        backend.name,
        case,
        dtype,
        device,
        seed,
        "ERROR",
        f"OutOfMemoryError {who}; "
        f"{'other workers share this GPU' if shared else 'this worker had the GPU to itself'}: "
        f"{detail[:300]}",
    )


def _is_device_fault(msg: str) -> bool:
    m = msg.lower()
    return any(
        s in m
        for s in (
            "illegal memory access",
            "misaligned address",
            "unspecified launch failure",
            "device-side assert",
            "an illegal instruction",
            "cuda error: launch failure",
        )
    )
