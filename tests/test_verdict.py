"""The verdict rule: what must fail and what must pass (docs/design.md, issue acceptance)."""

from __future__ import annotations

import pytest
import torch

from harness.judge.diagnose import bad_slices, ranges
from harness.judge.verdict import verdict_of
from harness.measure import localize
from harness.measure.figures import check_shape, judge
from harness.measure.oracle import floor_samples, oracle_and_floor
from harness.model.registry import get_operator
from harness.model.spec import Case

OP = get_operator("mhc_pre")
CASE = Case("verdict-n4", {"B": 1, "S": 64, "n": 4, "D": 80}, ())


def _ref(dtype: torch.dtype = torch.float32) -> dict:
    return oracle_and_floor(OP, CASE, dtype, 0, "cpu", False)


def _judge(name: str, k: torch.Tensor, ref: dict, dtype: torch.dtype):
    comp = OP.component(name)
    kind = "o_grad" if comp.kind == "grad" else "o_out"
    o = ref[kind][comp.tensor_name]
    sel = lambda t: comp.select(t, CASE.params)  # noqa: E731
    return judge(name, sel(k), sel(o), floor_samples(ref, comp, CASE.params), dtype)


def _floor_value(ref: dict, name: str) -> torch.Tensor:
    comp = OP.component(name)
    from harness.measure.oracle import reference_run

    _, grads, _ = reference_run(OP, ref["inputs"], ref["grad_outputs"], torch.float32)
    return grads[comp.tensor_name]


def test_all_zeros_fails():
    ref = _ref()
    res, _ = _judge("dgamma", torch.zeros_like(ref["o_grad"]["gamma"]), ref, torch.float32)
    assert res.verdict == "FAIL" and "all zeros" in res.reason


def test_fp32_times_1_01_fails():
    ref = _ref()
    k = (_floor_value(ref, "dphi.pre").double() * 1.01).float()
    res, _ = _judge("dphi.pre", k, ref, torch.float32)
    assert res.verdict == "FAIL"
    assert res.cosine > 0.9999  # right direction, wrong magnitude


def test_last_block_zeroed_fails_and_is_localized():
    ref = _ref()
    k = _floor_value(ref, "dx").clone().float()
    flat = k.view(64, 4 * 80)
    flat[:, 256:] = 0  # the last block of 256 along nD (320 = 256 + 64)
    res, e = _judge("dx", k, ref, torch.float32)
    assert res.verdict == "FAIL"
    comp = OP.component("dx")
    o = comp.select(ref["o_grad"]["x"], CASE.params)
    profiles = localize.profiles(e, comp.select(k, CASE.params), o, None, comp.axes, {"BLOCK_ND": 256}, CASE.params)
    nd = next(p for p in profiles if p.axis == "nD")
    assert bad_slices(nd, res) == [1] and nd.zero == [1]
    assert localize.matches("last", bad_slices(nd, res), nd.buckets)


def test_nan_where_oracle_is_finite_fails():
    ref = _ref()
    k = _floor_value(ref, "dbias.res").clone().float()
    k[10] = float("nan")  # inside the res rows (2n = 8 onwards)
    res, _ = _judge("dbias.res", k, ref, torch.float32)
    assert res.verdict == "FAIL" and "non-finite" in res.reason


def test_wrong_shape_is_shape():
    res = verdict_of(check_shape("dgamma", torch.zeros(4, 80), (320,), torch.float32))
    assert res.verdict == "SHAPE" and "[320]" in res.reason and "[4, 80]" in res.reason
    res = verdict_of(check_shape("dx", torch.zeros(320, dtype=torch.float16), (320,), torch.float32))
    assert res.verdict == "SHAPE"
    assert check_shape("dx", torch.zeros(320), (320,), torch.float32) is None


def test_floor_reference_bf16_result_passes():
    ref = _ref(torch.bfloat16)
    k = _floor_value(ref, "dx").to(torch.bfloat16)
    res, _ = _judge("dx", k, ref, torch.bfloat16)
    assert res.verdict == "PASS", res


def test_other_summation_order_passes():
    ref = _ref()
    # dbias.res = sum over tokens of g_res: summed sequentially, last token first, in float32
    g_res = ref["grad_outputs"]["h_res"].reshape(-1, 16).float()
    acc = torch.zeros(16)
    for t in reversed(range(g_res.shape[0])):
        acc = acc + g_res[t]
    k = torch.cat([_floor_value(ref, "dbias.pre")[:8], acc])
    res, _ = _judge("dbias.res", k, ref, torch.float32)
    assert res.verdict == "PASS", res
    # and the golden backend's own order (eager float32 formulas, not autograd) passes everywhere
    from harness.backends.golden.mhc_pre import backward, forward

    outs, saved = forward(**ref["inputs"].tensors, **ref["inputs"].options)
    grads = backward(saved, ref["grad_outputs"])
    for comp in OP.components:
        k = (outs if comp.kind == "out" else grads)[comp.tensor_name]
        res, _ = _judge(comp.name, k, ref, torch.float32)
        assert res.verdict == "PASS", res


def test_matching_nan_agrees():
    o = torch.tensor([float("nan"), 1.0, 2.0], dtype=torch.float64)
    k = torch.tensor([float("nan"), 1.0, 2.0])
    res, _ = judge("loss", k, o, [torch.zeros(3, dtype=torch.float64)], torch.float32)
    assert res.verdict == "PASS"
    k2 = torch.tensor([0.0, 1.0, 2.0])
    res2, _ = judge("loss", k2, o, [torch.zeros(3, dtype=torch.float64)], torch.float32)
    assert res2.verdict == "FAIL" and "non-finite" in res2.reason


def test_diffuse_drift_fails_on_rms():
    o = torch.randn(4096, dtype=torch.float64)
    floor = [torch.full_like(o, 1e-7)]
    k = (o + 1e-6 * torch.randn_like(o)).float()  # a diffuse error, 10x the floor everywhere
    res, _ = judge("x", k, o, floor, torch.float32)
    assert res.verdict == "FAIL" and res.ratio_rms > 1


def test_ranges_text():
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    # scattered indices: the first runs, then a count instead of a screenful
    text = ranges(list(range(0, 400, 2)))
    assert text.startswith("0, 2, 4") and text.endswith("... (200 in 200 runs)") and len(text) < 80
    assert localize.matches("all-but-first", [1, 2, 3], 4)
    assert not localize.matches("all-but-first", [0, 1, 2, 3], 4)


def _failing(slices, floor_rms=1e-7):
    """A component whose first slice is 10x its bound and the rest at the floor."""
    from harness.model.records import ComponentFigures

    f = ComponentFigures("dlogits", dtype="float32", numel=4096, max_excess=1e-5, rms_excess=1e-6,
                         floor_max=3e-7, floor_rms=floor_rms, oracle_max=1.0, oracle_rms=0.5, cosine=0.95,
                         scale=0.9, scaled_max=1.0, scaled_rms=1.0, slices=slices)
    return f, verdict_of(f)


def test_last_block_hint_needs_a_last_block_worth_the_name():
    from harness.judge.diagnose import hints_for
    from harness.model.records import SliceProfile

    def prof(extent):
        return SliceProfile("vocab", 1024, extent, 2, err_max=[1e-5, 1e-7], err_rms=[2e-6, 1e-7],
                            floor_max=[3e-7, 3e-7], floor_rms=[1e-7, 1e-7], oracle_max=[1.0, 1.0], count=[1, 1],
                            scale=[1.0, 1.0], scaled_rms=[1.0, 1.0])
    f, v = _failing([prof(2000)])
    assert [h.cls for h in hints_for(f, v)] == ["accumulation-lost"]
    # V = 1025: the one element of the last block being right is no sign of lost accumulation
    f, v = _failing([prof(1025)])
    assert "accumulation-lost" not in [h.cls for h in hints_for(f, v)]


def test_a_report_mixing_runs_names_them_and_tags_earlier_cells(tmp_path):
    from harness.measure.failures import error_cell
    from harness.model.registry import get_operator
    from harness.render.report import ReportWriter, render_markdown
    from harness.store.reports import load

    op = get_operator("mhc_pre")
    a, b = op.cases("smoke", "cpu")[:2]
    old = ReportWriter(tmp_path, "cpu", {"run_id": "r1", "commit": "aaa111", "date": "2026-01-01 00:00 UTC"})
    old.append(error_cell("mhc_pre", "golden", a, "float32", "cpu", 0, "ERROR", "boom"))
    old.append(error_cell("mhc_pre", "golden", b, "float32", "cpu", 0, "ERROR", "old failure"))
    new = ReportWriter(tmp_path, "cpu", {"run_id": "r2", "commit": "bbb222", "date": "2026-02-01 00:00 UTC"})
    new.append(error_cell("mhc_pre", "golden", a, "float32", "cpu", 0, "ERROR", "fresh failure"))
    md = render_markdown("mhc_pre", *load(tmp_path / "cpu", "mhc_pre"))
    assert "commit `bbb222`" in md and "Cells come from several runs" in md
    assert "- 1 cells: commit `bbb222`" in md and "- 1 cells: commit `aaa111`" in md
    fresh = next(line for line in md.splitlines() if "fresh failure" in line)
    stale = next(line for line in md.splitlines() if "old failure" in line)
    assert "[run at commit" not in fresh and "[run at commit `aaa111`" in stale
    assert "boom" not in md  # the newer result of the same cell replaces it
    from harness.store.reports import compact

    def state():
        cells, runs = load(tmp_path / "cpu", "mhc_pre")
        return sorted(cells, key=lambda c: c.id), runs

    before = state()
    compact(tmp_path / "cpu", "mhc_pre")
    assert "boom" not in (tmp_path / "cpu" / "mhc_pre.jsonl").read_text()  # superseded: gone from the file
    assert state() == before  # and the report reads the same


def test_packed_records_are_read_with_the_lines_appended_since_and_stay_packed(tmp_path):
    import gzip
    import subprocess

    from harness.measure.failures import error_cell
    from harness.render.report import ReportWriter
    from harness.store.reports import compact, load, operators_in

    op = get_operator("mhc_pre")
    a, b = op.cases("smoke", "cpu")[:2]
    d = tmp_path / "cpu"
    ReportWriter(tmp_path, "cpu", {"run_id": "r1", "commit": "a"}).append(
        error_cell("mhc_pre", "golden", a, "float32", "cpu", 0, "ERROR", "packed, superseded"))
    subprocess.run(["gzip", "-n", str(d / "mhc_pre.jsonl")], check=True)  # as the docs say to pack a folder
    w = ReportWriter(tmp_path, "cpu", {"run_id": "r2", "commit": "b"})
    w.append(error_cell("mhc_pre", "golden", a, "float32", "cpu", 0, "ERROR", "appended"))
    w.append(error_cell("mhc_pre", "golden", b, "float32", "cpu", 0, "ERROR", "appended too"))
    assert operators_in(d) == ["mhc_pre"]
    before = sorted((c.case.name, c.error) for c in load(d, "mhc_pre")[0])
    assert before == sorted([(a.name, "appended"), (b.name, "appended too")])
    compact(d, "mhc_pre")
    assert not (d / "mhc_pre.jsonl").exists()  # taken into the packed file
    assert "superseded" not in gzip.decompress((d / "mhc_pre.jsonl.gz").read_bytes()).decode()
    assert sorted((c.case.name, c.error) for c in load(d, "mhc_pre")[0]) == before


def test_a_case_that_left_the_preset_leaves_the_report(tmp_path):
    from harness.measure.failures import error_cell
    from harness.model.registry import get_operator
    from harness.render.report import ReportWriter
    from harness.store.reports import load

    op = get_operator("mhc_pre")
    a, b = op.cases("smoke", "cpu")[:2]

    def run(rid, cases, dtypes, case_filter=None):
        plan = [f"golden|{dt}|{c.name}" for c in cases for dt in dtypes]  # as a run header lists them
        w = ReportWriter(tmp_path, "cpu", {"run_id": rid, "commit": rid, "sizes": "sweep", "case_filter": case_filter,
                                           "planned": {"mhc_pre": plan}})
        for c in cases:
            for dt in dtypes:
                w.append(error_cell("mhc_pre", "golden", c, dt, "cpu", 0, "ERROR", rid))

    def names():
        return sorted((c.case.name, c.dtype, c.run_id) for c in load(tmp_path / "cpu", "mhc_pre")[0])

    run("r1", (a, b), ("float32", "float16"))
    run("r2", (a,), ("float32", "float16"), case_filter=a.name)
    assert len(names()) == 4  # a --case run plans a part of the preset: b stays
    run("r3", (a,), ("float32",))  # b left the preset: its float32 cell goes, float16 was not planned
    assert names() == sorted([(a.name, "float32", "r3"), (a.name, "float16", "r2"), (b.name, "float16", "r1")])


def test_a_report_of_a_run_stopped_midway_lists_the_cells_without_a_result(tmp_path):
    from harness.measure.failures import error_cell
    from harness.model.registry import get_operator
    from harness.render.report import ReportWriter, render_markdown
    from harness.store.reports import load

    op = get_operator("mhc_pre")
    a, b = op.cases("smoke", "cpu")[:2]
    planned = [f"golden|{dt}|{c.name}" for c in (a, b) for dt in ("float32", "float16")]
    w = ReportWriter(tmp_path, "cpu", {"run_id": "r1", "commit": "aaa111", "date": "2026-01-01 00:00 UTC",
                                       "planned": {"mhc_pre": planned, "softmax_xent": ["x|y|z"]}})
    w.append(error_cell("mhc_pre", "golden", a, "float32", "cpu", 0, "ERROR", "boom"))
    w.append(error_cell("mhc_pre", "golden", a, "float16", "cpu", 0, "ERROR", "boom"))
    cells, runs = load(tmp_path / "cpu", "mhc_pre")
    assert runs["r1"]["planned"] == planned  # each operator's file keeps its own plan only
    md = render_markdown("mhc_pre", cells, runs)
    assert "Incomplete: 2 of 4 planned cells of the latest run have no result" in md
    assert f"- `{b.name}`: golden float32, golden float16" in md
    w.append(error_cell("mhc_pre", "golden", b, "float32", "cpu", 0, "ERROR", "boom"))
    w.append(error_cell("mhc_pre", "golden", b, "float16", "cpu", 0, "ERROR", "boom"))
    assert "planned cells" not in render_markdown("mhc_pre", *load(tmp_path / "cpu", "mhc_pre"))


def test_heatmaps_are_drawn_once_per_data(tmp_path):
    import os

    pytest.importorskip("matplotlib")
    from harness.render.report import heatmaps

    grid = {"values": [[0.0, 1.0], [2.0, 3.0]], "axes": ["head", "position"], "block": [1, 64]}
    cell = [_failing_cell("c1", grid)]
    (path,) = heatmaps(tmp_path, "op", cell).values()
    png = tmp_path / path
    first = png.stat().st_mtime_ns
    os.utime(png, ns=(first - 10**9, first - 10**9))  # so that a rewrite would show
    heatmaps(tmp_path, "op", cell)
    assert png.stat().st_mtime_ns == first - 10**9  # same data: the picture is kept
    grid["values"][0][0] = 5.0
    heatmaps(tmp_path, "op", cell)
    assert png.stat().st_mtime_ns != first - 10**9  # new data: drawn again


def _failing_cell(name, grid):
    from harness.judge.judgement import Rules, judge_cell
    from harness.model.records import CellRecord, ComponentFigures, Status

    f = ComponentFigures("dq", dtype="float32", numel=64, max_excess=1.0, rms_excess=1.0, floor_max=1e-7,
                         floor_rms=1e-7, oracle_max=1.0, oracle_rms=1.0, grid=grid)
    rec = CellRecord("op", "triton", "float32", Case(name, {}), "cpu", status=Status.FAIL, components=[f])
    return judge_cell(rec, Rules())


def test_a_declared_gap_in_the_older_form_names_an_input_class():
    from harness.model.registry import Backend

    b = Backend(operator="op", name="b", impl=lambda: None,
                expected_gaps={"float16": "all fp16", "float32@confident+smoothing": "cancels"})
    (fp16, fp32) = sorted(b.gaps, key=lambda g: g.dtypes)
    assert fp16.covers_cell("float16", (), "cpu") and fp16.ceiling == 10.0 and not fp16.components
    assert fp32.covers_cell("float32", ("confident", "smoothing", "V>1024"), "h100")
    assert not fp32.covers_cell("float32", ("confident",), "cpu")  # every named tag is needed
    assert not fp32.covers_cell("bfloat16", ("confident", "smoothing"), "cpu")


def test_many_heatmaps_are_drawn_by_a_process_pool(tmp_path):
    pytest.importorskip("matplotlib")
    from harness.render.report import _png_digest, heatmaps

    grid = {"values": [[0.0, 1.0], [2.0, 3.0]], "axes": ["head", "position"], "block": [1, 64]}
    cells = [_failing_cell(f"c{i}", grid) for i in range(10)]
    paths = heatmaps(tmp_path, "op", cells).values()
    assert len(paths) == 10 and all(_png_digest(tmp_path / p) for p in paths)  # each drawn, with its digest


def test_a_floor_summary_bounds_like_the_sample_it_replaces():
    from harness.judge.verdict import FloorSummary

    g = torch.Generator().manual_seed(3)
    o = torch.randn(64, generator=g, dtype=torch.float64)
    o[5] = float("nan")  # a position where the oracle itself is not finite
    k = o + 1e-6 * torch.randn(64, generator=g, dtype=torch.float64)
    first = 1e-7 * torch.rand(64, generator=g, dtype=torch.float64)
    later = 3e-7 * torch.rand(64, generator=g, dtype=torch.float64)  # the larger one sets the bound
    later[9] = float("inf")
    whole, _ = judge("x", k, o, [first, later], torch.float32)
    summed, _ = judge("x", k, o, [first, FloorSummary.of(later, o)], torch.float32)
    w, s = whole.figures, summed.figures
    assert (s.floor_max, s.floor_rms, summed.verdict) == (w.floor_max, w.floor_rms, whole.verdict)
    assert s.floor_max > float(first.max())


def test_the_store_keeps_no_profiles_or_heatmap_grid_for_a_cell_inside_a_declared_gap():
    # eager torch's 16-bit cross-entropy cells are XFAIL: their profiles and grids were two thirds of an H200 sweep's
    # bytes, and the report shows a declared gap without hints or heatmaps; the same figures failing keep theirs
    import copy
    from pathlib import Path

    from harness.judge.judgement import judge_cell
    from harness.model.records import SliceProfile
    from harness.store.reports import _stored, load

    cells, _ = load(Path(__file__).resolve().parent.parent / "reports" / "cpu", "softmax_xent")
    gap = next(c for c in cells if c.backend == "torch" and c.dtype == "float16" and judge_cell(c).shown == "XFAIL")
    failing = copy.deepcopy(gap)
    failing.backend = "cuda"  # no declaration covers these figures for the CUDA kernel
    assert judge_cell(failing, device_class="h200").shown == "FAIL"
    for c in (gap, failing):
        for f in c.components:
            f.slices = [SliceProfile("row", 1, 2, 2, 1, [1.0, 2.0], [1.0, 2.0], [1.0, 1.0], [1.0, 1.0], [3.0, 3.0],
                                     [1, 1], [1.0, 1.0], [0.0, 0.0])]
            f.grid = {"axes": ["row", "vocab"]}
    assert all(not f.slices and f.grid is None for f in _stored(gap, "cpu").components)
    j = judge_cell(_stored(failing, "h200"), device_class="h200")
    assert all(c.figures.slices and c.figures.grid for c in j.components if c.failed)
