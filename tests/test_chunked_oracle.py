"""The memory-lean oracle (issue #26, part 3): a separable operator's oracle and floor evaluated chunk by
chunk (harness/measure/chunking.py, harness/measure/oracle.py) and its components measured as the chunks come
(harness/measure/streaming.py) give the figures and verdicts of the whole evaluation.

Tiny chunks are forced with HARNESS_ORACLE_CHUNK (slices per chunk). softmax_xent's reference is
row-separable to the bit, so there every per-row figure must equal the whole one; the GEMM-based
references (fused_linear_xent, mhc_pre, lazy_attention) round a chunk of rows differently from all rows
(BLAS picks its kernel by the row count), so there the float32 floor is another sample of its rounding:
verdicts and the backend's error figures must agree, and the streamed statistics must equal the whole
ones on the same (chunk-evaluated) tensors.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.judge.judgement import judge_cell
from harness.judge.verdict import verdict_of
from harness.measure import cell, chunking, oracle, streaming
from harness.measure.chunking import PartialSums, _Tree
from harness.model.records import ComponentFigures, SliceProfile
from harness.model.registry import Backend, get_backend, get_operator
from harness.model.spec import Case, Component, Inputs, OperatorSpec, Separable, SplitAxis

XENT, FUSED, MHC, LAZY = (get_operator(n) for n in ("softmax_xent", "fused_linear_xent", "mhc_pre",
                                                       "lazy_attention"))
# figures that come from the backend's error against the oracle (not from the floor, not gated by it)
ERROR_FIELDS = ("numel", "max_err", "mean_err", "max_excess", "rms_excess", "oracle_max", "oracle_rms", "rel_rms",
                "cosine", "zero_frac", "all_zero", "nonfinite", "mismatch", "mismatch_inf", "mismatch_nan",
                "mismatch_first", "extra_bound_max", "poisoned", "naive_rel_rms")


def _chunk(monkeypatch: pytest.MonkeyPatch, slices: int | None) -> None:
    oracle.clear_cache()
    if slices is None:
        monkeypatch.delenv(chunking.ENV_SLICES, raising=False)
    else:
        monkeypatch.setenv(chunking.ENV_SLICES, str(slices))


def _spoil(g: torch.Tensor, dim: int, start: int, nan_at: tuple) -> torch.Tensor:
    """``g`` scaled by 1.01 from index ``start`` of ``dim`` on, NaN at ``nan_at``: a failing component with
    structure (profiles, heatmap, positions, a scale fit) and a non-finite mismatch."""
    g = g.clone()
    start = min(start, g.shape[dim] - 1)
    g.narrow(dim, start, g.shape[dim] - start).mul_(1.01)
    g[nan_at] = math.nan
    return g


class _Spoiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, how):  # noqa: ANN001, ANN205
        ctx.how = how
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        return _spoil(g, *ctx.how), None


def _wrong(op: OperatorSpec, of: str, inp: str, *how: object) -> Backend:
    """The ``of`` backend of ``op`` with the gradient of ``inp`` spoiled (see _spoil)."""
    base = get_backend(op.name, of)
    fwd, bwd = base.resolve()
    if bwd is None:
        def impl(**kw):  # noqa: ANN003, ANN202
            kw[inp] = _Spoiled.apply(kw[inp], how)
            return fwd(**kw)
        return replace(base, name="wrong", impl=impl, _resolved=None)

    def backward(saved, g):  # noqa: ANN001, ANN202
        grads = dict(bwd(saved, g))
        grads[inp] = _spoil(grads[inp], *how)
        return grads
    return replace(base, name="wrong", backward=backward, _resolved=None)


BACKENDS = {
    "softmax_xent": ("torch", ("logits", 0, 2, (0, 0))),
    "fused_linear_xent": ("torch", ("hidden", 0, 3, (1, 2))),
    "mhc_pre": ("golden", ("x", 1, 2, (0, 1, 0, 0))),
    "lazy_attention": ("torch", ("q", 1, 1, (0, 0, 1, 0))),
}


def _backends(op: OperatorSpec) -> list[Backend]:
    name, bug = BACKENDS[op.name]
    return [get_backend(op.name, name), _wrong(op, name, *bug)]


def _cells(op: OperatorSpec, dtypes: tuple[str, ...], slices: int | None, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[dict, dict]:
    """The smoke cells of both backends, and per case which components the plan measures chunk by chunk."""
    out, split = {}, {}
    for case in op.cases("smoke", "cpu"):
        for backend in _backends(op):
            for dt in dtypes:
                _chunk(monkeypatch, slices)
                out[(case.name, backend.name, dt)] = cell.run_cell(op, backend, case, dt, "cpu", 0, repeats=1)
                plan = next(iter(oracle._ORACLE_CACHE.values())).get("plan")
                split[case.name] = {c.name for c in op.components if plan is not None and plan.split(c.tensor_name)}
    return out, split


def _close(a: object, b: object, rtol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * max(abs(a), abs(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rtol) for k in a)
    if isinstance(a, SliceProfile) and isinstance(b, SliceProfile):
        # a slice's scaled_rms is sqrt(kk - 2 s ko + s^2 oo) (localize.py), which cancels where k ~ o: its
        # noise is about 1e-8 |o| whatever the order of the sums, so it is compared at that scale
        return all(_close(getattr(a, f.name), getattr(b, f.name), rtol) for f in fields(SliceProfile)
                   if f.name != "scaled_rms") and \
            all(abs(x - y) <= 1e-7 * m for x, y, m in zip(a.scaled_rms, b.scaled_rms, a.oracle_max, strict=True))
    return a == b


def _differ(a: ComponentFigures, b: ComponentFigures, names: tuple[str, ...] | None, rtol: float) -> list[str]:
    names = names or tuple(f.name for f in fields(ComponentFigures))
    return [f"{a.name}.{n}: {getattr(a, n)!r:.80} vs {getattr(b, n)!r:.80}" for n in names
            if not _close(getattr(a, n), getattr(b, n), rtol)]


def _compare(whole: dict, chunked: tuple[dict, dict], op: OperatorSpec, exact_split: bool) -> list[str]:
    """Differences between whole and chunked cells: verdicts, statuses and contracts always; the backend's
    error figures of every component; with ``exact_split``, every figure of the per-chunk components."""
    chunked, split = chunked
    assert sum(map(bool, split.values())) >= len(split) - 1, split  # every case was cut (N3-V2 into 3: not)
    bad = []
    for key, b in chunked.items():
        a = whole[key]
        if a.status != b.status:
            bad.append(f"{key}: status {a.status} vs {b.status}")
        va = {f.name: verdict_of(f, op.k_max, op.k_rms).verdict for f in a.components}
        vb = {f.name: verdict_of(f, op.k_max, op.k_rms).verdict for f in b.components}
        if va != vb:
            bad.append(f"{key}: verdicts {va} vs {vb}")
        fb = {f.name: f for f in b.components}
        for f in a.components:
            per_row = f.name in split[key[0]]
            # 1e-9: sums in another order differ by 1e-16 relative, and by 1e-11 after the cancellation in a
            # per-slice scaled_rms; records keep 4 to 7 significant digits
            bad += [f"{key} {d}" for d in _differ(f, fb[f.name], None if exact_split and per_row else ERROR_FIELDS,
                                                  1e-9 if exact_split and per_row else 1e-6)]
        if not _close(a.microbatch, b.microbatch, 1e-12):
            bad.append(f"{key}: microbatch {a.microbatch} vs {b.microbatch}")
        if [c.to_json() for c in a.contracts] != [c.to_json() for c in b.contracts]:
            bad.append(f"{key}: contracts {a.contracts} vs {b.contracts}")
    return bad


# ---- plans ----------------------------------------------------------------------------------------------

def _lazy_inputs(B: int = 2, H: int = 3) -> Inputs:
    case = Case("plan", {"B": B, "H": H, "L": 5, "Dh": 16, "W": 7})
    return LAZY.make_inputs(case, torch.float32, torch.Generator().manual_seed(0), "cpu")


def test_a_chunk_takes_outer_axes_one_index_at_a_time_and_inner_axes_in_ranges(monkeypatch):
    inputs = _lazy_inputs()
    monkeypatch.setenv(chunking.ENV_SLICES, "2")
    plan = chunking.plan(LAZY, inputs)
    assert plan is not None and plan.axes == ("batch", "head") and plan.extents == (2, 3)
    assert plan.chunks == (((0, 1), (0, 2)), ((0, 1), (2, 3)), ((1, 2), (0, 2)), ((1, 2), (2, 3)))
    monkeypatch.setenv(chunking.ENV_SLICES, "4")  # covers the heads: whole batch entries, 4 // 3 of them
    assert chunking.plan(LAZY, inputs).chunks == (((0, 1), (0, 3)), ((1, 2), (0, 3)))
    monkeypatch.setenv(chunking.ENV_SLICES, "6")  # the whole case: not cut
    assert chunking.plan(LAZY, inputs) is None
    # q, k, v run along both axes (their chunks are their parts); bias and tau along the heads only (sums)
    monkeypatch.setenv(chunking.ENV_SLICES, "2")
    plan = chunking.plan(LAZY, inputs)
    assert plan.split("q") and not plan.split("bias") and not plan.split("tau")
    chunk = plan.chunks[1]
    assert torch.equal(plan.take("q", inputs.tensors["q"], chunk), inputs.tensors["q"][0:1, 2:3])
    assert torch.equal(plan.take("bias", inputs.tensors["bias"], chunk), inputs.tensors["bias"][2:3])


def test_the_budget_cuts_only_cases_past_it_and_bad_settings_name_the_variable(monkeypatch):
    inputs = _lazy_inputs(B=3, H=4)
    monkeypatch.delenv(chunking.ENV_SLICES, raising=False)
    assert chunking.plan(LAZY, inputs) is None  # 12 heads of [5, 5]: far under the default budget
    per_slice = 24 * 8 * 5 * 5  # cases/lazy_attention.py: slice_bytes
    monkeypatch.setenv(chunking.ENV_MB, str(5 * per_slice / 2**20))
    assert [len(range(*c[1])) for c in chunking.plan(LAZY, inputs).chunks] == [4, 4, 4]  # 5 slices: 1 x 4 heads
    monkeypatch.setenv(chunking.ENV_SLICES, "0")
    with pytest.raises(ValueError, match=chunking.ENV_SLICES):
        chunking.plan(LAZY, inputs)
    monkeypatch.setenv(chunking.ENV_SLICES, "")
    monkeypatch.setenv(chunking.ENV_MB, "lots")
    with pytest.raises(ValueError, match=chunking.ENV_MB):
        chunking.plan(LAZY, inputs)


def test_a_separable_axis_naming_no_tensor_of_the_operator_is_refused():
    with pytest.raises(ValueError, match="separable axis 'row' names logit"):
        replace(XENT, separable=Separable((SplitAxis("row", {"logit": 0}),)))


def test_a_component_view_that_is_not_a_reshape_is_refused_by_name(monkeypatch):
    comps = tuple(Component(c.name, c.source, (lambda t, p: t.T) if c.name == "dlogits" else c.view, c.axes)
                  for c in XENT.components)
    op = replace(XENT, components=comps)
    _chunk(monkeypatch, 1)
    with pytest.raises(ValueError, match="component 'dlogits'.*not a reshape"):
        oracle.oracle_and_floor(op, Case("t", {"N": 4, "V": 7}), torch.float32, 0, "cpu", False)


# ---- the chunked oracle ---------------------------------------------------------------------------------

def _whole_and_chunked(op: OperatorSpec, case: Case, compute: torch.dtype, monkeypatch) -> tuple:
    _chunk(monkeypatch, 1)
    inputs = oracle.gen_inputs(op, case, torch.float32, 0, "cpu")
    plan, shapes = oracle.resolved_plan(op, chunking.plan(op, inputs), inputs)
    g = oracle.gen_grad_outputs(op, case, 0, inputs.tensors, shapes, oracle.output_contract(op, inputs.tensors),
                                "cpu")
    whole = oracle.reference_run(op, inputs, g, compute)[:2]
    return plan, whole, oracle.evaluate_chunked(op, plan, inputs, g, compute)


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_the_chunked_oracle_of_softmax_xent_is_the_whole_one_to_the_bit(compute, monkeypatch):
    for case in (Case("mean", {"N": 9, "V": 37, "ignored": 0.2, "label_smoothing": 0.1, "z_loss": 1e-2}),
                 Case("none", {"N": 9, "V": 37, "ignored": 0.2, "reduction": "none"})):
        plan, (wo, wg), (co, cg) = _whole_and_chunked(XENT, case, compute, monkeypatch)
        assert len(plan.chunks) == 9
        assert torch.equal(wg["logits"], cg["logits"])
        if case.name == "none":
            assert plan.split("loss") and torch.equal(wo["loss"], co["loss"])
        else:  # a partial sum per row chunk, added up (float64: running; float32: pairwise)
            assert not plan.split("loss") and co["loss"].shape == () and torch.allclose(wo["loss"], co["loss"],
                                                                                        rtol=1e-6, atol=0)


@pytest.mark.parametrize("op,case", [
    (FUSED, Case("f", {"N": 7, "H": 16, "V": 31, "ignored": 0.2, "return_lse": True})),
    (MHC, Case("m", {"B": 2, "S": 3, "n": 4, "D": 8})),
    (LAZY, Case("l", {"B": 2, "H": 3, "L": 9, "Dh": 16, "W": 4})),
])
def test_the_chunked_oracle_of_gemm_references_is_the_whole_one_to_float64_rounding(op, case, monkeypatch):
    plan, (wo, wg), (co, cg) = _whole_and_chunked(op, case, torch.float64, monkeypatch)
    assert len(plan.chunks) > 2
    for whole, chunked in ((wo, co), (wg, cg)):
        assert whole.keys() == chunked.keys()
        for name, w in whole.items():
            torch.testing.assert_close(chunked[name], w, rtol=1e-13, atol=1e-14, msg=name)


def test_partial_sums_add_pairwise_in_their_dtype_per_region(monkeypatch):
    xs = [torch.tensor([v], dtype=torch.float32) for v in (1.0, 2.0**-24, 2.0**-24, 2.0**-24, 3.0)]
    tree = _Tree()
    for x in xs:
        tree.add(x.clone())
    a, b, c, d, e = xs
    assert torch.equal(tree.total(), ((a + b) + (c + d)) + e)  # not (((a + b) + c) + d) + e, which is 1 + 3
    assert not torch.equal(tree.total(), (((a + b) + c) + d) + e)
    # past the levels the budget holds, completed trees go to a running sum: fused_linear_xent's float32
    # dweight at V=128256, H=4096 (2.1 GB) is accumulated chunk after chunk, a gradient of a few MB pairwise
    running = _Tree(chunking.tree_levels(128256 * 4096 * 4))
    for x in xs:
        running.add(x.clone())
    assert torch.equal(running.total(), (((a + b) + c) + d) + e)
    assert chunking.tree_levels(4096 * 1024 * 4) >= 7  # 128 chunks' partials of a [4096, 1024] float32
    # lazy_attention's dbias runs along the heads and is a sum over the batch: each head range its own sum
    monkeypatch.setenv(chunking.ENV_SLICES, "2")
    plan = chunking.plan(LAZY, _lazy_inputs())
    sums = PartialSums(plan, tree=True)
    for chunk in plan.chunks:
        h = range(*chunk[1])
        sums.add("bias", chunk, torch.tensor([[float(chunk[0][0] + 1) * 10 ** i] for i in h]))
    assert sums.result("bias", (3, 1)).flatten().tolist() == [3.0, 30.0, 300.0]



def test_a_chunked_partial_sum_takes_the_root_of_its_chunks_squared_errors_as_a_floor_sample(monkeypatch):
    """A scalar summed over chunks has as its floor error the sum of the chunks' errors, one sample that may
    cancel; each draw also adds sqrt(sum of the squared chunk errors), the scale from as many samples as chunks
    (the chunk error scale, oracle._oracle_and_floor_chunked). Here the unnudged draw's, computed apart."""
    case = Case("m", {"B": 2, "S": 3, "n": 4, "D": 8})
    _chunk(monkeypatch, 1)
    entry = oracle.oracle_and_floor(MHC, case, torch.float32, 0, "cpu", False)
    plan = entry["plan"]
    assert len(plan.chunks) > 2 and not plan.split("alpha")
    sq = None
    for _, _, og, _, rg in oracle.chunk_references(MHC, plan, entry["inputs"], entry["grad_outputs"], False):
        e2 = (rg["alpha"].to(torch.float64) - og["alpha"]).square()
        sq = e2 if sq is None else sq + e2
    for comp in (c for c in MHC.components if c.name.startswith("dalpha.")):
        want = float(comp.select(sq.sqrt(), case.params).max())
        assert want > 0, comp.name
        assert want in [s.max for s in entry["r_summaries"][comp.name]], comp.name

# ---- cells: chunked against whole -------------------------------------------------------------------------

def test_softmax_xent_cells_chunked_have_the_figures_of_whole_ones(monkeypatch):
    whole, _ = _cells(XENT, ("float32", "float16"), None, monkeypatch)
    # passing and failing cells both (a failing component, in a declared gap or not)
    assert {"FAIL" if judge_cell(c).failed_components else "PASS" for c in whole.values()} == {"PASS", "FAIL"}
    for slices, dtypes in ((1, ("float32", "float16")), (3, ("float32",))):
        chunked = _cells(XENT, dtypes, slices, monkeypatch)
        assert not _compare(whole, chunked, XENT, exact_split=True), slices
        # and each chunked cell says so, with the chunks' size (the floor's library calls ran at that shape)
        cut = [c for c in chunked[0].values() if chunked[1][c.case.name]]
        assert cut
        for c in cut:
            assert any(n.startswith("oracle and floor evaluated in ") and f"at most {slices} slices" in n
                       for n in c.notes), c.notes
    assert not any("chunks" in n for c in whole.values() for n in c.notes)


@pytest.mark.parametrize("op", [FUSED, MHC, LAZY], ids=lambda o: o.name)
def test_gemm_operator_cells_chunked_have_the_verdicts_and_errors_of_whole_ones(op, monkeypatch):
    dtypes = ("float32",)
    whole, _ = _cells(op, dtypes, None, monkeypatch)
    # passing and failing cells both (a failing component, in a declared gap or not)
    assert {"FAIL" if judge_cell(c).failed_components else "PASS" for c in whole.values()} == {"PASS", "FAIL"}
    assert not _compare(whole, _cells(op, dtypes, 1, monkeypatch), op, exact_split=False)


@pytest.mark.parametrize("op,case,dtype", [
    (MHC, "n4-xT-gradpad", "float16"),
    (LAZY, "L17-qkvT-dOcontig-B2", "float32"),
    (FUSED, "N24-H16-V67-mb2", "float32"),
], ids=lambda x: getattr(x, "name", x))
def test_streamed_figures_equal_the_whole_figures_of_the_same_tensors(op, case, dtype, monkeypatch):
    """measure_all of a chunked entry against measure_all of the same entry with its per-chunk results
    put together whole: the streaming statistics, profiles, heatmap and positions, BLAS aside."""
    case = next(c for c in op.cases("smoke", "cpu") if c.name == case)
    _chunk(monkeypatch, 1)
    ref = oracle.oracle_and_floor(op, case, getattr(torch, dtype), 0, "cpu", False)
    plan, inputs, g, contract = ref["plan"], ref["inputs"], ref["grad_outputs"], ref["contract"]
    o_out, o_grad = oracle.evaluate_chunked(op, plan, inputs, g, torch.float64)
    r_out, r_grad = oracle.evaluate_chunked(op, plan, inputs, g, torch.float32)
    whole = {**ref, "plan": None, "o_out": dict(ref["o_out"]), "o_grad": dict(ref["o_grad"]),
             "r_out": dict(ref["r_out"]), "r_grad": dict(ref["r_grad"])}
    for kind, o_t, r_t, table, errs in (("out", o_out, r_out, whole["o_out"], whole["r_out"]),
                                        ("grad", o_grad, r_grad, whole["o_grad"], whole["r_grad"])):
        for name in o_t:
            if plan.split(name) and o_t[name] is not None:
                table[name] = o_t[name]
                errs[name] = [oracle._err(oracle.rounded(kind, name, r_t[name], inputs, contract), o_t[name])]
    for backend in _backends(op):
        got = _run(op, backend, case, dtype, ref)
        streamed = cell.measure_all(op, backend, case, ref, got)
        plain = cell.measure_all(op, backend, case, whole, got)
        assert [f.name for f in streamed] == [f.name for f in plain]
        assert any(f.slices for f in plain) or backend.name != "wrong"
        bad = [d for a, b in zip(plain, streamed, strict=True) for d in _differ(a, b, None, 1e-9)]
        assert not bad, bad


def _run(op: OperatorSpec, backend: Backend, case: Case, dtype: str, ref: dict) -> dict:
    """The backend's results on the cell's inputs, as run_cell gets them."""
    inp = oracle.gen_inputs(op, case, getattr(torch, dtype), 0, "cpu")
    shapes = {k: tuple(v.shape) for k, v in ref["o_out"].items()}
    g = oracle.gen_grad_outputs(op, case, 0, inp.tensors, shapes, ref["contract"], "cpu")
    if case.microbatches > 1:
        return cell.call_microbatched(op, backend, inp, g, case.microbatches, 0, case, "cpu")
    return cell.call_backend(op, backend, inp, g, "cpu")


# ---- memory ---------------------------------------------------------------------------------------------

class _Largest(TorchDispatchMode):
    """The largest float64 tensor any aten op made while active (the backward included: autograd's engine
    runs it under the caller's dispatch modes)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.device.type != "meta":
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("slices", [None, 4])
def test_a_chunked_oracle_and_measurement_make_no_float64_tensor_of_the_whole_case(slices, monkeypatch):
    case = Case("mem", {"N": 64, "V": 2048, "ignored": 0.2})
    backend = _backends(XENT)[1]  # failing: the second pass (profiles, heatmap) runs too
    _chunk(monkeypatch, slices)
    with _Largest() as probe:
        ref = oracle.oracle_and_floor(XENT, case, torch.float32, 0, "cpu", False)
    got = _run(XENT, backend, case, "float32", ref)
    with probe:
        rows = cell.measure_all(XENT, backend, case, ref, got)
    assert verdict_of(rows[1]).verdict == "FAIL" and rows[1].slices and rows[1].grid
    if slices is None:
        assert probe.numel >= 64 * 2048  # the whole oracle: the probe sees it
    else:
        assert probe.numel <= 4 * 2048  # a chunk of 4 rows at most
        assert ref["o_grad"]["logits"].is_meta


# ---- contracts ----------------------------------------------------------------------------------------------

def test_the_input_checksum_sees_one_changed_element_and_compares_values_as_equality_does():
    t = torch.randn(300, 7).to(torch.bfloat16)[:, :5]
    before = streaming.checksum(t)
    assert streaming.checksum(t.clone()) == before
    u = t.clone()
    u.view(torch.int16)[123, 4] += 1  # one unit in the last place
    assert streaming.checksum(u) != before
    v = t.clone()
    v[[1, 2]] = v[[2, 1]]  # two rows swapped: the same values elsewhere
    assert streaming.checksum(v) != before
    nan_a = torch.tensor([1.0, math.nan])
    nan_b = torch.tensor([1.0, -math.nan])
    assert streaming.checksum(nan_a) == streaming.checksum(nan_b)
    assert streaming.checksum(torch.tensor([0.0, 2.0])) == streaming.checksum(torch.tensor([-0.0, 2.0]))
    assert streaming.checksum(torch.tensor(3)) != streaming.checksum(torch.tensor(4))


def test_a_backend_that_writes_into_its_input_breaks_the_input_unchanged_contract():
    base = get_backend("softmax_xent", "torch")
    fwd, _ = base.resolve()

    def impl(logits, targets, **kw):  # noqa: ANN001, ANN003, ANN202
        out = fwd(logits=logits, targets=targets, **kw)
        with torch.no_grad():
            logits[1, 1] += 1
        return out
    backend = replace(base, name="writes", impl=impl, _resolved=None)
    oracle.clear_cache()
    c = cell.run_cell(XENT, backend, XENT.cases("smoke", "cpu")[0], "float32", "cpu", 0, repeats=1)
    unchanged = next(x for x in c.contracts if x.name == "input-unchanged")
    assert not unchanged.ok and "logits" in unchanged.detail
