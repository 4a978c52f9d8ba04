"""Ahead-of-time compile targets of the fused_linear_xent kernels (the GPU's constexpr combos).

Compiled for sm_90 in CI without a GPU. Block sizes and launch options are those of ``wrapper.GPU``;
unit strides are constexpr 1 and sizes/pointers 16-aligned, as the JIT specializes them for the
contiguous production shapes (N = 8192, H = 4096, V = 128256).
"""

from __future__ import annotations

import torch

from harness.tools.triton_aot import as_descriptors

from . import kernels as K
from .wrapper import GPU, GPU_F16, GPU_FP32, Gemm

_PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
_DATA = {"h_ptr", "w_ptr", "b_ptr", "dz_ptr", "out_ptr", "dst_ptr"}
_FLOATS = {"cap", "eps", "lam", "inv_v", "norm"}
# integer arguments a production launch passes as multiples of 16 (sizes, row strides)
_ALIGNED = {"T", "V", "H", "n", "s_ht", "s_wv", "s_zt", "s_dzt", "s_acc", "s_out", "s_dbp"}


def _target(name: str, fn, dtype: torch.dtype, constexprs: dict, ones: tuple[str, ...] = (),
            gemm: Gemm | None = None, warps: int = 4) -> dict:
    consts = dict(constexprs)
    if gemm is not None:
        consts.update(BM=gemm.BM, BN=gemm.BN, BK=gemm.BK, GROUP=gemm.GROUP)
    consts.update({a: 1 for a in ones})
    sig, aligned = {}, []
    for a in fn.arg_names:
        if a in consts:
            sig[a] = "constexpr"
        elif a.endswith("_ptr"):
            # the bf16 configuration keeps the fast mode's logits as float16 offsets (kernels module doc)
            sig[a] = _PTR[dtype] if a in _DATA else "*i64" if a == "y_ptr" else \
                "*fp16" if a == "z_ptr" and _cfg(dtype).z16 else "*fp32"
            aligned.append(a)
        elif a in _FLOATS:
            sig[a] = "fp32"
        else:
            sig[a] = "i32"
            if a in _ALIGNED:
                aligned.append(a)
    opts = {"num_warps": gemm.warps if gemm else warps, "num_stages": gemm.stages if gemm else 3}
    return {"name": f"{name}-{str(dtype).replace('torch.', '')}", "kernel": fn, "signature": sig,
            "constexprs": consts, "options": opts, "aligned": tuple(aligned)}


def _descriptors(target: dict, dtype: torch.dtype, g: Gemm, blocks: dict[str, str] | None = None) -> dict:
    """The operands of a TMA launch are tensor descriptors; ``blocks``: {argument: block in terms of
    BM, BN, BK} (default: the logits' h [BM, BK] and W [BN, BK])."""
    ty = _PTR[dtype][1:]
    sizes = {"BM": g.BM, "BN": g.BN, "BK": g.BK}
    return as_descriptors(target, {arg: (ty, tuple(sizes[d] for d in block.split(",")))
                                   for arg, block in (blocks or {"h_ptr": "BM,BK", "w_ptr": "BN,BK"}).items()})


def _cfg(dtype: torch.dtype):
    return GPU_FP32 if dtype == torch.float32 else GPU_F16 if dtype == torch.float16 else GPU


def _coef(rows: bool, scaled: bool, glse: bool) -> dict:
    return {"G_ROWS": rows, "SCALED": scaled, "HAS_GLSE": glse}


def aot_targets() -> list[dict]:
    """Every kernel in bf16 with the flags of both gradient paths; fp32 and fp16 on the GEMMs whose
    operand layouts differ (float32 dots with ieee precision; float16 logit offsets)."""
    bf, f32, f16 = torch.bfloat16, torch.float32, torch.float16
    out = []
    for dt in (bf, f32, f16):
        out.append(_target("logits-z", K._logits_kernel, dt,
                           dict(HAS_BIAS=True, SOFTCAP=dt == bf, STORE_Z=True, EVEN_K=True, PREC="ieee",
                                KS=_cfg(dt).logits.ksplit, TMA=False),
                           ("s_hk", "s_wk", "s_b", "s_y"), _cfg(dt).logits))
    out.append(_target("logits-stats", K._logits_kernel, bf,
                       dict(HAS_BIAS=False, SOFTCAP=False, STORE_Z=False, EVEN_K=False, PREC="ieee",
                            KS=GPU.logits.ksplit, TMA=False),
                       ("s_hk", "s_wk", "s_y"), GPU.logits))
    # the TMA path (16-bit, rows contiguous on a Hopper GPU): h and W as tensor descriptors
    for dt in (bf, f16):
        lg = _cfg(dt).logits
        t = _target("logits-z-tma", K._logits_kernel, dt,
                    dict(HAS_BIAS=True, SOFTCAP=False, STORE_Z=True, EVEN_K=True, PREC="ieee", KS=lg.ksplit,
                         TMA=True), ("s_hk", "s_wk", "s_b", "s_y"), lg)
        out.append(_descriptors(t, dt, lg))
    out.append(_target("row-stats", K._row_stats_kernel, f32, dict(BR=16, BT=64), ("s_y",)))
    for norm in (False, True):
        out.append(_target(f"loss-norm{int(norm)}", K._loss_kernel, f32,
                           dict(MEAN=True, HAS_NORM=norm, BLOCK=1024), ("s_y",)))
    dz_flags = dict(SOFTCAP=True, HAS_BIAS=True, BR=GPU.rows, BV=GPU.vblock, ZBN=GPU.logits.BN, RB=GPU.rblocks)
    out.append(_target("dz-chunk-fold", K._dz_chunk_kernel, bf, {**dz_flags, **_coef(False, False, False)},
                       ("s_y",), warps=GPU.dz_warps))
    out.append(_target("dz-chunk-rows", K._dz_chunk_kernel, bf, {**dz_flags, **_coef(True, True, True)},
                       ("s_y", "s_g", "s_gl"), warps=GPU.dz_warps))
    out.append(_target("dz-chunk-fold", K._dz_chunk_kernel, f32, {**dz_flags, **_coef(False, False, False)},
                       ("s_y",), warps=GPU_FP32.dz_warps))
    for dt, coef in ((bf, _coef(False, False, False)), (bf, _coef(True, True, True)),
                     (f32, _coef(False, True, True))):
        out.append(_target(f"dz-gemm-rows{int(coef['G_ROWS'])}", K._dz_gemm_kernel, dt,
                           dict(HAS_BIAS=True, SOFTCAP=True, EVEN_K=True, PREC="ieee", TMA=False, **coef),
                           ("s_hk", "s_wk", "s_b", "s_y"), _cfg(dt).dzg))
    for dt, mode, fold in ((bf, 0, False), (bf, 1, False), (bf, 2, True), (f16, 1, False), (f32, 1, False)):
        out.append(_target(f"dw-mode{mode}", K._dw_kernel, dt,
                           dict(MODE=mode, APPLY_G=fold, EVEN_K=True, PREC="ieee", TMA=False), ("s_hk",),
                           _cfg(dt).ldw if mode == 2 else _cfg(dt).dw))
    # running sum (token chunks), lean slab, held logits over all tokens
    for name, mode, gm in (("dw-tma-mode1", 1, GPU.dw), ("dw-tma-mode2", 2, GPU.ldw), ("dw-tma-held", 2, GPU.hdw)):
        t = _target(name, K._dw_kernel, bf,
                    dict(MODE=mode, APPLY_G=mode == 2, EVEN_K=True, PREC="ieee", TMA=True), ("s_hk",), gm)
        out.append(_descriptors(t, bf, gm, {"dz_ptr": "BK,BM", "h_ptr": "BK,BN"}))
    lz = _target("dz-gemm-tma", K._dz_gemm_kernel, bf, dict(HAS_BIAS=True, SOFTCAP=True, EVEN_K=True, PREC="ieee",
                                                           TMA=True, **_coef(False, False, False)),
                 ("s_hk", "s_wk", "s_b", "s_y"), GPU.dzg)
    out.append(_descriptors(lz, bf, GPU.dzg))
    # a one-token chunk (T specialized to 1) takes the small dweight tile: its shared memory differs
    out.append(_target("dw-mode0-T1", K._dw_kernel, bf,
                       dict(MODE=0, APPLY_G=False, EVEN_K=False, PREC="ieee", TMA=False), ("s_hk", "T"),
                       GPU.dw_small))
    # fast mode (dh tile) and lean mode (ldh tile)
    for dt, mode, fold, fast in ((bf, 0, True, True), (bf, 2, True, True), (bf, 1, False, False),
                                 (bf, 3, True, False), (f16, 0, True, True), (f32, 0, True, True)):
        out.append(_target(f"dh-mode{mode}", K._dh_kernel, dt,
                           dict(MODE=mode, APPLY_G=fold, EVEN_K=True, PREC="ieee", TMA=False), ("s_wk",),
                           _cfg(dt).dh if fast else _cfg(dt).ldh))
    for mode, gm in ((0, GPU.dh), (3, GPU.ldh)):
        t = _target(f"dh-tma-mode{mode}", K._dh_kernel, bf,
                    dict(MODE=mode, APPLY_G=True, EVEN_K=True, PREC="ieee", TMA=True), ("s_wk",), gm)
        out.append(_descriptors(t, bf, gm, {"dz_ptr": "BM,BK", "w_ptr": "BK,BN"}))
    for acc in (False, True):
        out.append(_target(f"colsum-acc{int(acc)}", K._colsum_kernel, f32, dict(ACCUM=acc, BR=8, BV=256)))
    for dt in (bf, f32):
        out.append(_target("cast", K._cast_kernel, dt, dict(APPLY_G=True, BLOCK=4096), warps=8))
    return out
