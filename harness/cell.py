"""One cell: (operator, backend, case, dtype) run, compared with the oracle and the floor reference.

This module runs inside a worker process (see worker.py) or in-process; it returns a JSON-able
dict so that a crash of the backend costs only its own cell.
"""

from __future__ import annotations

import inspect
import math
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from . import localize as loc
from .alloc import PoisonedAllocations
from .inputs import generator, place, randn
from .provenance import file_record
from .registry import Backend
from .spec import Case, Inputs, OperatorSpec, dtype_of
from .verdict import check_shape, judge

Tensor = torch.Tensor
_ORACLE_CACHE: OrderedDict[tuple, dict] = OrderedDict()
# Extra floor-reference evaluations on perturbed inputs: the floor's error is the worst of them, so a
# lucky rounding of one evaluation (a reduction that happens to land on the exact sum) sets no bar.
FLOOR_SAMPLES = 3


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gen_inputs(op: OperatorSpec, case: Case, dtype: torch.dtype, seed: int, device: str) -> Inputs:
    return op.make_inputs(case, dtype, generator(op.name, case.name, case.params, seed), device)


def output_contract(op: OperatorSpec, tensors: dict[str, Tensor | None]) -> dict[str, torch.dtype]:
    return op.output_dtypes(tensors) if op.output_dtypes else {}


def gen_grad_outputs(
    op: OperatorSpec,
    case: Case,
    seed: int,
    tensors: dict,
    shapes: dict[str, tuple],
    dtypes: dict[str, torch.dtype],
    device: str,
) -> dict[str, Tensor]:
    gen = generator(op.name, case.name, case.params, seed, "grad")
    if op.make_grad_outputs is not None:
        return op.make_grad_outputs(tensors, case, gen, device)
    layout = case.params.get("grad_layout", "contiguous")
    out = {}
    for name in op.graded_outputs:
        if name not in shapes:
            continue
        lay = layout.get(name, "contiguous") if isinstance(layout, dict) else layout
        shape = shapes[name]
        if len(shape) == 0 or (lay.startswith("perm") and lay.count(",") + 1 != len(shape)):
            lay = "contiguous"
        values = randn(shape, gen, dtypes.get(name, torch.float32))
        if case.params.get("grad_ones"):  # the plain loss.backward() path some kernels special-case
            values = torch.ones_like(values)
        out[name] = place(values, lay, device)
    return out


def _as_dict(op: OperatorSpec, outs: Any) -> dict[str, Tensor]:
    if isinstance(outs, dict):
        return outs
    if isinstance(outs, Tensor):
        outs = (outs,)
    return dict(zip(op.outputs, outs, strict=False))


def _upcast(tensors: dict[str, Any], dt: torch.dtype) -> dict[str, Any]:
    return {
        k: (v.detach().to(dt) if isinstance(v, Tensor) and v.is_floating_point() else v) for k, v in tensors.items()
    }


def evaluate(
    op: OperatorSpec, fn: Callable, tensors: dict[str, Any], options: dict, grad_outputs: dict[str, Tensor] | None
) -> tuple[dict[str, Tensor], dict[str, Tensor | None]]:
    """Call an autograd-capable ``fn`` and differentiate the graded outputs."""
    leaves = {}
    for name in op.differentiable:
        t = tensors.get(name)
        if isinstance(t, Tensor):
            t.requires_grad_(True)
            leaves[name] = t
    outs = _as_dict(op, fn(**tensors, **options))
    if grad_outputs is None:
        return outs, {}
    pairs = [(outs[n], grad_outputs[n]) for n in op.graded_outputs if n in outs and n in grad_outputs]
    pairs = [(o, g) for o, g in pairs if isinstance(o, Tensor) and o.requires_grad]
    names = list(leaves)
    if not pairs or not names:
        return outs, {n: None for n in names}
    grads = torch.autograd.grad(
        [o for o, _ in pairs], [leaves[n] for n in names], [g.to(o.dtype) for o, g in pairs], allow_unused=True
    )
    return outs, dict(zip(names, grads, strict=True))


def reference_run(
    op: OperatorSpec, inputs: Inputs, grad_outputs: dict[str, Tensor] | None, compute: torch.dtype, tf32: bool = False
) -> tuple[dict, dict, dict]:
    t = _upcast(inputs.tensors, compute)
    g = _upcast(grad_outputs, compute) if grad_outputs is not None else None
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        outs, grads = evaluate(op, op.reference, t, inputs.options, g)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return (
        {k: v.detach() for k, v in outs.items() if isinstance(v, Tensor)},
        {k: (v.detach() if v is not None else None) for k, v in grads.items()},
        t,
    )


def _key(op: OperatorSpec, case: Case, dtype: torch.dtype, seed: int, device: str, tf32: bool) -> tuple:
    import json

    return (
        op.name,
        case.name,
        json.dumps(case.params, sort_keys=True, default=str),
        case.microbatches,
        str(dtype),
        seed,
        device,
        tf32,
    )


def oracle_and_floor(op: OperatorSpec, case: Case, dtype: torch.dtype, seed: int, device: str, tf32: bool) -> dict:
    """Oracle (float64) and floor reference (float32, rounded to contract dtypes); cached per case."""
    key = _key(op, case, dtype, seed, device, tf32)
    if key in _ORACLE_CACHE:
        _ORACLE_CACHE.move_to_end(key)
        return _ORACLE_CACHE[key]
    inputs = gen_inputs(op, case, dtype, seed, device)
    contract = output_contract(op, inputs.tensors)
    o_out, _, _ = reference_run(op, inputs, None, torch.float64)
    shapes = {k: tuple(v.shape) for k, v in o_out.items()}
    g = gen_grad_outputs(op, case, seed, inputs.tensors, shapes, contract, device)
    o_out, o_grad, t64 = reference_run(op, inputs, g, torch.float64)
    r_out, r_grad, _ = reference_run(op, inputs, g, torch.float32, tf32=tf32)
    # the floor reference's outputs and gradients rounded to what the backend must return
    r_out = {k: v.to(contract.get(k, v.dtype)) for k, v in r_out.items()}
    r_grad = {k: (v.to(inputs.tensors[k].dtype) if v is not None else None) for k, v in r_grad.items()}
    err_out = {k: [_err(v, o_out.get(k))] for k, v in r_out.items()}
    err_grad = {k: [_err(v, o_grad.get(k))] for k, v in r_grad.items()}
    pgen = generator(op.name, case.name, case.params, seed, "floor-samples")
    for _ in range(FLOOR_SAMPLES):
        pin = Inputs(_perturb(inputs.tensors, pgen), inputs.options)
        pg = _perturb(g, pgen)
        po, pgr, _ = reference_run(op, pin, pg, torch.float64)
        ro, rgr, _ = reference_run(op, pin, pg, torch.float32, tf32=tf32)
        for k, v in ro.items():
            err_out.setdefault(k, []).append(_err(v.to(contract.get(k, v.dtype)), po.get(k)))
        for k, v in rgr.items():
            if v is not None:
                err_grad.setdefault(k, []).append(_err(v.to(inputs.tensors[k].dtype), pgr.get(k)))
    if case.microbatches > 1 and op.microbatch is not None:
        # the floor under the same protocol: per-microbatch float32 results rounded, then combined
        mo, mg = _floor_microbatched(op, inputs, g, case, seed, contract, tf32)
        for k, v in mo.items():
            err_out.setdefault(k, []).append(_err(v, o_out.get(k)))
        for k, v in mg.items():
            err_grad.setdefault(k, []).append(_err(v, o_grad.get(k)))
    extra: dict[str, Any] = {}
    if op.extra_bound is not None:
        kw = (
            {"matmul_precision": "tf32"}
            if tf32 and "matmul_precision" in inspect.signature(op.extra_bound).parameters
            else {}
        )
        extra = op.extra_bound(t64, _upcast(g, torch.float64), case, **kw) or {}
    entry = {
        "inputs": inputs,
        "contract": contract,
        "grad_outputs": g,
        "o_out": o_out,
        "o_grad": o_grad,
        "r_out": err_out,
        "r_grad": err_grad,
        "extra": extra,
    }
    # one entry: a worker runs all backends of a (case, dtype) group in a row, and a second entry of a
    # large case held on the GPU starves the other workers sharing it (seen as OOM cells on an H200)
    _ORACLE_CACHE.clear()
    _ORACLE_CACHE[key] = entry
    return entry


def _err(r: Tensor | None, o: Tensor | None) -> Tensor | None:
    if r is None or o is None or r.shape != o.shape:
        return None
    return (r.double() - o.double()).abs()


def _perturb(tensors: dict[str, Any], gen: torch.Generator) -> dict[str, Any]:
    """Float inputs nudged by +-2^-22 (relative) in float32: another sample of float32 rounding."""
    out = {}
    for k, v in tensors.items():
        if isinstance(v, Tensor) and v.is_floating_point():
            sign = torch.randint(0, 2, tuple(v.shape), generator=gen).to(torch.float32) * 2 - 1
            out[k] = v.detach().to(torch.float32) * (1 + 2.0**-22 * sign.to(v.device))
        else:
            out[k] = v
    return out


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
            outs = _as_dict(op, outs)
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
    split = list(_parts(op, inputs, grad_outputs, k, case, seed))
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
            combined[key][name] = None if any(v is None for v in vals) else _combine(mb, name, vals)
    for r in runs:
        combined["modified"] += r["modified"]
        combined["guards"] += r["guards"]
        combined["allocations"] += r["allocations"]
    combined["naive"] = _naive_microbatch(op, split, mb)
    return combined


def _parts(op: OperatorSpec, inputs: Inputs, grad_outputs: dict, k: int, case: Case, seed: int):
    """The microbatches (as the backend gets them) with their slices of the upstream gradients."""
    mb = op.microbatch
    assert mb is not None
    offset = 0
    for part in mb.split(inputs, k, generator(op.name, case.name, seed, "split")):
        size = next(
            (
                part.tensors[n].shape[0]
                for n, how in mb.combine.items()
                if how == "cat0" and isinstance(part.tensors.get(n), Tensor)
            ),
            0,
        )
        g = {n: (v if mb.combine.get(n) != "cat0" else v[offset : offset + size]) for n, v in grad_outputs.items()}
        offset += size
        yield part, g


def _combine(mb: Any, name: str, vals: list[Tensor]) -> Tensor:
    if mb.combine.get(name, "sum") == "cat0":
        return torch.cat(vals, 0)
    return torch.stack([v.to(torch.float32) for v in vals]).sum(0).to(vals[0].dtype)


def _floor_microbatched(
    op: OperatorSpec, inputs: Inputs, g: dict, case: Case, seed: int, contract: dict, tf32: bool
) -> tuple[dict, dict]:
    outs: dict[str, list[Tensor]] = {}
    grads: dict[str, list[Tensor]] = {}
    for part, pg in _parts(op, inputs, g, case.microbatches, case, seed):
        ro, rg, _ = reference_run(op, part, pg, torch.float32, tf32=tf32)
        for k, v in ro.items():
            outs.setdefault(k, []).append(v.to(contract.get(k, v.dtype)))
        for k, v in rg.items():
            if v is not None:
                grads.setdefault(k, []).append(v.to(part.tensors[k].dtype))
    mb = op.microbatch
    return ({k: _combine(mb, k, v) for k, v in outs.items()}, {k: _combine(mb, k, v) for k, v in grads.items()})


def _naive_microbatch(op: OperatorSpec, split: list[tuple[Inputs, dict]], mb: Any) -> dict[str, Tensor]:
    """What the classic mistake (a per-microbatch mean) gives, computed with the oracle."""
    grads: dict[str, list[Tensor]] = {}
    for part, g in split:
        naive = Inputs(part.tensors, mb.naive_options(dict(part.options)))
        _, gr, _ = reference_run(op, naive, g, torch.float64)
        for n, v in gr.items():
            if v is not None:
                grads.setdefault(n, []).append(v)
    return {n: _combine(mb, n, v) for n, v in grads.items()}


def judge_all(
    op: OperatorSpec, backend: Backend, case: Case, ref: dict, got: dict, k_max: float, k_rms: float
) -> list[dict]:
    rows = []
    extra = ref["extra"]
    for comp in op.components:
        table_o = ref["o_out"] if comp.kind == "out" else ref["o_grad"]
        table_r = ref["r_out"] if comp.kind == "out" else ref["r_grad"]
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
        rv = [comp.select(x, case.params) for x in table_r.get(name, []) if x is not None]
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
    ref = oracle_and_floor(op, case, dtype, seed, device, tf32)
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
        again = once()
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
    if cell["status"] != "PASS" and dtype_name in backend.expected_gaps:
        cell["expected_gap"] = backend.expected_gaps[dtype_name]
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


def safe_run_cell(
    op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int = 0, repeats: int = 2
) -> dict[str, Any]:
    """run_cell, with an exception in the backend turned into an ERROR cell."""
    try:
        return run_cell(op, backend, case, dtype, device, seed, repeats)
    except torch.cuda.OutOfMemoryError as e:
        _ORACLE_CACHE.clear()
        return error_cell(
            op.name,
            backend.name,
            case,
            dtype,
            device,
            seed,
            "ERROR",
            f"OutOfMemoryError (harness or backend; other workers may share this GPU): {str(e)[:300]}",
        )
    except Exception as e:  # the backend's failure is data, not a crash of the sweep
        msg = f"{type(e).__name__}: {e}"
        status = "CRASH" if _is_device_fault(msg) else "ERROR"
        _release(device)
        return error_cell(
            op.name, backend.name, case, dtype, device, seed, status, msg[:2000], traceback.format_exc(limit=12)
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
