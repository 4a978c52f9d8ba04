"""The local rule (harness/judge/verdict.py, docs/design.md "The local rule"): an error confined to one row,
tile or head fails where it is large against that slice, though the global criteria pass it; correct
results in another rounding order pass it."""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.judge.verdict import verdict_of
from harness.measure import localize as loc
from harness.measure.components import measure_all
from harness.measure.oracle import oracle_and_floor, reference_run
from harness.model.records import ComponentFigures, LocalFigures
from harness.model.registry import backends, get_operator
from harness.model.spec import Axis, Case

OP = get_operator("softmax_xent")
BACKEND = next(b for b in backends("softmax_xent") if b.name == "torch")
# rows of a large vocabulary: the target column's -1/N sets max|dlogits|, the other entries are ~1/(N*V)
CASE = Case("local-N32-V8192", {"N": 32, "V": 8192}, ())


def _figures(k: torch.Tensor, dtype: torch.dtype, backend=BACKEND) -> ComponentFigures:
    ref = oracle_and_floor(OP, CASE, dtype, 0, "cpu", False)
    got = {"outs": {"loss": ref["o_out"]["loss"].float()}, "grads": {"logits": k.to(dtype)}}
    return next(f for f in measure_all(OP, backend, CASE, ref, got) if f.name == "dlogits")


def _floor(dtype: torch.dtype) -> torch.Tensor:
    """What a careful float32 kernel returns: the floor reference's dlogits."""
    ref = oracle_and_floor(OP, CASE, dtype, 0, "cpu", False)
    _, grads, _ = reference_run(OP, ref["inputs"], ref["grad_outputs"], torch.float32)
    return grads["logits"].float()


def _global_only(fig: ComponentFigures) -> str:
    """The verdict under the global criteria alone (the rule before the local one, at 45de1a3)."""
    return verdict_of(ComponentFigures(**{**fig.__dict__, "local": None})).verdict


def _off_target(k: torch.Tensor) -> torch.Tensor:
    """Positions that are not a row's target: where the small probabilities live."""
    ref = oracle_and_floor(OP, CASE, torch.bfloat16, 0, "cpu", False)
    t = ref["inputs"].tensors["targets"]
    mask = torch.ones_like(k, dtype=torch.bool)
    valid = t >= 0
    mask[valid.nonzero().squeeze(1), t[valid]] = False
    return mask


def test_a_correct_result_passes_locally():
    for dtype in (torch.float32, torch.bfloat16):
        fig = _figures(_floor(dtype), dtype)
        v = verdict_of(fig)
        assert fig.local is not None and fig.local.tiles > 1
        assert v.verdict == "PASS" and v.ratio_local <= 1, (dtype, v.reason, v.ratio_local)


def test_one_row_off_by_five_percent_passes_globally_and_fails_locally():
    k = _floor(torch.bfloat16)
    row = 17
    k[row] = torch.where(_off_target(k)[row], k[row] * 1.05, k[row])
    fig = _figures(k, torch.bfloat16)
    assert _global_only(fig) == "PASS"  # one row is 1/32 of the rms, and its entries are far below max|o|
    v = verdict_of(fig)
    assert v.verdict == "FAIL" and v.kind == "local", v.reason
    assert "row 17" in v.reason


def test_one_vocabulary_tile_off_passes_globally_and_fails_locally():
    k = _floor(torch.bfloat16)
    tile = slice(2048, 3072)  # the third BLOCK_V tile of every row
    k[:, tile] = torch.where(_off_target(k)[:, tile], k[:, tile] * 1.1, k[:, tile])
    fig = _figures(k, torch.bfloat16)
    assert _global_only(fig) == "PASS"
    v = verdict_of(fig)
    assert v.verdict == "FAIL" and v.kind == "local", v.reason
    assert "vocab 2048-3071" in v.reason


def test_a_wide_declared_block_does_not_coarsen_the_tiles():
    # a backend declaring BLOCK_V = 8192 (one slot per row here) is judged in the operator's 1024-wide tiles:
    # in 8192-wide ones each row's tile holds its target column, whose -1/N hides every other entry, and
    # off-target probabilities all 28% low (zero fill counted in the log-sum) passed
    wide = dataclasses.replace(BACKEND, blocks={"BLOCK_V": 8192})
    k = _floor(torch.bfloat16)
    k = torch.where(_off_target(k), k * 0.72, k)
    fig = _figures(k, torch.bfloat16, wide)
    assert fig.local is not None and fig.local.block[-1] == 1024, fig.local
    v = verdict_of(fig)
    assert v.verdict == "FAIL" and v.kind in ("local", "bound"), v.reason


def test_error_where_the_oracle_is_zero_throughout_a_tile_fails():
    lf = LocalFigures(["row"], [1], [8], 8, math.inf, 1e-3, [5])
    fig = ComponentFigures("x", dtype="float32", numel=64, oracle_max=1.0, floor_max=1e-7, local=lf)
    v = verdict_of(fig)
    assert v.kind == "local" and "zero throughout" in v.reason


def test_a_floor_that_errs_where_the_oracle_is_zero_leaves_no_local_yardstick():
    lf = LocalFigures(["row"], [1], [8], 8, math.inf, math.inf, [5])
    fig = ComponentFigures("x", dtype="float32", numel=64, oracle_max=1.0, floor_max=1e-7, local=lf)
    assert verdict_of(fig).verdict == "PASS"


def test_one_tile_is_left_to_the_global_rule():
    lf = LocalFigures(["row"], [2], [2], 1, 1.0, 1e-9, [0])
    fig = ComponentFigures("x", dtype="float32", numel=2, oracle_max=1.0, floor_max=1e-7, local=lf)
    assert verdict_of(fig).ratio_local == 0


def test_tiles_hold_sixteen_elements_and_a_partial_block_joins_its_neighbour():
    ax_r, ax_c = Axis("row", 0), Axis("col", 1, block="B", default_block=4)
    axes, sizes = loc.local_layout((9, 33), (ax_r, ax_c), {}, {})
    assert [a.name for a in axes] == ["row", "col"] and sizes == [2, 8]
    e = torch.zeros(9, 33, dtype=torch.float64)
    e[8, 32] = 1.0  # the last element: a partial block on both axes
    o = torch.ones(9, 33, dtype=torch.float64)
    tiles = loc.LocalTiles((9, 33), (axes, sizes), "cpu")
    tiles.add(e, torch.full_like(e, 1e-7), o, (0, 0))
    lf = tiles.figures(0.0)
    assert lf.tiles == (9 // sizes[0]) * (33 // sizes[1])
    assert lf.at == [9 // sizes[0] - 1, 33 // sizes[1] - 1] and lf.err == 1.0
    assert lf.tile_text() == "row 6-8, col 24-32"


def test_tiles_run_along_the_two_axes_with_the_most_slices():
    """Of attention's [B, H, L, Dh] with one batch, four heads and one position block, the tiles are per head (they
    were per batch and position block, the two axes with the fewest slices, until the zoo's dormant-head mutant
    passed through them)."""
    batch, head, pos = Axis("batch", 0), Axis("head", 1), Axis("position", 2, block="BLOCK_M", default_block=64)
    axes, sizes = loc.local_layout((1, 4, 40, 16), (batch, head, pos), {"BLOCK_M": 64}, {})
    assert [a.name for a in axes] == ["batch", "head"] and sizes == [1, 1]  # a tie (one slice each): dimension order
    axes, sizes = loc.local_layout((2, 16, 4096, 128), (batch, head, pos), {"BLOCK_M": 64}, {})
    assert [a.name for a in axes] == ["head", "position"] and sizes == [1, 64]


def test_chunks_gather_the_tiles_of_the_whole():
    g = torch.Generator().manual_seed(3)
    e, f, o = (torch.rand(40, 70, generator=g, dtype=torch.float64) for _ in range(3))
    layout = ([Axis("a", 0), Axis("b", 1)], [4, 8])
    whole = loc.LocalTiles((40, 70), layout, "cpu")
    whole.add(e, f, o, (0, 0))
    parts = loc.LocalTiles((40, 70), layout, "cpu")
    for i in range(0, 40, 7):
        for j in range(0, 70, 13):
            parts.add(e[i:i + 7, j:j + 13], f[i:i + 7, j:j + 13], o[i:i + 7, j:j + 13], (i, j))
    assert torch.equal(whole.maxima, parts.maxima)


def test_local_figures_survive_the_record():
    lf = LocalFigures(["row", "vocab"], [1, 1024], [32, 8192], 256, 0.0123456789, 1e-3, [17, 2])
    fig = ComponentFigures("dlogits", local=lf)
    back = ComponentFigures.from_json(fig.to_json())
    assert back.local is not None and back.local.at == [17, 2] and back.local.tile_text() == "row 17, vocab 2048-3071"
    assert abs(back.local.err - lf.err) < 1e-6 * lf.err  # kept to the verdict's 7 significant digits
