"""A cell's GPU memory: the peaks the worker records for the cell (peak_reserved_mb, peak_allocated_mb), the
backend's own call measured apart from the harness's share (``alone``: backend_peak_mb), and results parked
on the host while the backend runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Tensor = torch.Tensor


class _Peaks:
    """The GPU peaks of the running cell before ``alone`` reset the allocator's counters to measure the
    backend's call on its own (the worker records the cell's peaks: peak_reserved_mb, peak_allocated_mb)."""

    reserved = 0
    allocated = 0


def reset_peaks() -> None:
    """At a cell's start, on a GPU."""
    _Peaks.reserved = _Peaks.allocated = 0
    torch.cuda.reset_peak_memory_stats()


def peak_reserved_mb() -> float:
    """What the cell held on the GPU at most (reserved by the caching allocator), across ``alone``'s resets."""
    return round(max(_Peaks.reserved, torch.cuda.max_memory_reserved()) / 2**20)


def peak_allocated_mb() -> float:
    """What the cell's tensors took on the GPU at most, across ``alone``'s resets: on the basis of
    backend_peak_mb (reserved memory adds the allocator's fragmentation, an eager backend's most of all)."""
    return round(max(_Peaks.allocated, torch.cuda.max_memory_allocated()) / 2**20)


def alone(device: str, call: Callable[[], Any]) -> tuple[Any, float | None]:
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


def release(device: str) -> None:
    """The caching allocator's free blocks handed back, so that they count in no later peak."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def to_host(got: dict[str, Any]) -> dict[str, Any]:
    """A backend run's results (call_backend's dict) with every tensor moved to the host."""
    def host(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.detach().to("cpu")
        return {k: host(x) for k, x in v.items()} if isinstance(v, dict) else v

    return {k: host(v) for k, v in got.items()}
