"""GPU memory when several workers share one GPU: which group may start beside the running ones, and what
becomes of a cell that ran out of memory there.

Out of memory while other workers share the GPU says little about the backend: such a cell goes back to
the end of the queue once (its neighbours then are others, mostly small cells), and if it runs out again it
is run at the end, one worker per GPU; only the last result is reported. The local pool (pool.py) packs
groups with :class:`MemoryPacker`; the Ray executor turns the same budget into GPU fractions.
"""

from __future__ import annotations

import os
import re

from ..model.records import CellRecord
from .plan import Task

# Memory a worker process holds on its GPU outside torch's allocator (CUDA context, cuBLAS workspace,
# loaded kernels), which a cell's recorded peak (torch's max reserved) does not include.
CONTEXT_MB = 700.0


def gpu_budget_mb(gpus: list[int | None]) -> float | None:
    """MB that the cells of the workers sharing one GPU may hold together: 90% of the card, less each
    worker's context. HARNESS_GPU_MEM_MB overrides the card's size."""
    env = os.environ.get("HARNESS_GPU_MEM_MB")
    if env:
        total = float(env)
    else:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory / 2**20
    per_gpu = max(gpus.count(g) for g in set(gpus))
    return 0.9 * total - per_gpu * CONTEXT_MB


class MemoryPacker:
    """Which queued group a worker on a shared GPU starts next: the first (longest) one whose expected
    memory fits beside the groups already running on that GPU, so that big cells do not meet and run
    out of memory. A group's expected memory is its cells' largest recorded peak, or what a cell of it
    was found to need when it ran out of memory in this run; a group with no record counts as zero, and
    a GPU with nothing known running takes any group (a big one then runs beside small ones)."""

    def __init__(self, peaks: dict[tuple[str, str], float], budget_mb: float | None):
        self.peaks, self.budget = dict(peaks), budget_mb
        self.held: dict[int | None, float] = {}

    def need(self, group: list[Task]) -> float:
        return max((self.peaks.get(t.id, 0.0) for t in group), default=0.0)

    def take(self, queue: list[list[Task]], gpu: int | None) -> tuple[list[Task], float] | None:
        if not queue:
            return None
        held = self.held.get(gpu, 0.0)
        for i, g in enumerate(queue):
            n = self.need(g) if self.budget is not None else 0.0
            if self.budget is None or held == 0.0 or held + n <= self.budget:
                self.held[gpu] = held + n
                return queue.pop(i), n
        return None

    def split_oversized(self, queue: list[list[Task]]) -> list[Task]:
        """Take out of the queue the groups whose recorded need exceeds what workers sharing a GPU leave
        (a [128, 128256] x 4096 cross-entropy's float64 oracle: 79 GB of an 80 GB H100): shared, they
        could only run out of memory; their cells are run alone at the end."""
        if self.budget is None:
            return []
        big = [g for g in queue if self.need(g) > self.budget]
        queue[:] = [g for g in queue if self.need(g) <= self.budget]
        return [t for g in big for t in g]

    def release(self, gpu: int | None, need: float) -> None:
        self.held[gpu] = max(0.0, self.held.get(gpu, 0.0) - need)

    def learn_oom(self, t: Task, cell: CellRecord) -> None:
        """What the cell held when it ran out, plus the allocation that failed (from torch's message)."""
        m = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB)", cell.error)
        tried = float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1) if m else 0.0
        key = t.id
        self.peaks[key] = max(self.peaks.get(key, 0.0), float(cell.peak_mem_mb or 0.0) + tried)


def requeue_oom(t: Task, queue: list[list[Task]], alone: list[Task]) -> None:
    """A cell that ran out of memory on a shared GPU: the first time back to the end of the queue, where
    its neighbours are other cells; the second time to the cells run at the end, one worker per GPU."""
    t.oom_tries += 1
    if t.oom_tries == 1:
        queue.append([t])
    else:
        alone.append(t)
