"""Fresh mutants for issue #24: bugs written to judge the hints (harness/measure/localize.py), not the zoo's.

Load as a plugin:

    harness run --kernel <op> --sizes sweep --backend mutant:<id> --device cpu \
        --plugin tests/diagnosis/fresh_mutants.py
    harness mutants --plugin tests/diagnosis/fresh_mutants.py --only <id>,...

Each mutant is one small source edit of an in-tree Triton backend that runs on CPU (interpreter blocks:
lazy_attention 16, fused_linear_xent chunk 16 / row tile 16 / vocab tile 128, mhc_pre token tile 16).
``TRUE_CAUSE`` gives each mutant's cause class (the vocabulary of issue #24's table) and the detail; the
``description`` of each mutant says the same in one sentence. The expectations are small CPU cases of
the sweep: one where the mutant fails, one where it still passes (or, for bugs visible on every case,
the components that still pass), so ``harness mutants --plugin ...`` can check them.

tests/diagnosis/run_fresh.sh runs every mutant's sweep; tests/diagnosis/fresh-mutants-before.md is the
table of the hints they got before the rule change.
"""

from __future__ import annotations

from harness import Case, Expectation, Mutant, register_mutant
from harness.model import registry
from harness.model.registry import discover

discover()  # the in-tree operators first (their cases modules register them)

# cause classes of issue #24
CLASSES = ("stride", "later-block-offsets", "accumulation-lost", "tail", "scale", "per-row-scale", "reduction",
           "option", "overflow", "never-written", "sign", "formula")

TRUE_CAUSE: dict[str, tuple[str, str]] = {
    "fresh-lazy-dtau-batch0": (
        "reduction",
        "the dtau reduction is told there are n_m per-query-block shares instead of B * n_m, so dtau sums "
        "batch 0's shares only: wrong exactly when B > 1",
    ),
    "fresh-lazy-dbias-mask-w": (
        "tail",
        "mask off by one at the end of the bias table in the ds path's dbias diagonal-chunk store (dist < W - 1 "
        "for dist < W): the partials of distance W - 1 stored inside the query loop are dropped, so dbias[:, W-1] "
        "is zero; only where L >= W and the chunk holding W - 1 completes inside the loop (L33-W16-H4, "
        "L33-W7-B2-H2-dOpad of the CPU sweep). Read as a reduction visible only with L >= W it would be "
        "'reduction'; the per-distance localization shows it as the end of the range",
    ),
    "fresh-lazy-dv-scaled": (
        "scale",
        "dv stored as dv * scale (the softmax scale, copied from dk's store): every element of dv off by the "
        "uniform factor 1/sqrt(Dh)",
    ),
    "fresh-xent-row-grad-ignored": (
        "per-row-scale",
        "with reduction='none' the per-token upstream gradient g_i is taken as 1: dZ row i (and dhidden row "
        "i) is off by the factor 1/g_i; dweight and dbias sum rows with the wrong weights",
    ),
    "fresh-mhc-dbias-tail-tile": (
        "tail",
        "the reduce kernel is given T // BLOCK_T token tiles of dbias/dalpha partials instead of "
        "cdiv(T, BLOCK_T): the last partial token tile is dropped (all of it when T < 16, so dbias and "
        "dalpha come out zero); right when T is a multiple of 16",
    ),
    "fresh-xent-dh-weight-stride": (
        "stride",
        "the dhidden GEMM addresses weight's hidden dimension with dZ's column stride (1) instead of "
        "weight.stride(1): wrong only for a non-contiguous (transposed) weight",
    ),
    "fresh-xent-smoothing-uniform-dropped": (
        "option",
        "the uniform label-smoothing term -coef * eps / V is missing from dZ: the gradients are wrong only "
        "with label_smoothing > 0 (the forward loss is right)",
    ),
}

# --- lazy_attention / triton (interpreter blocks of 16; dk/dv+ds tiles 16 queries x 32 keys) -------------

from harness.cases.lazy_attention import QKV_T  # noqa: E402
from harness.cases.lazy_attention import C as LC  # noqa: E402

LAZY_ALL = ("o", "dq", "dk", "dv", "dbias", "dtau")


def _but(all_: tuple[str, ...], *bad: str) -> tuple[str, ...]:
    return tuple(c for c in all_ if c not in bad)


# sweep cases (cases/lazy_attention.py _sweep_cpu)
L33_B2 = LC("L33-W7-B2-H2-dOpad", 2, 2, 33, 16, 7, ("non-contiguous-grad",), grad_layout="pad")
L33_H4 = LC("L33-W16-H4", 1, 4, 33, 16, 16, ("2BLOCK+1", "W=BLOCK"))
L17_W100 = LC("L17-W100-B3-qkvT", 3, 2, 17, 16, 100, ("BLOCK+1", "W>L", "non-contiguous"), layout=QKV_T)
L17_POS = LC("L17-W7-pos", 1, 2, 17, 16, 7, ("positive-tau",), tau="pos")

register_mutant(Mutant(
    id="fresh-lazy-dtau-batch0", operator="lazy_attention", backend="triton",
    seed="issue #24: per-head scalar over batches",
    description="dtau sums only batch 0's per-query-block shares (the reduce kernel gets n_m rows, not B * n_m)",
    edits=(("wrapper.py", "tau_part.shape[0], H, W, BLOCK_W=bw)", "tau_part.shape[0] // B, H, W, BLOCK_W=bw)"),),
    expect=(Expectation(L33_B2, "float32", fail=("dtau",), passing=_but(LAZY_ALL, "dtau")),
            Expectation(L33_H4, "float32", passing=LAZY_ALL)),
))

register_mutant(Mutant(
    id="fresh-lazy-dbias-mask-w", operator="lazy_attention", backend="triton", seed="issue #24: a mask off by one",
    description="dbias chunk store masked with dist < W - 1: distance W - 1 loses the partials stored inside the "
                "query loop (only where L >= W)",
    edits=(("kernels.py", "tl.store(part_row + dist, ca + s2, mask=(dist >= 0) & (dist < W))",
            "tl.store(part_row + dist, ca + s2, mask=(dist >= 0) & (dist < W - 1))"),),
    expect=(Expectation(L33_H4, "float32", fail=("dbias",), passing=_but(LAZY_ALL, "dbias")),
            Expectation(L17_W100, "float32", passing=LAZY_ALL)),
))

register_mutant(Mutant(
    id="fresh-lazy-dv-scaled", operator="lazy_attention", backend="triton", seed="issue #24: a uniform scale",
    description="dv stored multiplied by the softmax scale (copied from dk's store): uniformly 1/sqrt(Dh) too small",
    edits=(("kernels.py", "dv.to(DV.dtype.element_ty), mask=cols)",
            "(dv * scale).to(DV.dtype.element_ty), mask=cols)"),),
    expect=(Expectation(L17_POS, "float32", fail=("dv",), passing=_but(LAZY_ALL, "dv")),),
))

# --- fused_linear_xent / triton (interpreter: 16-token chunks and row tiles, 128-wide vocab tiles) -------

from harness.cases.fused_linear_xent import C as XC  # noqa: E402

XENT_ALL = ("loss", "dhidden", "dweight", "dbias")
_X = ("N32-H24-V129", 32, 24, 129)


def _x(suffix: str, tags: tuple[str, ...], **kw) -> Case:
    return XC(f"{_X[0]}-{suffix}", *_X[1:], tags, **kw)


X_NONE = _x("none", ("reduction",), ignored=0.2, reduction="none")
X_SUM = _x("sum", ("reduction",), ignored=0.2, reduction="sum")
X_STRIDED = _x("strided", ("non-contiguous",), ignored=0.2, layout_hidden="pad", layout_weight="perm:1,0")
X_LS = _x("ls", ("smoothing",), ignored=0.2, label_smoothing=0.1)
X_ZLOSS = _x("zloss", ("z-loss",), ignored=0.2, z_loss=1e-2)

register_mutant(Mutant(
    id="fresh-xent-row-grad-ignored", operator="fused_linear_xent", backend="triton",
    seed="issue #24: a per-row upstream gradient ignored",
    description="with reduction='none' the per-token upstream gradient is taken as 1 (g_i ignored) in dZ",
    edits=(("kernels.py", "g = tl.load(g_ptr + rows * s_g, mask=rmask, other=0.0).to(tl.float32)",
            "g = tl.where(rmask, 1.0, 0.0)"),),
    expect=(Expectation(X_NONE, "float32", fail=("dhidden", "dweight", "dbias"), passing=("loss",)),
            Expectation(X_SUM, "float32", passing=XENT_ALL)),
))

register_mutant(Mutant(
    id="fresh-xent-dh-weight-stride", operator="fused_linear_xent", backend="triton",
    seed="issue #24: one tensor addressed with another's stride",
    description="the dhidden GEMM walks weight's hidden dimension with dZ's column stride instead of weight.stride(1)",
    edits=(("wrapper.py", "dz.stride(0), W.stride(0), W.stride(1), _s0(acc), _s0(out)",
            "dz.stride(0), W.stride(0), dz.stride(1), _s0(acc), _s0(out)"),),
    expect=(Expectation(X_STRIDED, "float32", fail=("dhidden",), passing=("loss", "dweight", "dbias")),
            Expectation(X_SUM, "float32", passing=XENT_ALL)),
))

register_mutant(Mutant(
    id="fresh-xent-smoothing-uniform-dropped", operator="fused_linear_xent", backend="triton",
    seed="issue #24: label smoothing",
    description="dZ omits the uniform label-smoothing term -coef * eps / V (the forward loss keeps it)",
    edits=(("kernels.py", " - (coef * eps * inv_v)[:, None]", ""),),
    expect=(Expectation(X_LS, "float32", fail=("dhidden", "dweight", "dbias"), passing=("loss",)),
            Expectation(X_ZLOSS, "float32", passing=XENT_ALL)),
))

# --- mhc_pre / triton (interpreter: 16-token tiles of the token kernel) -----------------------------------

from harness.cases.mhc_pre import C as MC  # noqa: E402

MHC_OUTS = ("h_in", "h_post", "h_res")
MHC_DBIAS = ("dbias.pre", "dbias.post", "dbias.res")
MHC_DALPHA = ("dalpha.pre", "dalpha.post", "dalpha.res")
MHC_REST = MHC_OUTS + ("dx", "dphi.pre", "dphi.post", "dphi.res", "dgamma")
M_T127 = MC("T127-xT", 1, 127, 4, 32, ("non-contiguous", "odd-T"), layout="perm:0,2,1,3")
M_SAT = MC("saturating", 1, 16, 4, 64, ("saturating",), init="saturating")

register_mutant(Mutant(
    id="fresh-mhc-dbias-tail-tile", operator="mhc_pre", backend="triton",
    seed="issue #24: a bias gradient over token tiles",
    description="the dbias/dalpha reduction gets T // BLOCK_T token-tile partials instead of cdiv(T, BLOCK_T): "
                "the last partial token tile is dropped",
    edits=(("wrapper.py", "n, nD, M, G, ntb, *phi.stride()", "n, nD, M, G, T // tt, *phi.stride()"),),
    expect=(Expectation(M_T127, "float32", fail=MHC_DBIAS + MHC_DALPHA, passing=MHC_REST),
            Expectation(M_SAT, "float32", passing=MHC_REST + MHC_DBIAS + MHC_DALPHA)),
))

_MINE = {m.id for m in registry.mutants() if m.id.startswith("fresh-")}
assert _MINE == set(TRUE_CAUSE), (_MINE, set(TRUE_CAUSE))
assert all(c in CLASSES for c, _ in TRUE_CAUSE.values())
