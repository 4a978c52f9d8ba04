"""Launch helpers, the autograd.Function and ``mhc_pre_tilelang`` (TileLang backend of mhc_pre).

Layout contract: x may have any strides; it is made contiguous (and 16-byte aligned, which TMA
needs) before the kernels run, and so are the upstream gradients. Gradients come back in the
dtype and shape of their inputs; dx is contiguous. Compiled kernels are cached per
(kernel, n, D, dtype, scalars that are baked in, target).
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import torch

from . import kernels as K

Tensor = torch.Tensor
EXECUTION_BACKEND = "tvm_ffi"
_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _tma(n: int, D: int, dtype: str) -> bool:
    # MHC_TL_TMA=0/1 overrides the rule of kernels.use_tma (to compare both pipelines on a GPU)
    env = os.environ.get("MHC_TL_TMA", "")
    return K.use_tma(n, D, dtype) if env == "" else env == "1"


def _keys(n: int, D: int, dtype: str, norm_eps: float, hc_eps: float, post_mult: float) -> dict[str, tuple]:
    tma = _tma(n, D, dtype)
    return {
        "prep": ("prep", n, D),
        "fwd": ("fwd", n, D, dtype, norm_eps, hc_eps, post_mult, tma),
        "bwd_tok": ("bwd_tok", n, D, dtype, hc_eps, post_mult, tma),
        "bwd_col": ("bwd_col", n, D, dtype, tma),
        "fin_phi": ("fin_phi", n, D),
        "fin_small": ("fin_small", n),
    }


def compile_kernels(configs: list[tuple[int, int, str]], *, norm_eps: float = 1e-6, hc_eps: float = 1e-6,
                    post_mult: float = 2.0, target: Any = None, workers: int | None = None) -> dict[tuple, Any]:
    """Compile every kernel of the given (n, D, dtype) configs (in parallel), cache and return them.

    ``target=None`` compiles for the GPU of this machine; a dict such as
    ``{"kind": "cuda", "arch": "sm_90a"}`` compiles without a GPU (CI).
    """
    import tilelang

    tkey = repr(sorted(target.items())) if isinstance(target, dict) else repr(target)
    wanted: dict[tuple, Any] = {}
    for n, D, dtype in configs:
        funcs = None
        for name, key in _keys(n, D, dtype, norm_eps, hc_eps, post_mult).items():
            full = key + (tkey,)
            if full in _CACHE or full in wanted:
                continue
            if funcs is None:
                funcs = K.kernel_funcs(n, D, dtype, norm_eps, hc_eps, post_mult, _tma(n, D, dtype))
            wanted[full] = funcs[name]
    if wanted:
        keys = list(wanted)
        if len(keys) == 1:
            built = [tilelang.compile(wanted[keys[0]], execution_backend=EXECUTION_BACKEND, target=target)]
        else:
            # a failing kernel comes back as None (its error is logged); the others are kept
            built = tilelang.par_compile([wanted[k] for k in keys], execution_backend=EXECUTION_BACKEND,
                                         target=target, num_workers=workers, ignore_error=True)
        with _LOCK:
            _CACHE.update((k, b) for k, b in zip(keys, built, strict=True) if b is not None)
        failed = [k[:-1] for k, b in zip(keys, built, strict=True) if b is None]
        if failed:
            raise RuntimeError(f"TileLang failed to compile {failed} (see the log above)")
    out = {}
    for n, D, dtype in configs:
        for key in _keys(n, D, dtype, norm_eps, hc_eps, post_mult).values():
            out[key] = _CACHE[key + (tkey,)]
    return out


def _kernels(n: int, D: int, dtype: str, norm_eps: float, hc_eps: float, post_mult: float) -> dict[str, Any]:
    keys = _keys(n, D, dtype, norm_eps, hc_eps, post_mult)
    tkey = repr(None)
    if any(k + (tkey,) not in _CACHE for k in keys.values()):
        compile_kernels([(n, D, dtype)], norm_eps=norm_eps, hc_eps=hc_eps, post_mult=post_mult)
    ks = {name: _CACHE[key + (tkey,)] for name, key in keys.items()}
    if os.environ.get("MHC_TL_SYNC", "") == "1":
        ks = {name: _synced(name, k) for name, k in ks.items()}
    return ks


def _synced(name: str, kernel: Any) -> Any:
    """Debugging (MHC_TL_SYNC=1): synchronize after each launch so a fault names its kernel."""
    def run(*args: Any) -> None:
        kernel(*args)
        try:
            torch.cuda.synchronize()
        except Exception as e:
            raise RuntimeError(f"mhc_pre tilelang kernel {name!r} faulted: {e}") from e
    return run


def _dense(t: Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Tensor:
    """Contiguous, 16-byte aligned (TMA descriptors need it), in ``dtype``, viewed as ``shape``."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    t = t.contiguous()
    if t.data_ptr() % 16:
        t = t.clone()
    return t.view(shape)


def _splits(T: int, D: int, p: K.Plan, device: torch.device) -> int:
    """Token splits of bwd_col: fill whole waves of one CTA per SM (its shared memory allows one)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ncol = math.ceil(D / p.BD)
    ntile = math.ceil(T / p.BT2)
    best, best_eff = 1, 0.0
    for s in range(1, min(ntile, 64) + 1):
        ctas = ncol * s
        eff = ctas / (math.ceil(ctas / sms) * sms)
        if ctas >= sms and eff >= 0.9:
            return s
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
    return best


class MhcPreFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None,
                norm_eps: float, hc_eps: float, post_mult: float):
        B, S, n, D = x.shape
        T, nD, M = B * S, n * D, n * n + 2 * n
        if x.dtype not in _DTYPES:
            raise TypeError(f"mhc_pre_tilelang: x must be float32, bfloat16 or float16, got {x.dtype}")
        dt = _DTYPES[x.dtype]
        p = K.plan(n, D, dt)
        dev = x.device
        f32 = dict(device=dev, dtype=torch.float32)
        X = _dense(x, (T, nD))
        phi32 = _dense(phi, (M, nD), torch.float32)
        alpha32 = _dense(alpha, (3,), torch.float32)
        bias32 = _dense(bias, (M,), torch.float32)
        gam = torch.ones(nD, **f32) if gamma is None else _dense(gamma, (nD,), torch.float32)
        h_in = torch.empty(T, D, device=dev, dtype=x.dtype)
        h_post = torch.empty(T, n, **f32)
        h_res = torch.empty(T, n * n, **f32)
        h_mix = torch.empty(T, p.Mp, **f32)
        inv_rms = torch.empty(T, **f32)
        h_pre = torch.empty(T, n, **f32)
        s_comp = torch.empty(T, n, **f32)  # 1 - sigmoid of h_pre's logit (the backward's s (1 - s))
        QT = torch.empty(3 * nD, p.MF, device=dev, dtype=torch.bfloat16)
        if T > 0:
            ks = _kernels(n, D, dt, norm_eps, hc_eps, post_mult)
            P = torch.empty(3 * p.Mp, nD, device=dev, dtype=torch.bfloat16)
            with torch.cuda.device(dev):
                ks["prep"](phi32, gam, P, QT)
                ks["fwd"](X, P, alpha32, bias32, h_in, h_post, h_res, h_mix, inv_rms, h_pre, s_comp)
        ctx.save_for_backward(X, phi32, alpha32, gam, QT, h_mix, inv_rms, h_pre, s_comp, h_post)
        ctx.meta = (B, S, n, D, dt, norm_eps, hc_eps, post_mult, gamma is not None,
                    phi.dtype, alpha.dtype, bias.dtype, None if gamma is None else gamma.dtype)
        return h_in.view(B, S, D), h_post.view(B, S, n), h_res.view(B, S, n, n)

    @staticmethod
    def backward(ctx, g_in: Tensor, g_post: Tensor, g_res: Tensor):
        X, phi32, alpha32, gam, QT, h_mix, inv_rms, h_pre, s_comp, h_post = ctx.saved_tensors
        B, S, n, D, dt, norm_eps, hc_eps, post_mult, has_gamma, phi_dt, alpha_dt, bias_dt, gamma_dt = ctx.meta
        T, nD, M = B * S, n * D, n * n + 2 * n
        p = K.plan(n, D, dt)
        dev = X.device
        f32 = dict(device=dev, dtype=torch.float32)
        dx = torch.empty(T, nD, device=dev, dtype=X.dtype)
        dphi = torch.zeros(M, nD, **f32)
        dgamma = torch.zeros(nD, **f32)
        dbias = torch.zeros(M, **f32)
        dalpha = torch.zeros(3, **f32)
        if T > 0:
            ks = _kernels(n, D, dt, norm_eps, hc_eps, post_mult)
            gi = _dense(g_in, (T, D), X.dtype)
            gp = _dense(g_post, (T, n), torch.float32)
            gr = _dense(g_res, (T, n * n), torch.float32)
            nb = math.ceil(T / p.BT1)
            dhm = torch.empty(T, p.MF, **f32)
            coef = torch.empty(T, **f32)
            part_bias = torch.empty(nb, p.MF, **f32)
            part_alpha = torch.empty(nb, p.MF, **f32)
            part = torch.empty(_splits(T, D, p, dev), p.MF, nD, **f32)
            with torch.cuda.device(dev):
                ks["bwd_tok"](X, gi, gp, gr, h_mix, inv_rms, h_pre, s_comp, h_post, alpha32, dhm, coef,
                              part_bias, part_alpha)
                ks["bwd_col"](X, gi, dhm, coef, h_pre, QT, gam, dx, part)
                ks["fin_phi"](part, phi32, gam, dphi, dgamma)
                ks["fin_small"](part_bias, part_alpha, dbias, dalpha)
        return (dx.view(B, S, n, D), dphi.to(phi_dt), dalpha.to(alpha_dt), dbias.to(bias_dt),
                dgamma.to(gamma_dt) if has_gamma else None, None, None, None)


def mhc_pre_tilelang(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
                     norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> dict[str, Tensor]:
    """mHC pre-mix on TileLang kernels: {"h_in": [B,S,D] x.dtype, "h_post": [B,S,n], "h_res": [B,S,n,n]}."""
    h_in, h_post, h_res = MhcPreFunction.apply(x, phi, alpha, bias, gamma, float(norm_eps), float(hc_eps),
                                               float(post_mult))
    return {"h_in": h_in, "h_post": h_post, "h_res": h_res}
