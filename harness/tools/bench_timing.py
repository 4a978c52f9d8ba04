"""How `harness bench` times a call: medians with their spread, the device's own rooflines, and which kernels
take the time.

Times are medians of triton.testing.do_bench (CUDA events) when available, else of wall-clock repetitions.
The device's copy bandwidth and GEMM throughput are measured with the same clock in the same run, so the
fractions a bench report prints never mix devices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

# do_bench sizes its repeat count by time (100 ms by default), which leaves a 45 ms call two samples: too
# few for a median that decides a 1.1x target. Every measurement gets at least this many timed calls.
MIN_CALLS = 20
# a call without an explicit repeat count gets about this many milliseconds of calls where that is fewer than
# MIN_CALLS (a slow baseline, eager attention at a second a call, gets 5 calls, not 20) ...
_TIME_BUDGET_MS = 2000
# ... but never fewer than this many
_FEWEST_CALLS = 5

Quantiles = tuple[float, float, float]


def sync_device() -> None:
    """Wait for the GPU's queued work (no-op without one): a wall-clock time must include the kernels."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _calls_for(calls: int, one_call_ms: float) -> int:
    """``calls`` cut down to about _TIME_BUDGET_MS of calls of ``one_call_ms`` each, at least _FEWEST_CALLS."""
    return min(calls, max(_FEWEST_CALLS, int(_TIME_BUDGET_MS / max(one_call_ms, 1e-3))))


def timeit(fn: Callable[[], Any], reps: int = 0) -> float:
    """Median milliseconds of at least ``reps`` timed calls (default MIN_CALLS, or about 2 s of calls where
    that is fewer, at least 5)."""
    return timings(fn, reps)[0]


def timings(fn: Callable[[], Any], reps: int = 0, setup: Callable[[], Any] | None = None) -> Quantiles:
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
            return _do_bench_timings(do_bench, fn, calls, bool(reps))
    return _wall_clock_timings(fn, calls, bool(reps))


def _do_bench_timings(do_bench: Callable[..., Any], fn: Callable[[], Any], calls: int, explicit: bool) -> Quantiles:
    """timings() by triton's do_bench (CUDA events, its cache flushed between calls)."""
    # a first estimate (do_bench times 5 calls for it), then enough milliseconds for `calls` calls
    est = float(do_bench(fn, warmup=1, rep=1, return_mode="median"))
    if not explicit:
        calls = _calls_for(calls, est)
    q = do_bench(fn, warmup=max(25.0, min(3 * est, 500.0)), rep=max(100.0, calls * est), quantiles=[0.5, 0.2, 0.8])
    return float(q[0]), float(q[1]), float(q[2])


def _wall_clock_timings(fn: Callable[[], Any], calls: int, explicit: bool) -> Quantiles:
    """timings() by perf_counter around each synced call (a CPU, or a GPU without triton)."""
    t0 = time.perf_counter()
    fn()  # warms up, and sizes the count
    sync_device()
    if not explicit:
        calls = _calls_for(calls, (time.perf_counter() - t0) * 1e3)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync_device()
        ts.append((time.perf_counter() - t0) * 1e3)
    return _quantiles(ts)


def _quantiles(ts: list[float]) -> Quantiles:
    ts = sorted(ts)
    return ts[len(ts) // 2], ts[int(0.2 * (len(ts) - 1))], ts[int(0.8 * (len(ts) - 1) + 0.5)]


def _timings_after(setup: Callable[[], Any], fn: Callable[[], Any], calls: int, explicit: bool) -> Quantiles:
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
        sync_device()
        t0 = time.perf_counter()
        fn()
        sync_device()
        return (time.perf_counter() - t0) * 1e3

    first = one()  # warms up, and sizes the count as timings() does
    if not explicit:
        calls = _calls_for(calls, first)
    one()
    return _quantiles([one() for _ in range(calls)])


def timed_into(row: dict[str, Any], key: str, fn: Callable[[], Any], reps: int,
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
    """Measured throughput of one square matrix product in TFLOP/s (the compute roofline of this run)."""
    n = 8192 if device.startswith("cuda") else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    ms = timeit(lambda: a @ b)
    return 2 * n**3 / ms / 1e9


def kernel_breakdown(fn: Callable[[], Any], iters: int = 3, top: int = 8) -> list[dict[str, Any]]:
    """The device kernels of one call of ``fn``: name, launches and milliseconds per call, by time.

    What a developer reads first when a backend misses its roofline: which kernel takes the time.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync_device()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        sync_device()
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
