"""One cell: (operator, backend, case, dtype) run, compared with the oracle and the floor reference.

This module runs inside a worker process (see worker.py) or in-process; it returns a JSON-able
dict so that a crash of the backend costs only its own cell.
"""

from __future__ import annotations

import inspect
import math
import os
import time
import traceback
from typing import Any

import torch

from . import localize as loc
from .alloc import PoisonedAllocations
from .oracle import (
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
)
from .provenance import file_record
from .registry import Backend
from .spec import Case, Inputs, OperatorSpec, dtype_of
from .verdict import check_shape, judge

Tensor = torch.Tensor


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _fingerprint(t: Any) -> Any:
    return t.detach().clone() if isinstance(t, Tensor) else t


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def call_backend(
    op: OperatorSpec, backend: Backend, inputs: Inputs, grad_outputs: dict[str, Tensor], device: str
) -> dict[str, Any]:
    """Run the backend once on fresh inputs under poisoned allocations; report contract data."""
    fwd, bwd = backend.resolve()
    before = {k: _fingerprint(v) for k, v in inputs.tensors.items()}
    g_before = {k: _fingerprint(v) for k, v in grad_outputs.items()}
    options = {**inputs.options, **backend.options}
    with PoisonedAllocations() as poison:
        if bwd is None:
            outs, grads = evaluate(op, fwd, inputs.tensors, options, grad_outputs)
        else:
            outs, saved = fwd(**inputs.tensors, **options)
            outs = as_dict(op, outs)
            grads = bwd(saved, grad_outputs)
        _sync(device)
    modified = [k for k, v in inputs.tensors.items() if isinstance(v, Tensor) and not _same(v.detach(), before[k])]
    modified += [f"grad of {k}" for k, v in grad_outputs.items() if not _same(v, g_before[k])]
    return {
        "outs": {k: v.detach() for k, v in outs.items() if isinstance(v, Tensor)},
        "grads": {k: (v.detach() if isinstance(v, Tensor) else v) for k, v in grads.items()},
        "modified": modified,
        "guards": poison.violations(),
        "allocations": poison.count,
        "impl": fwd,
    }


def call_microbatched(
    op: OperatorSpec,
    backend: Backend,
    inputs: Inputs,
    grad_outputs: dict[str, Tensor],
    k: int,
    seed: int,
    case: Case,
    device: str,
) -> dict[str, Any]:
    """The microbatch property: K unequal parts, each with the global normalizer; recombined."""
    mb = op.microbatch
    assert mb is not None
    split = list(microbatch_parts(op, inputs, grad_outputs, k, case, seed))
    runs = []
    for part, g in split:
        tensors = {
            n: (t.detach().clone() if isinstance(t, Tensor) and t.is_floating_point() else t)
            for n, t in part.tensors.items()
        }
        runs.append(call_backend(op, backend, Inputs(tensors, part.options), g, device))
    combined: dict[str, Any] = {
        "outs": {},
        "grads": {},
        "modified": [],
        "guards": [],
        "allocations": 0,
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


def judge_all(
    op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict, k_max: float, k_rms: float
) -> list[dict]:
    rows = []
    extra = ref["extra"]
    for comp in op.components:
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
            rows.append(bad.to_json())
            continue
        kv, ov = comp.select(k, case.params), comp.select(o, case.params)
        rv = floor_samples(ref, comp, case.params)
        eb = extra.get(comp.name)
        res, e = judge(comp.name, kv, ov, rv, contract, eb, k_max, k_rms)
        if res.verdict != "PASS" and e is not None:
            res.localization = loc.localize(e, kv, ov, comp.axes, res.tol_max, res.tol_rms, backend.blocks, case.params)
            res.localization["text"] = loc.describe(res.localization)
            g = loc.grid(e, comp.axes, backend.blocks, case.params)
            if g is not None:
                res.localization["grid"] = g
            res.hint = loc.diagnose(res.localization, res)
        rows.append(res.to_json())
    return rows


def _determinism(a: dict, b: dict) -> str:
    same = True
    for key in ("outs", "grads"):
        for n, v in a[key].items():
            w = b[key].get(n)
            if isinstance(v, Tensor) and isinstance(w, Tensor) and not _same(v, w):
                same = False
    return "bitwise" if same else "different"


def run_cell(
    op: OperatorSpec, backend: Backend, case: Case, dtype_name: str, device: str, seed: int = 0, repeats: int = 2
) -> dict[str, Any]:
    """Everything about one cell, as a JSON-able dict."""
    t0 = time.time()
    dtype = dtype_of(dtype_name)
    cell: dict[str, Any] = {
        "operator": op.name,
        "backend": backend.name,
        "dtype": dtype_name,
        "case": case.to_json(),
        "device": device,
        "seed": seed,
        "status": "PASS",
        "components": [],
        "contracts": [],
        "notes": [],
    }
    tf32 = backend.matmul_precision == "tf32"
    try:
        ref = oracle_and_floor(op, case, dtype, seed, device, tf32)
    except torch.cuda.OutOfMemoryError as e:
        raise OracleOutOfMemory(str(e)) from e
    t_ref = time.time() - t0

    def fresh() -> tuple[Inputs, dict[str, Tensor]]:
        inp = gen_inputs(op, case, dtype, seed, device)
        shapes = {k: tuple(v.shape) for k, v in ref["o_out"].items()}
        return inp, gen_grad_outputs(op, case, seed, inp.tensors, shapes, ref["contract"], device)

    def once() -> dict[str, Any]:
        inp, g = fresh()
        if case.microbatches > 1:
            return call_microbatched(op, backend, inp, g, case.microbatches, seed, case, device)
        return call_backend(op, backend, inp, g, device)

    t1 = time.time()
    got = once()
    cell["backend_s"] = round(time.time() - t1, 4)
    impl = got.pop("impl")
    try:
        cell["impl_file"] = file_record(inspect.getsourcefile(impl) or "")
    except TypeError:
        cell["impl_file"] = None
    rows = judge_all(op, backend, case, ref, got, op.k_max, op.k_rms)
    cell["components"] = rows
    marked = ref["extra"].get("_marked")
    if marked is not None:
        cell["notes"].append(f"kink: {int(marked)} element(s) marked; extra_bound applied")
        cell["kink_marked"] = int(marked)
    contracts = cell["contracts"]
    contracts.append(
        {
            "name": "input-unchanged",
            "ok": not got["modified"],
            "detail": ("modified: " + ", ".join(got["modified"])) if got["modified"] else "",
        }
    )
    contracts.append(
        {
            "name": "guard-bands",
            "ok": not got["guards"],
            "detail": "; ".join(got["guards"][:3]),
            "allocations": got["allocations"],
        }
    )
    if op.invariants is not None and case.microbatches <= 1:
        inp, g = fresh()
        fails = op.invariants(got["outs"], got["grads"], inp, case, grad_outputs=g)
        contracts.append({"name": "invariants", "ok": not fails, "detail": "; ".join(fails[:3])})
    if repeats > 1:
        t2 = time.time()
        again = once()
        # the same call again: next to backend_s, what compilation and other first-call costs took
        cell["backend_again_s"] = round(time.time() - t2, 4)
        again.pop("impl")
        kind = _determinism(got, again)
        ok = kind == "bitwise" or not backend.deterministic
        contracts.append(
            {
                "name": "determinism",
                "ok": ok,
                "detail": kind + ("" if ok else " across two runs although the backend declares itself deterministic"),
            }
        )
    if "naive" in got:
        cell["microbatch"] = _naive_report(op, case, ref, got["naive"])
    verdicts = [r["verdict"] for r in rows]
    if any(v == "FAIL" for v in verdicts) or not all(c["ok"] for c in contracts):
        cell["status"] = "FAIL"
    elif any(v == "SHAPE" for v in verdicts):
        cell["status"] = "SHAPE"
    gap = backend.expected_gap(dtype_name, case.tags)
    if cell["status"] != "PASS" and gap:
        cell["expected_gap"] = gap
    cell["reference_s"] = round(t_ref, 4)
    cell["duration_s"] = round(time.time() - t0, 4)
    return cell


def _naive_report(op: OperatorSpec, case: Case, ref: dict, naive: dict[str, Tensor]) -> dict[str, Any]:
    out = {}
    for n, v in naive.items():
        o = ref["o_grad"].get(n)
        if o is None:
            continue
        d = (v - o).double()
        denom = o.double().pow(2).mean().sqrt().item()
        rel = d.pow(2).mean().sqrt().item() / denom if denom > 0 else 0.0
        out[n] = {
            "max_err": float(d.abs().max()) if d.numel() else 0.0,
            "rel_rms": rel if math.isfinite(rel) else str(rel),
        }
    return {"k": case.microbatches, "per_microbatch_mean_error": out}


def error_cell(
    op_name: str, backend: str, case: Case, dtype: str, device: str, seed: int, status: str, message: str, tb: str = ""
) -> dict[str, Any]:
    return {
        "operator": op_name,
        "backend": backend,
        "dtype": dtype,
        "case": case.to_json(),
        "device": device,
        "seed": seed,
        "status": status,
        "error": message,
        "traceback": tb,
        "components": [],
        "contracts": [],
        "notes": [],
    }


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
) -> dict[str, Any]:
    """run_cell, with an exception in the backend turned into an ERROR cell; a failing cell carries the
    digest of its inputs for its repro bundle (see _with_input_digest)."""
    cell = _run_cell_or_error(op, backend, case, dtype, device, seed, repeats)
    return _with_input_digest(cell, op, case, device)


def _with_input_digest(cell: dict[str, Any], op: OperatorSpec, case: Case, device: str) -> dict[str, Any]:
    """The repro bundle of a failing cell names its inputs by digest. Taken here from the worker's own
    draws, not regenerated later by the parent one cell after another: for the 18 failing cells of
    a V=128256 sweep that regeneration (13 s each on 2 cores) added over a minute to the run's end.
    Not after a device fault, whose CUDA context is gone, nor after running out of memory: the runner
    reruns such a cell, and its draws were just dropped to free the GPU (drawing them again for a
    digest would cost seconds per try)."""
    if cell["status"] not in ("FAIL", "SHAPE", "ERROR") or cell.get("expected_gap") or is_oom(cell):
        return cell
    from .repro import input_digest

    try:
        cell["inputs_sha256"], cell["inputs_bytes"] = input_digest(op, case, dtype_of(cell["dtype"]),
                                                                   cell["seed"], device)
    except Exception:  # noqa: BLE001 - the bundle then regenerates them, as before
        pass
    return cell


def _run_cell_or_error(
    op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int, repeats: int
) -> dict[str, Any]:
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


def is_oom(cell: dict) -> bool:
    """An ERROR cell of _out_of_memory_cell (the runner reruns those)."""
    return cell.get("status") == "ERROR" and str(cell.get("error", "")).startswith("OutOfMemoryError")


def _out_of_memory_cell(op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int,
                        e: Exception) -> dict[str, Any]:
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
