"""Ahead-of-time compile targets of the mhc_pre kernels: the constexpr combos the GPU launches use.

The GEMM-like kernels at n = 4 (MP = 32, the production shape) in each x dtype (their code paths
differ: bf16 x is one bf16 part, fp16 two, fp32 three), the others at bf16 and fp32; plus the extremes
n = 8 (MP = 128, NP = 8) and n = 1 (NP = 1), and gamma absent. Block sizes come from the wrapper's GPU
configuration; unit strides and 16-aligned arguments are specialized as the JIT does for contiguous
tensors at production sizes.
"""

from __future__ import annotations

from harness.tools.triton_aot import as_descriptors

from . import kernels as K
from .wrapper import GPU_CONFIG as C
from .wrapper import gemm_launch, nd_launch

_PTR = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}
_PARTS = {"bf16": 1, "fp16": 2, "fp32": 3}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# pointers that carry x's dtype (h_in and its gradient share it); the others are bf16 parts or float32
_DATA = {"x_ptr", "hin_ptr", "gin_ptr", "dx_ptr"}
# bf16 parts of phi * gamma and of dh_mix
_PARTS_PTRS = {"w_ptr", "dhmix_ptr"}
_FLOATS = {"norm_eps", "hc_eps", "post_mult"}
_UNIT = ("sxd", "sgd", "spk", "srq", "sphj")
# strides that are multiples of 16 elements at production sizes (D = 4096, n = 4)
_ALIGNED = {"sxb", "sxs", "sxn", "sgb", "sgs", "sphm", "D", "nD"}


def _signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = _PTR[dtype] if name in _DATA else "*bf16" if name in _PARTS_PTRS else "*fp32"
        else:
            sig[name] = "fp32" if name in _FLOATS else "i32"
    return sig


def _target(name: str, fn, dtype: str, constexprs: dict, warps: int, stages: int | None = None) -> dict:
    # contiguous tensors: the JIT specializes unit strides as constexpr 1 (this is what vectorizes)
    constexprs = {a: 1 for a in _UNIT if a in fn.arg_names} | constexprs
    opts = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    sig = _signature(fn, dtype, constexprs)
    aligned = [a for a in fn.arg_names if a not in constexprs and (a.endswith("_ptr") or a in _ALIGNED)]
    return {"name": name, "kernel": fn, "signature": sig, "constexprs": constexprs, "options": opts,
            "aligned": aligned}


def _block_d(D: int, NP: int, bt: int, elems: int) -> int:
    # mirrors wrapper: min(next_pow2(D), max(16, elems // (bt * NP)))
    return min(1 << (D - 1).bit_length(), max(16, elems // (bt * NP)))


def _tma_nd(target: dict, dtype: str) -> dict:
    """The dx/dphi kernel's TMA launch: x as a [T, n, D] descriptor of [BLOCK_T, 1, BLOCK_ND] blocks,
    g_in as [T, D] of [BLOCK_T, BLOCK_ND] (wrapper._nd_descriptors)."""
    bt, bnd, ty = C["BLOCK_T"], C["BLOCK_ND"], _PTR[dtype][1:]
    return as_descriptors(target, {"x_ptr": (ty, (bt, 1, bnd)), "gin_ptr": (ty, (bt, bnd))})


def aot_targets() -> list[dict]:
    out = []
    # fp32 at n = 8 stages the largest tiles (the shared-memory limit)
    for dt, n in (("bf16", 4), ("fp16", 4), ("fp32", 4), ("bf16", 8), ("fp32", 8)):
        M = n * n + 2 * n
        MP = max(16, 1 << (M - 1).bit_length())
        tag = f"{dt}-n{n}"
        warps, nst, bk = gemm_launch(C, MP, _BYTES[dt])
        out.append(_target(f"fwd_gemm-{tag}", K._fwd_gemm_kernel, dt,
                           {"X_PARTS": _PARTS[dt], "MP": MP, "BLOCK_T": C["gemm_t"], "BLOCK_K": bk,
                            "EMU": False}, warps, nst))
        nd = {"X_PARTS": _PARTS[dt], "MM_ORDER": 2 if dt == "fp32" else 1, "MP": MP,
              "BLOCK_T": C["BLOCK_T"], "BLOCK_ND": C["BLOCK_ND"], "EMU": False}
        out.append(_target(f"bwd_nd-{tag}", K._bwd_nd_kernel, dt, nd | {"TMA": False},
                           *nd_launch(C, MP, _BYTES[dt])))
        out.append(_tma_nd(_target(f"bwd_nd-tma-{tag}", K._bwd_nd_kernel, dt,
                                   nd | {"TMA": True}, *nd_launch(C, MP, _BYTES[dt], True)), dt))
    for dt, n in (("bf16", 4), ("fp32", 4), ("bf16", 8), ("bf16", 1)):
        M, NP = n * n + 2 * n, 1 << (n - 1).bit_length()
        MP = max(16, 1 << (M - 1).bit_length())
        tag = f"{dt}-n{n}"
        out.append(_target(f"fwd_mix-{tag}", K._fwd_mix_kernel, dt,
                           {"MP": MP, "NP": NP, "BLOCK_T": C["mix_t"],
                            "BLOCK_D": _block_d(4096, NP, C["mix_t"], C["mix_elems"])}, C["mix_warps"]))
        out.append(_target(f"bwd_token-{tag}", K._bwd_token_kernel, dt,
                           {"MP": MP, "NP": NP, "BLOCK_T": C["tok_t"],
                            "BLOCK_D": _block_d(4096, NP, C["tok_t"], C["tok_elems"])}, C["tok_warps"]))
    for has_g in (True, False):
        g = "" if has_g else "-nogamma"
        out.append(_target(f"fwd_wparts-n4{g}", K._fwd_wparts_kernel, "fp32",
                           {"HAS_GAMMA": has_g, "MP": 32, "BLOCK": C["wparts_block"]}, 4))
        out.append(_target(f"bwd_reduce-n4{g}", K._bwd_reduce_kernel, "fp32",
                           {"HAS_GAMMA": has_g, "MP": 32, "BLOCK_ND": C["red_nd"], "BLOCK_R": C["red_r"]},
                           C["red_warps"]))
    return out
