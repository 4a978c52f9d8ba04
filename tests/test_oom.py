"""Out-of-memory cells say whose memory ran out, and stay rerunnable (the runner keys on the prefix)."""

import torch

from harness.measure import cell, failures
from harness.model import registry
from harness.run import memory as run_memory
from harness.run import plan as run_plan
from harness.run import processes as run_processes


def _cell(monkeypatch, where: str) -> dict:
    registry.discover()
    op = registry.get_operator("mhc_pre")
    backend = registry.get_backend("mhc_pre", "golden")
    case = op.cases("smoke", "cpu")[0]

    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 15.66 GiB.")

    monkeypatch.setattr(cell, "oracle_and_floor" if where == "oracle" else "call_backend", boom)
    return cell.safe_run_cell(op, backend, case, "float32", "cpu", 0, 1)


def test_oracle_out_of_memory_is_named_as_the_harness(monkeypatch):
    monkeypatch.setenv("HARNESS_GPU_SHARED", "0")
    c = _cell(monkeypatch, "oracle")
    assert c.status.value == "ERROR" and failures.is_oom(c)
    assert "in the harness's oracle" in c.error and "had the GPU to itself" in c.error
    assert "15.66 GiB" in c.error


def test_backend_out_of_memory_on_a_shared_gpu(monkeypatch):
    monkeypatch.setenv("HARNESS_GPU_SHARED", "1")
    c = _cell(monkeypatch, "backend")
    assert c.status.value == "ERROR" and failures.is_oom(c)
    assert "in the backend" in c.error and "other workers share this GPU" in c.error


def test_workers_are_told_whether_they_share_a_gpu():
    assert run_processes.worker_env("cuda", 0, shared=True)["HARNESS_GPU_SHARED"] == "1"
    assert run_processes.worker_env("cuda", 0)["HARNESS_GPU_SHARED"] == "0"


def test_recorded_durations_start_the_longest_groups_first(tmp_path):
    from harness.measure.failures import error_cell
    from harness.render.report import ReportWriter
    from harness.store.reports import recorded

    p = run_plan.plan(["mhc_pre", "softmax_xent"], "smoke", ["golden", "torch"], ["float32"], "cpu")
    groups = run_plan.order_groups(p.tasks, {})
    assert {g[0].operator for g in groups[:2]} == {"mhc_pre", "softmax_xent"}  # interleaved without timings
    slow = groups[-1][0]
    w = ReportWriter(tmp_path, "cpu", {"run_id": "r1", "commit": "c"})
    for t in p.tasks:
        cell = error_cell(t.operator, t.backend, t.case, t.dtype, "cpu", 0, "ERROR", "x")
        cell.duration_s = 99.0 if t is slow else 1.0
        w.append(cell)
    durations = recorded(tmp_path / "cpu", ["mhc_pre", "softmax_xent"], ("duration_s",))["duration_s"]
    assert durations[slow.id] == 99.0
    assert run_plan.order_groups(p.tasks, durations)[0][0] is slow  # the slowest group now goes first


def test_a_cell_out_of_memory_on_a_shared_gpu_is_requeued_once_then_run_alone():
    p = run_plan.plan(["mhc_pre"], "smoke", ["golden"], ["float32"], "cpu")
    t = p.tasks[0]
    queue: list = [[p.tasks[1]]]
    alone: list = []
    run_memory.requeue_oom(t, queue, alone)
    assert queue[-1] == [t] and alone == []  # first time: back to the end of the shared queue
    queue.pop()
    run_memory.requeue_oom(t, queue, alone)
    assert alone == [t] and len(queue) == 1  # second time: rerun alone at the end


def test_workers_sharing_a_gpu_start_together_only_groups_that_fit_in_it():

    p = run_plan.plan(["mhc_pre"], "smoke", ["golden"], ["float32"], "cpu")
    big, mid, small = ([t] for t in p.tasks[:3])
    key = lambda g: g[0].id  # noqa: E731
    packer = run_memory.MemoryPacker({key(big): 60_000, key(mid): 30_000, key(small): 1_000}, budget_mb=70_000)
    queue = [big, mid, small]
    assert packer.take(queue, 0) == (big, 60_000)  # nothing on gpu0 yet: the longest group
    assert packer.take(queue, 0) == (small, 1_000)  # mid would not fit beside big: the next that does
    assert packer.take(queue, 1) == (mid, 30_000)  # another GPU has its own budget
    assert packer.take(queue, 0) is None
    packer.release(0, 60_000)
    packer.release(0, 1_000)
    assert packer.take([big], 0) == (big, 60_000)  # a GPU with nothing running takes any group
    # out of memory in this run: what the cell held plus the allocation that failed
    from harness.measure.failures import error_cell

    t = small[0]
    oom = error_cell(t.operator, t.backend, t.case, t.dtype, "cuda", 0, "ERROR",
                     "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    oom.peak_mem_mb = 500
    packer.learn_oom(t, oom)
    assert packer.need(small) == 500 + 2048
    assert run_memory.MemoryPacker({}, None).take([small, big], 0) == (small, 0.0)  # unshared: plain queue order


def test_a_triton_launch_out_of_memory_counts_as_out_of_memory(monkeypatch):
    monkeypatch.setenv("HARNESS_GPU_SHARED", "1")
    registry.discover()
    op = registry.get_operator("mhc_pre")
    backend = registry.get_backend("mhc_pre", "golden")
    case = op.cases("smoke", "cpu")[0]

    def boom(*a, **k):
        raise RuntimeError("Triton Error [CUDA]: out of memory")

    monkeypatch.setattr(cell, "call_backend", boom)
    c = cell.safe_run_cell(op, backend, case, "float32", "cpu", 0, 1)
    assert failures.is_oom(c) and "Triton Error [CUDA]: out of memory" in c.error


def test_groups_that_need_more_than_a_shared_gpu_leaves_run_alone_without_trying():

    p = run_plan.plan(["mhc_pre"], "smoke", ["golden"], ["float32"], "cpu")
    huge, small = [p.tasks[0]], [p.tasks[1]]
    key = lambda g: g[0].id  # noqa: E731
    packer = run_memory.MemoryPacker({key(huge): 79_000, key(small): 1_000}, budget_mb=67_000)
    queue = [huge, small]
    assert packer.split_oversized(queue) == huge and queue == [small]
    assert run_memory.MemoryPacker({key(huge): 79_000}, None).split_oversized([huge]) == []  # unshared: no limit


def test_the_run_says_where_its_time_went():
    from harness.front.run_summary import time_breakdown

    line = time_breakdown({"ready_s": 4.2, "cells_s": 148.6, "alone_cells": 18, "alone_s": 25.6, "render_s": 1.0})
    assert line == ("workers ready by 4.2 s; shared cells done at 148.6 s; 18 cell(s) rerun alone in 25.6 s; "
                    "report rendered in 1.0 s")
    assert "alone" not in time_breakdown({"ready_s": 1.0, "cells_s": 2.0, "render_s": 0.1})


def test_the_run_names_the_backends_that_took_longest():
    from harness.front.run_summary import busiest_backends
    from harness.model.records import CellRecord
    from harness.model.spec import Case

    def cell(backend: str, duration: float | None) -> CellRecord:
        return CellRecord("op", backend, "float32", Case("c", {}), "cpu", duration_s=duration)

    cells = [cell("slow", 10.0), cell("slow", 5.0), cell("fast", 1.0), cell("skipped", None)]
    assert busiest_backends(cells) == "op/slow 15 s, op/fast 1 s"
    # both calls of the backend timed: first call / the same call again (compilation shows as the gap)
    cells[0].backend_s, cells[0].backend_again_s = 8.0, 0.5
    cells[1].backend_s, cells[1].backend_again_s = 3.0, 0.4
    assert busiest_backends(cells) == "op/slow 15 s (11 / 1), op/fast 1 s"
