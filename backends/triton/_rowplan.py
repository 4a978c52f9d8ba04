"""How the Triton row-wise norms (rmsnorm, layernorm) cut a [R, F] tensor into launches, in one place.

Rows of at most ``ROW_MAX`` features take the ``_rows`` kernels: one feature block of next_pow2(F) columns,
so each tile of rows is read once and kept in registers, and a persistent backward (P programs, each
keeping its weight-gradient partials in registers across its row tiles). Wider rows take the looped kernels
(BLOCK_R rows, features in blocks of BLOCK_F, each tile read twice). Under the interpreter ``ROW_MAX`` is small
so that CPU-sized cases exercise both families.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

# The one-read plan's settings, shared by rmsnorm and layernorm (their wrappers' CONFIG). Interpreted: rows of
# up to 64 features take the one-read kernels, wider CPU cases the looped ones, so both families run on a CPU;
# three programs, so that a persistent program takes several row tiles. On a GPU, timed on an H200 (R16384,
# bf16, .ci/norm-tune, docs/kernels/triton-rmsnorm.md): forward 4 warps at F4096 and 8 at F8192, backward 8
# and 16, with 16 warps resident an SM.
CPU_ROWS = {"ROW_MAX": 64, "row_elems": 128, "row_warps": 4, "fwd_elems_per_warp": 32, "bwd_elems_per_warp": 32,
            "programs": 3}
GPU_ROWS = {"ROW_MAX": 8192, "row_elems": 4096, "row_warps": 16, "fwd_elems_per_warp": 1024,
            "bwd_elems_per_warp": 512, "warps_per_sm": 16}


class RowPlan(NamedTuple):
    rows_kernels: bool  # the one-read ``_rows`` kernels (F <= ROW_MAX), else the looped ones
    block_r: int        # rows per tile
    block_f: int        # features per block (all of them for the ``_rows`` kernels)
    warps: int


def plan(F: int, config: dict, backward: bool = False) -> RowPlan:
    if F > config["ROW_MAX"]:
        return RowPlan(False, config["BLOCK_R"], config["BLOCK_F"], config["warps"])
    bf = triton.next_power_of_2(max(F, 1))
    # about row_elems values per tile (rows of small F share a tile), at most BLOCK_R rows: the declared row
    # tile, which the local rule cuts by, stays a multiple of this one
    br = max(1, min(config["BLOCK_R"], config["row_elems"] // bf))
    # the backward holds more per value (h, dy, the partials): more warps, fewer values per thread
    per_warp = config["bwd_elems_per_warp" if backward else "fwd_elems_per_warp"]
    warps = max(1, min(config["row_warps"], br * bf // per_warp))
    return RowPlan(True, br, bf, warps)


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def programs(device: torch.device, tiles: int, plan_warps: int, config: dict) -> int:
    """The persistent backward's program count: a fixed number per SM (per device, so that the order of
    the weight-gradient sums, and the bits, are the same every run on one GPU)."""
    if device.type != "cuda":
        return min(tiles, config["programs"])
    # as many programs as fit beside each other at warps_per_sm warps an SM: a second wave of a persistent
    # grid would wait for the first
    per_sm = max(1, config["warps_per_sm"] // plan_warps)
    return min(tiles, per_sm * _sms(device.index if device.index is not None else torch.cuda.current_device()))
