"""One cell: (operator, backend, case, dtype) run, compared with the oracle and the floor reference.

This module runs inside a worker process (see worker.py) or in-process; it returns a CellRecord of
figures (harness/model/records.py), never a verdict's wording: reports judge the figures when they render.
The steps live beside it: the backend's call (backend_call.py), the components' figures (components.py),
the contracts (contracts.py), the precision yardstick (yardstick.py), the microbatch mistake (naive.py),
GPU memory (device_memory.py) and cells without figures (failures.py).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from ..model.records import CellRecord, Status
from ..model.registry import Backend
from ..model.spec import Case, Inputs, OperatorSpec, dtype_of
from ..store.provenance import file_record
from .backend_call import call_backend, call_microbatched, unexpected_returns
from .components import measure_all, misshapen, misshapen_note, output_mismatch
from .contracts import component_spreads, determinism, run_contracts
from .device_memory import alone, release, to_host
from .digests import input_digest, oracle_code
from .failures import OracleOutOfMemory, failed_cell, is_oom
from .naive import naive_per_component, naive_report
from .oracle import OutputMismatch, gen_grad_outputs, gen_inputs, oracle_and_floor
from .yardstick import low_precision_yardstick

Tensor = torch.Tensor


def run_cell(
    op: OperatorSpec, backend: Backend, case: Case, dtype_name: str, device: str, seed: int = 0, repeats: int = 2
) -> CellRecord:
    """Everything measured about one cell."""
    t0 = time.time()
    dtype = dtype_of(dtype_name)
    cell = CellRecord(operator=op.name, backend=backend.name, dtype=dtype_name, case=case, device=device,
                      seed=seed, matmul_precision=backend.matmul_precision, blocks=dict(backend.blocks))
    ref = _reference(op, backend, case, dtype, seed, device)
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
        got, cell.backend_peak_mb = alone(device, once)
    except OutputMismatch as e:
        cell.returned = unexpected_returns(op, returned, outputs)
        return output_mismatch(op, cell, e)
    cell.returned = unexpected_returns(op, returned, outputs)
    cell.backend_s = round(time.time() - t1, 4)
    cell.impl_file = _impl_file(got.pop("impl"))
    _measure(op, backend, case, dtype, ref, got, fresh, cell)
    if repeats > 1:
        _run_again(op, backend, case, device, ref, got, once, cell)
    cell.reference_s = round(t_ref, 4)
    cell.duration_s = round(time.time() - t0, 4)
    return cell


def _reference(op: OperatorSpec, backend: Backend, case: Case, dtype: torch.dtype, seed: int, device: str) -> dict:
    """The cell's oracle and floor (an entry of the oracle's cache); out of memory there is the harness's,
    not the backend's (OracleOutOfMemory)."""
    try:
        ref = oracle_and_floor(op, case, dtype, seed, device, backend.matmul_precision == "tf32")
    except torch.cuda.OutOfMemoryError as e:
        raise OracleOutOfMemory(str(e)) from e
    # the blocks the draw and the oracle's chunks left cached would count in this cell's peak (reserved)
    # beside the backend's, and need not fit the backend's tensors (H100, mhc_pre T65537: 8.2 GB of them)
    release(device)
    return ref


def _impl_file(impl: Callable) -> dict[str, str] | None:
    """The provenance record of the file the backend's implementation lives in (None for a builtin)."""
    try:
        return file_record(inspect.getsourcefile(impl) or "")
    except TypeError:
        return None


def _measure(op: OperatorSpec, backend: Backend, case: Case, dtype: torch.dtype, ref: dict, got: dict,
             fresh: Callable, cell: CellRecord) -> None:
    """Into ``cell``, the figures and contracts of the backend's first run ``got``."""
    # every result's shape and dtype before anything reads it (the invariants, the error figures)
    bad = misshapen(op, ref, got)
    if bad:
        cell.notes.append(misshapen_note(op, bad))
    cell.components = measure_all(op, backend, case, ref, got)
    low_precision_yardstick(op, case, ref, dtype, cell.components)
    marked = ref["extra"].get("_marked")
    if marked is not None:
        cell.kink_marked = int(marked)

    def readable() -> tuple[Inputs, dict[str, Tensor]]:
        """The inputs the invariants read: a chunked case's oracle copy (never written; on the host when
        large, so that no second copy of a case past 2^31 elements lands on the GPU), else a fresh one."""
        if ref.get("plan") is not None:
            return ref["inputs"], ref["grad_outputs"]
        return fresh()

    cell.contracts = run_contracts(op, backend, case, got, readable, invariants=not bad)
    if "naive" in got:
        cell.microbatch = naive_report(op, case, ref, got["naive"])
        naive_per_component(op, case, ref, got["naive"], cell.components)


def _run_again(op: OperatorSpec, backend: Backend, case: Case, device: str, ref: dict, got: dict,
               once: Callable[[], dict[str, Any]], cell: CellRecord) -> None:
    """The backend run a second time on the same inputs: the determinism contract, each component's spread
    between the runs, and what the second call took (backend_again_s)."""
    # a chunked case's results wait on the host while the backend runs again: the GPU then holds one
    # run's results, as the backend alone does (the two runs are compared there)
    parked = ref.get("plan") is not None and device.startswith("cuda")
    if parked:
        got = to_host(got)
        release(device)
    t2 = time.time()
    again = once()
    if parked:
        again = to_host(again)
    # the same call again: next to backend_s, what compilation and other first-call costs took
    cell.backend_again_s = round(time.time() - t2, 4)
    again.pop("impl")
    component_spreads(op, case, got, again, cell.components)
    cell.contracts.append(determinism(backend, got, again))


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
    except Exception as e:  # the backend's failure is data, not a crash of the sweep
        return failed_cell(op, backend, case, dtype, device, seed, e)
