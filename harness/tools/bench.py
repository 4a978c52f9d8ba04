"""`harness bench`: forward/backward times, peak extra memory and roofline fractions per backend.

Times are medians of triton.testing.do_bench (CUDA events) when available, else of wall-clock
repetitions. The device's copy bandwidth and GEMM throughput are measured in the same run, so
fractions and ratios never mix devices.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..measure.oracle import as_dict, gen_grad_outputs, gen_inputs, output_contract
from ..model import registry
from ..model.spec import Case, OperatorSpec, PerfTarget, dtype_name, dtype_of, short_dtype
from ..store.provenance import backend_provenance, device_class, run_provenance
from ..store.reports import atomic_write


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# do_bench sizes its repeat count by time (100 ms by default), which leaves a 45 ms call two samples: too
# few for a median that decides a 1.1x target. Every measurement gets at least this many timed calls.
MIN_CALLS = 20


def timeit(fn: Callable[[], Any], reps: int = 0) -> float:
    """Median milliseconds of at least ``reps`` timed calls (default MIN_CALLS, or about 2 s of calls where
    that is fewer, at least 5)."""
    return timings(fn, reps)[0]


def timings(fn: Callable[[], Any], reps: int = 0,
            setup: Callable[[], Any] | None = None) -> tuple[float, float, float]:
    """(median, 20th percentile, 80th percentile) milliseconds of at least ``reps`` timed calls (default
    MIN_CALLS, or about 2 s of calls where that is fewer, at least 5): the median decides a target, the
    spread says how far to trust it. With ``setup``, each timed call comes after an untimed setup()."""
    calls = reps or MIN_CALLS
    if setup is not None:
        return _timings_after(setup, fn, calls, bool(reps))
    if torch.cuda.is_available():
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            # a first estimate (do_bench times 5 calls for it), then enough milliseconds for `calls` calls
            est = float(do_bench(fn, warmup=1, rep=1, return_mode="median"))
            if not reps:  # a slow baseline (eager attention: a second a call) gets 5 calls, not 20
                calls = min(calls, max(5, int(2000 / max(est, 1e-3))))
            q = do_bench(fn, warmup=max(25.0, min(3 * est, 500.0)), rep=max(100.0, calls * est),
                         quantiles=[0.5, 0.2, 0.8])
            return float(q[0]), float(q[1]), float(q[2])
    t0 = time.perf_counter()
    fn()
    _sync()
    if not reps:  # as above: a call slower than 100 ms gets fewer repeats, at least 5
        calls = min(calls, max(5, int(2000 / max((time.perf_counter() - t0) * 1e3, 1e-3))))
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return _quantiles(ts)


def _quantiles(ts: list[float]) -> tuple[float, float, float]:
    ts = sorted(ts)
    return ts[len(ts) // 2], ts[int(0.2 * (len(ts) - 1))], ts[int(0.8 * (len(ts) - 1) + 0.5)]


def _timings_after(setup: Callable[[], Any], fn: Callable[[], Any], calls: int,
                   explicit: bool) -> tuple[float, float, float]:
    """timings() of fn where each call needs an untimed setup() first (a backward its own forward). On a GPU,
    events on the stream bracket fn alone, the setup's kernels queued ahead of them."""
    cuda = torch.cuda.is_available()

    def one() -> float:
        setup()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        return (time.perf_counter() - t0) * 1e3

    first = one()  # warms up, and sizes the count as timings() does
    if not explicit:
        calls = min(calls, max(5, int(2000 / max(first, 1e-3))))
    one()
    return _quantiles([one() for _ in range(calls)])


def _timed(row: dict[str, Any], key: str, fn: Callable[[], Any], reps: int,
           setup: Callable[[], Any] | None = None) -> None:
    """row[key] (ms, the median) and row[key + "_spread"] ([20th, 80th] percentiles)."""
    median, lo, hi = timings(fn, reps, setup)
    row[key] = median
    row[key + "_spread"] = [lo, hi]


def copy_bandwidth(device: str) -> float:
    """Measured device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    ms = timeit(lambda: b.copy_(a))
    return 2 * n / ms / 1e6


def gemm_tflops(device: str, dtype: torch.dtype = torch.bfloat16) -> float:
    n = 8192 if device.startswith("cuda") else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    ms = timeit(lambda: a @ b)
    return 2 * n**3 / ms / 1e9


def _leaves(op: OperatorSpec, tensors: dict) -> dict[str, torch.Tensor]:
    out = {}
    for n in op.differentiable:
        t = tensors.get(n)
        if isinstance(t, torch.Tensor):
            t.requires_grad_(True)
            out[n] = t
    return out


def kernel_breakdown(fn: Callable[[], Any], iters: int = 3, top: int = 8) -> list[dict[str, Any]]:
    """The device kernels of one call of ``fn``: name, launches and milliseconds per call, by time.

    What a developer reads first when a backend misses its roofline: which kernel takes the time.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        _sync()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:  # older torch
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": e.key, "calls": e.count / iters, "ms": us / iters / 1e3})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["ms"] / total
    return rows[:top]


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
    _timed(row, "fwd_ms", forward, reps)
    has_grad = fwd_bwd is not None
    if has_grad:
        _timed(row, "bwd_ms", calls["backward_only"], reps, setup=calls["refresh"])
        _timed(row, "fwd_bwd_ms", fwd_bwd, reps)
    if profile and device.startswith("cuda"):
        row["kernels"] = kernel_breakdown(fwd_bwd if has_grad else forward)
    calls["clear"]()
    if device.startswith("cuda"):
        _sync()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        r = fwd_bwd() if has_grad else forward()
        _sync()
        row["peak_extra_gb"] = (torch.cuda.max_memory_allocated() - before) / 1e9
        del r
    return row


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
        dts = (
            [dtype_of(d) for d in dtypes]
            if dtypes
            else [torch.bfloat16 if device.startswith("cuda") else torch.float32]
        )
        rows = []
        for case in cases:
            for dt in dts:
                for b in sorted(chosen, key=lambda b: (b.name != op.baseline, b.name)):
                    why = b.unavailable(device)
                    if why or dtype_name(dt) not in b.dtypes:
                        rows.append(
                            {
                                "backend": b.name,
                                "case": case.name,
                                "dtype": dtype_name(dt),
                                "skip": why or "dtype not supported",
                            }
                        )
                        continue
                    try:
                        row = measure(op, b, case, dt, device, reps, profile)
                    except Exception as e:  # a failing backend is a row, not the end of the benchmark
                        row = {
                            "backend": b.name,
                            "case": case.name,
                            "dtype": dtype_name(dt),
                            "error": f"{type(e).__name__}: {str(e)[:300]}",
                        }
                        status = 1
                    cost = op.cost_model(case.params, dt) if op.cost_model else {}
                    _derive(row, cost, bw, tf)
                    rows.append(row)
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                _ratios(rows, op.baseline, case.name, dtype_name(dt))
        checks = _write(op, rows, prov, bw, tf, device, report_dir, chosen)
        if checks:
            missed = [c for c in checks if c["met"] is False]
            absent = sum(bool(c.get("absent")) for c in checks)
            print(f"{op.name} targets: {sum(c['met'] is True for c in checks)} met, {len(missed)} missed"
                  + (f", {absent} not benched (backend or dtype not in this run)" if absent else "")
                  + "".join(f"\n  missed: {c['backend']} {c['case']}: {c['target']} (measured {c['measured']:.3g})"
                            for c in missed))
            if strict and missed:
                status = 1
    return status


def _derive(row: dict, cost: dict, bw: float, tf: float) -> None:
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


def check_targets(targets: tuple[PerfTarget, ...], rows: list[dict], gpu: bool) -> list[dict]:
    """Each target on each bench case it names: the measured value and whether it is met (None where the
    run has no figure for it). Targets describe the GPU bench shapes; a CPU run checks none.

    A target whose backend (or ``versus`` backend) has no row at all on that case and dtype was not benched
    by this run (``--backend`` or ``--dtype`` left it out): ``absent`` names what is missing, and the report
    says "not benched" instead of "no figure", which stays for a backend that was benched and gave no
    figure (it failed, was skipped here, or lacks the metric). `harness bench --backend torch,cuda` on an
    H200 printed "no figure" beside the table's figures: those were cuda-inplace's targets (issue #41)."""
    out = []
    if not gpu:
        return out
    timed = [r for r in rows if "fwd_ms" in r]
    benched = {(r.get("backend"), r.get("case"), r.get("dtype")) for r in rows}
    for t in targets:
        cases = [t.case] if t.case else list(dict.fromkeys(r["case"] for r in rows))
        for case in cases:
            mine = next((r for r in timed if (r["backend"], r["case"], r["dtype"]) == (t.backend, case, t.dtype)), None)
            theirs = (next((r for r in timed if (r["backend"], r["case"], r["dtype"]) == (t.versus, case, t.dtype)),
                           None) if t.versus else None)
            value = mine.get(t.metric) if mine else None
            if t.versus:
                other = theirs.get(t.metric) if theirs else None
                value = value / other if value is not None and other else None
            check = {"backend": t.backend, "case": case, "dtype": t.dtype, "target": t.describe(),
                     "measured": value, "met": None if value is None else t.judge(value)}
            absent = [b for b in (t.backend, t.versus) if b and (b, case, t.dtype) not in benched]
            if value is None and absent:
                check["absent"] = absent
            out.append(check)
    return out


def target_lines(checks: list[dict]) -> list[str]:
    """The markdown table of check_targets' results (empty without targets)."""
    if not checks:
        return []
    lines = ["| backend | case | dtype | target | measured | |", "|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['backend']} | {c['case']} | {short_dtype(c['dtype'])} | {target_cells(c)} |")
    return lines


def target_cells(check: dict) -> str:
    """'target | measured | met' cells of one check_targets result (bench reports and STATUS.md)."""
    if check.get("absent"):
        mark = f"not benched: {' and '.join(check['absent'])} not in this run"
    else:
        mark = "no figure" if check["met"] is None else ("✅ met" if check["met"] else "❌ missed")
    value = "" if check["measured"] is None else format(check["measured"], ".3g")
    return f"{check['target']} | {value} | {mark}"


def render_bench(payload: dict, baseline: str) -> str:
    """The markdown of a bench report from its JSON payload (so `harness report` can redraw it)."""
    prov, bw, tf, rows = payload["provenance"], payload["copy_gbps"], payload["gemm_tflops"], payload["rows"]

    def f(x: Any, spec: str = ".3g") -> str:
        return "" if x is None else (format(x, spec) if isinstance(x, (int, float)) else str(x))

    def ms(r: dict, key: str) -> str:
        """The median, with the 20th-80th percentile spread beside it where it was recorded."""
        spread = r.get(key + "_spread")
        return f(r.get(key)) + (f" ({f(spread[0])}-{f(spread[1])})" if spread and r.get(key) is not None else "")

    lines = [
        f"# Benchmark: `{payload['operator']}`",
        "",
        f"{prov['device']}, commit `{prov['commit']}`, {prov['date']}; "
        + ", ".join(f"{k} {v}" for k, v in prov["versions"].items())
        + ".",
        "",
        f"Measured in the same run: copy bandwidth **{bw:.0f} GB/s** (bytes read + written), bf16 GEMM "
        f"**{tf:.0f} TFLOP/s**. Times are medians (ms). `× {baseline}` is the speedup over the baseline "
        "backend on the same shape (higher is faster)"
        + ("; in brackets, the 20th-80th percentile spread of the calls (at least "
           f"{MIN_CALLS} timed, fewer only for a call slower than 100 ms)"
           if any(r.get("fwd_ms_spread") for r in rows) else " (this run recorded no spread)")
        + ". Bandwidth fractions use the operator's floor bytes (each input read once, each output written once).",
        "",
        "| case | dtype | backend | fwd ms | bwd ms | fwd+bwd ms | fwd BW | bwd BW | TFLOP/s | peak extra GB | "
        f"× {baseline} (fwd+bwd) |",
        "|---" * 11 + "|",
    ]
    for r in rows:
        if "skip" in r or "error" in r:
            lines.append(
                f"| {r['case']} | {short_dtype(r['dtype'])} | {r['backend']} | "
                f"{'SKIP: ' + r['skip'] if 'skip' in r else 'ERROR: ' + r['error']} |" + " |" * 7
            )
            continue
        role = f" ({r['role']})" if r["role"] != "kernel" else ""
        lines.append(
            f"| {r['case']} | {short_dtype(r['dtype'])} | {r['backend']}{role} | "
            f"{ms(r, 'fwd_ms')} | {ms(r, 'bwd_ms')} | {ms(r, 'fwd_bwd_ms')} | "
            f"{f(r.get('fwd_bw_frac'), '.0%')} | {f(r.get('bwd_bw_frac'), '.0%')} | {f(r.get('tflops'), '.0f')} | "
            f"{f(r.get('peak_extra_gb'), '.2f')} | {f(r.get('speedup_fwd_bwd'), '.2f')} |"
        )
    notes = [f"- {r['backend']}, {r['case']}: {r['input_note']}" for r in rows if r.get("input_note")]
    if notes:
        lines += [""] + notes
    if payload.get("targets"):
        lines += ["", "## Targets", "", "The operator's declared targets on these shapes, judged on this run's "
                  "figures.", ""]
        lines += target_lines(payload["targets"])
    prof = [r for r in rows if r.get("kernels")]
    if prof:
        lines += ["", "## Where the time goes", "",
                  "Device kernels of one forward+backward (torch.profiler, mean of 3 calls), longest first.", ""]
        for r in prof:
            lines += [f"**{r['backend']}**, {r['case']}, {short_dtype(r['dtype'])}:", "",
                      "| kernel | launches | ms | share |", "|---|---|---|---|"]
            for k in r["kernels"]:
                name = k["kernel"] if len(k["kernel"]) <= 80 else k["kernel"][:77] + "..."
                lines.append(f"| `{name.replace('|', '/')}` | {k['calls']:.3g} | {k['ms']:.3g} | {k['share']:.0%} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def redraw(path: Path) -> Path | None:
    """Redraw a bench report's markdown from its JSON, its targets judged anew from the operator's current
    declaration (the measurements as recorded); None where the operator is unknown here."""
    payload = json.loads(path.read_text())
    try:
        op = registry.get_operator(payload["operator"])
    except KeyError:  # an operator of a plugin that this command did not load
        return None
    gpu = payload["provenance"].get("device_class", "cpu") != "cpu"
    payload["targets"] = check_targets(op.perf_targets, payload["rows"], gpu)
    atomic_write(path, json.dumps(payload, indent=1, default=str) + "\n")
    out = path.with_suffix(".md")
    atomic_write(out, render_bench(payload, op.baseline))
    return out


def _write(
    op: OperatorSpec, rows: list[dict], prov: dict, bw: float, tf: float, device: str, report_dir: str, chosen: list
) -> list[dict]:
    payload = {
        "operator": op.name,
        "provenance": prov,
        "copy_gbps": bw,
        "gemm_tflops": tf,
        "rows": rows,
        "targets": check_targets(op.perf_targets, rows, device.startswith("cuda")),
        "backends": {b.name: backend_provenance(b.source_files()) for b in chosen},
    }
    text = render_bench(payload, op.baseline)
    root = Path(report_dir)
    dst = root if device.startswith("cuda") else root / device_class(device)
    atomic_write(dst / f"bench-{op.name}.md", text)
    atomic_write(dst / f"bench-{op.name}.json", json.dumps(payload, indent=1, default=str) + "\n")
    print(text)
    return payload["targets"]
