"""The Gluon softmax_xent backends on a machine without a GPU: registered, SKIP with their reason, bad input
refused with a message, the TMA test of a layout, and the zoo's cases able to show what their mutants plant.
Their kernels compile for sm_90 in tests/test_triton_aot.py; their GPU evidence is reports/gluon/h200/."""

from __future__ import annotations

import math

import pytest
import torch

from harness.model.registry import backends, mutants
from harness.model.skips import Candidate, skip_for
from harness.model.spec import Case

wrapper = pytest.importorskip("harness.backends.gluon.softmax_xent.wrapper")

NAMES = ("gluon", "gluon-inplace")
# the SMs of an H100 or H200: one program each
SMS = 132


def _backend(name: str):
    return next(b for b in backends("softmax_xent") if b.name == name)


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_skipped_on_a_cpu_with_the_reason(name: str):
    case = Case("N4-V1000", {"N": 4, "V": 1000}, ())
    reason, kind = skip_for(Candidate(_backend(name), case, "bfloat16", "cpu"))
    assert kind == "unavailable" and "cuda" in reason, reason


@pytest.mark.parametrize("name", NAMES)
def test_the_hopper_check_says_nothing_off_a_gpu(name: str):
    b = _backend(name)
    assert b.skip is not None and b.skip(None, "bfloat16", "cpu") is None


def test_logits_off_a_gpu_are_refused_by_name():
    z, t = torch.randn(4, 10), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="one CUDA device"):
        wrapper.softmax_xent_gluon(z, t)
    with pytest.raises(ValueError, match="reduction='avg'"):
        wrapper.softmax_xent_gluon(z, t, reduction="avg")


def test_tma_takes_16_byte_rows_only():
    base = torch.zeros(8, 1024, dtype=torch.bfloat16)
    assert wrapper.tma_ready(base)
    assert wrapper.tma_ready(base[:, :1000])  # padded rows: a 2048-byte stride
    assert not wrapper.tma_ready(torch.zeros(8, 1001, dtype=torch.bfloat16))  # 2002-byte rows
    assert not wrapper.tma_ready(base[:, ::2])  # a column stride of 2
    assert not wrapper.tma_ready(base.view(-1)[1:1 + 8 * 1000].view(8, 1000))  # a base 2 bytes off


def test_every_slot_configuration_fits_a_hopper_sm():
    for size, cfg in wrapper.CONFIG.items():
        ring = cfg["STAGES"] * cfg["BLOCK_V"] * size * cfg["per_sm"]
        assert ring <= 227 * 1024, (size, cfg)
        assert cfg["ring"] == 1, "the producer-warp ring is the one the GPU evidence covers"


def _case(mutant_id: str):
    m = next(m for m in mutants() if m.id == mutant_id)
    return m.expect[0].case


def test_the_slot_mutant_case_refills_a_slot_with_another_chunk():
    # zoo-N64-V32000 let it pass twice on an H200: one row per program, 4 chunks twice in 4 slots, so an early
    # refill brought back the chunk it replaced. The case needs several rows per program and a stream whose
    # period (chunks per row, twice) is not a multiple of the ring's slots.
    p = _case("gluon-xent-slot-reused-early").params
    cfg = wrapper.CONFIG[2]
    per_row = 2 * math.ceil(p["V"] / cfg["BLOCK_V"])
    assert p["N"] >= 4 * SMS * cfg["per_sm"]
    assert per_row % cfg["STAGES"] != 0


def test_the_tail_mutant_case_has_a_partial_slot_and_its_twin_none():
    m = next(m for m in mutants() if m.id == "gluon-xent-tail-zeros-counted")
    bv = wrapper.CONFIG[2]["BLOCK_V"]
    tail, whole = (e.case.params["V"] for e in m.expect)
    assert tail % bv != 0 and whole % bv == 0
