"""Cells without figures: SKIP, ERROR, CRASH or TIMEOUT, and how an exception raised while measuring a cell
becomes one. Out of memory stays an ERROR the runner recognizes and reruns (``is_oom``); a device fault is a
CRASH, since the CUDA context that saw it is gone.
"""

from __future__ import annotations

import os
import traceback

import torch

from ..model.records import CellRecord, Status
from ..model.registry import Backend
from ..model.spec import Case, OperatorSpec
from .device_memory import release
from .oracle import clear_cache


class OracleOutOfMemory(torch.cuda.OutOfMemoryError):
    """The harness's own float64 oracle or float32 floor ran out of device memory (not the backend)."""


def error_cell(
    op_name: str, backend: str, case: Case, dtype: str, device: str, seed: int, status: str, message: str, tb: str = ""
) -> CellRecord:
    """A cell without figures: SKIP, ERROR, CRASH or TIMEOUT, with its message."""
    return CellRecord(operator=op_name, backend=backend, dtype=dtype, case=case, device=device, seed=seed,
                      status=Status(status), error=message, traceback=tb)


def is_oom(cell: CellRecord) -> bool:
    """An ERROR cell of _out_of_memory_cell (the runner reruns those)."""
    return cell.status == Status.ERROR and cell.error.startswith("OutOfMemoryError")


def failed_cell(op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int,
                e: Exception) -> CellRecord:
    """The cell of an exception raised while measuring it (called in its ``except`` block: the traceback is
    the exception's). The backend's failure is data, not a crash of the sweep."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return _out_of_memory_cell(op, backend, case, dtype, device, seed, e)
    msg = f"{type(e).__name__}: {e}"
    if _is_out_of_memory(msg):
        # a Triton launch or a CUDA call that could not get memory says so in its own words
        # ("Triton Error [CUDA]: out of memory", seen on an H100 shared by 8 workers)
        return _out_of_memory_cell(op, backend, case, dtype, device, seed, e)
    status = "CRASH" if _is_device_fault(msg) else "ERROR"
    release(device)
    return error_cell(
        op.name, backend.name, case, dtype, device, seed, status, msg[:2000], traceback.format_exc(limit=12)
    )


def _is_out_of_memory(msg: str) -> bool:
    return any(m in msg for m in ("[CUDA]: out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                                  "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"))


def _out_of_memory_cell(op: OperatorSpec, backend: Backend, case: Case, dtype: str, device: str, seed: int,
                        e: Exception) -> CellRecord:
    # the oracle's cache is dropped to free the GPU: the runner reruns the cell, which draws it again
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
