"""`harness bench`: forward/backward times, peak extra memory and roofline fractions per backend.

How a call is timed, and the device's copy bandwidth and GEMM throughput measured in the same run (so
fractions and ratios never mix devices): bench_timing.py. Declared targets judged on the figures:
perf_targets.py. The report's JSON and markdown: bench_report.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..measure.oracle import as_dict, gen_grad_outputs, gen_inputs, output_contract
from ..model import registry
from ..model.spec import Case, OperatorSpec, dtype_name, dtype_of
from ..store.provenance import run_provenance
from .bench_report import write_bench_report
from .bench_timing import copy_bandwidth, gemm_tflops, kernel_breakdown, sync_device, timed_into, timeit


def _leaves(op: OperatorSpec, tensors: dict) -> dict[str, torch.Tensor]:
    """The operator's differentiable input tensors, set to require gradients (what a backward returns)."""
    out = {}
    for n in op.differentiable:
        t = tensors.get(n)
        if isinstance(t, torch.Tensor):
            t.requires_grad_(True)
            out[n] = t
    return out


def cases_for(op: OperatorSpec, device: str) -> list[Case]:
    """The operator's bench cases on a GPU; elsewhere its first smoke case (production shapes would take
    hours on a CPU, where the figures only show that the path works)."""
    if device.startswith("cuda") and op.bench_cases:
        return op.bench_cases("cuda")
    return op.cases("smoke", device.split(":")[0])[:1]


def cpu_interpret(device: str) -> None:
    """Triton backends run on CPU tensors only under the interpreter, which must be chosen before their
    kernels are first imported (benchmarks run in-process, unlike conformance cells)."""
    if device.startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def bench_calls(
    op: OperatorSpec, b: registry.Backend, case: Case, dtype: torch.dtype, device: str
) -> dict[str, Any]:
    """The timed callables of one backend on one case: forward, backward_only, fwd_bwd (None without
    gradients), plus the ``forward_nograd`` of an autograd backend, ``refresh`` (a new forward, untimed, for
    the next backward_only: a backward consumes what its forward held) and ``clear`` to drop the held graph.
    Shared by ``harness bench`` and the pytest-benchmark items."""
    inputs = gen_inputs(op, case, dtype, 0, device)
    contract = output_contract(op, inputs.tensors)
    fwd_fn, bwd_fn = b.resolve()
    opts = {**inputs.options, **b.options}
    leaves = _leaves(op, inputs.tensors)

    def forward():
        r = fwd_fn(**inputs.tensors, **opts)
        return r if bwd_fn is not None else (as_dict(op, r), None)

    outs, saved = forward()
    outs = as_dict(op, outs)
    shapes = {k: tuple(v.shape) for k, v in outs.items() if isinstance(v, torch.Tensor)}
    grads = gen_grad_outputs(op, case, 0, inputs.tensors, shapes, contract, device)
    # held in a dict so that the first forward's graph can be dropped before the memory measurement
    st: dict[str, Any] = {}

    def hold(outs: dict, saved: Any) -> None:
        st["saved"] = saved
        st["pairs"] = [(outs[n], grads[n]) for n in op.graded_outputs
                       if n in outs and n in grads and outs[n].requires_grad]

    hold(outs, saved)
    del outs, saved

    def refresh() -> None:
        st.clear()
        o, s = forward()
        hold(as_dict(op, o), s)

    def backward_only():
        # one backward per forward, as training runs it: a backend may keep state for exactly one backward
        # (held logits, gradients written over an input), and a retained graph's later backwards time
        # whatever it does without that state
        if bwd_fn is not None:
            return bwd_fn(st["saved"], grads)
        return torch.autograd.grad(
            [o for o, _ in st["pairs"]],
            list(leaves.values()),
            [g for _, g in st["pairs"]],
            allow_unused=True,
        )

    def fwd_bwd():
        o, s = forward()
        o = as_dict(op, o)
        if bwd_fn is not None:
            return bwd_fn(s, grads)
        ps = [(o[n], grads[n]) for n in op.graded_outputs if n in o and n in grads and o[n].requires_grad]
        return torch.autograd.grad([x for x, _ in ps], list(leaves.values()), [g for _, g in ps], allow_unused=True)

    def forward_nograd():
        with torch.no_grad():
            return fwd_fn(**inputs.tensors, **opts)

    has_grad = bool(st["pairs"]) or bwd_fn is not None
    return {
        "forward": forward,
        "forward_nograd": forward_nograd if bwd_fn is None else None,
        "backward_only": backward_only if has_grad else None,
        "refresh": refresh,
        "fwd_bwd": fwd_bwd if has_grad else None,
        "clear": st.clear,
    }


def measure(
    op: OperatorSpec, b: registry.Backend, case: Case, dtype: torch.dtype, device: str, reps: int = 0,
    profile: bool = False,
) -> dict[str, Any]:
    """One backend's row on one case and dtype: times (median and spread), the kernels with ``profile`` on a
    GPU, and there the peak memory of one forward+backward beyond its inputs."""
    calls = bench_calls(op, b, case, dtype, device)
    forward, fwd_bwd = calls["forward"], calls["fwd_bwd"]
    row: dict[str, Any] = {
        "backend": b.name,
        "role": b.role,
        "case": case.name,
        "params": case.params,
        "dtype": dtype_name(dtype),
    }
    if any(x.contract == "input-unchanged" for x in b.contract_exceptions):
        # the timed calls share one set of inputs, and this backend writes them by design: every call after
        # the first runs on what the one before it wrote (the same sizes, other values)
        row["input_note"] = ("writes its inputs by design (declared): timed calls after the first run on the "
                             "values the call before wrote")
    row["fwd_nograd_ms"] = timeit(calls["forward_nograd"], reps) if calls["forward_nograd"] else None
    timed_into(row, "fwd_ms", forward, reps)
    has_grad = fwd_bwd is not None
    if has_grad:
        timed_into(row, "bwd_ms", calls["backward_only"], reps, setup=calls["refresh"])
        timed_into(row, "fwd_bwd_ms", fwd_bwd, reps)
    if profile and device.startswith("cuda"):
        row["kernels"] = kernel_breakdown(fwd_bwd if has_grad else forward)
    calls["clear"]()
    if device.startswith("cuda"):
        row["peak_extra_gb"] = _peak_extra_gb(fwd_bwd if has_grad else forward)
    return row


def _peak_extra_gb(call: Callable[[], Any]) -> float:
    """GB of GPU memory that one call holds at its peak beyond what was allocated before it (the caller
    drops the graph its timed calls held first, so that it does not count)."""
    sync_device()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    sync_device()
    peak = (torch.cuda.max_memory_allocated() - before) / 1e9
    del result
    return peak


def _dtypes_for(dtypes: list[str] | None, device: str) -> list[torch.dtype]:
    """The dtypes asked for, else the one a GPU trains in (bf16) or a CPU's float32."""
    if dtypes:
        return [dtype_of(d) for d in dtypes]
    return [torch.bfloat16 if device.startswith("cuda") else torch.float32]


def _not_run_row(b: registry.Backend, case: Case, dt: torch.dtype, why: dict[str, str]) -> dict[str, Any]:
    """The row of a backend that gave no figures: ``why`` is {"skip": reason} or {"error": what it raised}."""
    return {"backend": b.name, "case": case.name, "dtype": dtype_name(dt), **why}


def _bench_operator(
    op: OperatorSpec, cases: list[Case], dts: list[torch.dtype], chosen: list[registry.Backend], device: str,
    bw: float, tf: float, reps: int, profile: bool,
) -> tuple[list[dict], bool]:
    """The rows of one operator, baseline first on each case and dtype; and whether a backend failed."""
    rows: list[dict] = []
    failed = False
    for case in cases:
        for dt in dts:
            for b in sorted(chosen, key=lambda b: (b.name != op.baseline, b.name)):
                why = b.unavailable(device)
                if why or dtype_name(dt) not in b.dtypes:
                    rows.append(_not_run_row(b, case, dt, {"skip": why or "dtype not supported"}))
                    continue
                try:
                    row = measure(op, b, case, dt, device, reps, profile)
                except Exception as e:  # a failing backend is a row, not the end of the benchmark
                    row = _not_run_row(b, case, dt, {"error": f"{type(e).__name__}: {str(e)[:300]}"})
                    failed = True
                cost = op.cost_model(case.params, dt) if op.cost_model else {}
                _derive(row, cost, bw, tf)
                rows.append(row)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
            _ratios(rows, op.baseline, case.name, dtype_name(dt))
    return rows, failed


def _print_targets(op: OperatorSpec, checks: list[dict]) -> bool:
    """Print how the operator's targets fared (nothing without targets); whether any was missed."""
    if not checks:
        return False
    missed = [c for c in checks if c["met"] is False]
    absent = sum(bool(c.get("absent")) for c in checks)
    undecided = sum(bool(c.get("undecided")) for c in checks)
    print(f"{op.name} targets: {sum(c['met'] is True for c in checks)} met, {len(missed)} missed"
          + (f", {absent} not benched (backend or dtype not in this run)" if absent else "")
          + (f"; {undecided} of them within the calls' spread (another run may differ)" if undecided else "")
          + "".join(f"\n  missed: {c['backend']} {c['case']}: {c['target']} (measured {c['measured']:.3g})"
                    for c in missed))
    return bool(missed)


def run_bench(
    kernels: list[str],
    backends: list[str] | None,
    device: str,
    report_dir: str,
    dtypes: list[str] | None,
    reps: int = 0,
    profile: bool = False,
    strict: bool = False,
) -> int:
    """Bench each operator's backends and write its report; 1 where a backend failed (or, with ``strict``, a
    target was missed), else 0."""
    ops = registry.resolve_kernels(kernels)
    cpu_interpret(device)
    prov = run_provenance(device)
    bw = copy_bandwidth(device)
    tf = gemm_tflops(device)
    print(f"{prov['device']}: copy bandwidth {bw:.0f} GB/s, bf16 GEMM {tf:.0f} TFLOP/s (measured now)")
    status = 0
    for op_name in ops:
        op = registry.get_operator(op_name)
        cases = cases_for(op, device)
        chosen = [b for b in registry.backends(op_name) if not backends or b.name in backends]
        dts = _dtypes_for(dtypes, device)
        rows, failed = _bench_operator(op, cases, dts, chosen, device, bw, tf, reps, profile)
        if failed:
            status = 1
        checks = write_bench_report(op, rows, prov, bw, tf, device, report_dir, chosen)
        if _print_targets(op, checks) and strict:
            status = 1
    return status


def _derive(row: dict, cost: dict, bw: float, tf: float) -> None:
    """Roofline figures of a timed row from the operator's cost model: GB/s and the fraction of the copy
    bandwidth per phase, TFLOP/s and the fraction of the GEMM throughput."""
    if "fwd_ms" not in row:
        return
    for phase, key in (("fwd", "fwd_ms"), ("bwd", "bwd_ms")):
        ms = row.get(key)
        nbytes = cost.get(f"{phase}_bytes")
        if ms and nbytes:
            row[f"{phase}_gbps"] = nbytes / ms / 1e6
            row[f"{phase}_bw_frac"] = row[f"{phase}_gbps"] / bw
    flops = cost.get("flops") or (cost.get("fwd_flops", 0) + cost.get("bwd_flops", 0))
    if flops and row.get("fwd_bwd_ms"):
        row["tflops"] = flops / row["fwd_bwd_ms"] / 1e9
        row["gemm_frac"] = row["tflops"] / tf
    if cost.get("fwd_bytes") and cost.get("bwd_bytes") and row.get("fwd_bwd_ms"):
        row["fwd_bwd_bw_frac"] = (cost["fwd_bytes"] + cost["bwd_bytes"]) / row["fwd_bwd_ms"] / 1e6 / bw


def _ratios(rows: list[dict], baseline: str, case: str, dtype: str) -> None:
    """Each timed row's speedup over the baseline's row of the same case and dtype (speedup_fwd, ...)."""
    base = next(
        (r for r in rows if r["backend"] == baseline and r["case"] == case and r["dtype"] == dtype and "fwd_ms" in r),
        None,
    )
    for r in rows:
        if base is None or r["case"] != case or r["dtype"] != dtype or "fwd_ms" not in r:
            continue
        for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
            if r.get(k) and base.get(k):
                r[f"speedup_{k[:-3]}"] = base[k] / r[k]
