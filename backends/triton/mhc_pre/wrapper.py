"""Launch helpers, the autograd Function, the user-facing ``mhc_pre_triton`` and the harness's (forward, backward)
pair (docs/specs/mhc_pre.md)."""

from __future__ import annotations

import os

import torch

from . import kernels as K

Tensor = torch.Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Block sizes and launch shapes. Under the interpreter they are small so that CPU-sized cases span
# many blocks (that is what exposes block-accumulation bugs); the adapter declares BLOCK_ND/BLOCK_T.
CPU_CONFIG = {
    "gemm_t": 16, "gemm_k": 64, "gemm_programs": 4, "gemm_warps": 4, "gemm_stages": 1,
    "mix_t": 16, "mix_elems": 4096, "mix_warps": 4,
    "tok_t": 16, "tok_elems": 4096, "tok_warps": 4,
    "BLOCK_T": 16, "BLOCK_ND": 64, "nd_programs": 8, "nd_programs_tma": 8, "nd_warps": 4, "nd_stages": 1,
    "red_nd": 64, "red_r": 16, "red_warps": 4, "wparts_block": 64,
}
# chosen on an H200 (T = 16384, n = 4, D = 4096, bf16) among the variants of scratch tuning runs
GPU_CONFIG = {
    "gemm_t": 64, "gemm_k": 128, "gemm_programs": 2, "gemm_warps": 4, "gemm_stages": 3,
    "mix_t": 8, "mix_elems": 8192, "mix_warps": 4,
    "tok_t": 16, "tok_elems": 8192, "tok_warps": 8,
    "BLOCK_T": 32, "BLOCK_ND": 128, "nd_programs": 16, "nd_programs_tma": 20, "nd_warps": 4, "nd_stages": 3,
    "red_nd": 64, "red_r": 256, "red_warps": 8, "wparts_block": 128,
}
# The dx/dphi kernel's tiles, retimed on an H100 (bf16, T=16384, n=4, .scratch/mhc_tune.py on branch
# mhc-nd-tiles, all in one run): 128-feature blocks with 4 warps, 3 stages and 16 programs per SM give a
# backward of 1.48 ms at D=7168 (64-feature blocks, 4 per SM: 1.70; 16 per SM: 1.56) and 0.870 at D=4096
# (0.872); 8 warps 1.84-2.09 and 1.05-1.13; 2 stages 1.58-1.63; 32-feature blocks 4.03. For n >= 5 (M padded
# to 64 or 128) the kernel takes twice the warps: at 4 its accumulator and weight parts spill (1.3-2.1 KB
# on sm_90a at n = 8), at 8 nothing does.
# Retimed on an H100 with the TMA path of the dx/dphi kernel (.scratch/nd_tma_ab.py and fwd_tma_ab.py on
# branch mhc-nd-tma; each line one run, the baseline in the same run):
#   - forward GEMM: 128-wide K tiles, 3 stages, 2 programs per SM: forward 451 vs 460 us at D=4096 and 757
#     vs 776 at D=7168 (64-wide tiles, 4 stages, 4 per SM); 4 stages 476; 8 warps 581; 128-token tiles
#     483-498; 256-wide K tiles 589;
#   - mix: 8-token blocks: 445 vs 448 us (16) and 751 vs 755; 32-token blocks 460;
#   - dx/dphi with TMA: BLOCK_T 64 887-918 us vs 802 (D=4096), 16: 969; BLOCK_ND 64: 971, 256 (8 warps):
#     1118; 2 stages 925, 4: 804; 24 programs per SM 800 vs 805 (but 876 vs 862 on the pointer path,
#     hence a count per path). Per kernel (torch.profiler, .scratch/red_var.py), dx/dphi + reduce at
#     12/16/20/24 programs per SM: 554+17, 540+19, 528+24, 531+27 us; reduce over 64-feature blocks 24.7
#     vs 26.9 us (128), 32-feature (2 warps) 50.9;
#   - token kernel (8, 32 tokens; 4 warps; 4096 or 16384 elements) and reduce kernel (32 or 64 features;
#     4 warps): none beyond the noise (+-5 us).
CONFIG = dict(CPU_CONFIG if INTERPRET else GPU_CONFIG)

_X_PARTS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


def stages(wanted: int, per_stage: int) -> int:
    """Pipeline depth that keeps the staged tiles within ~180 KB of the 227 KB of shared memory."""
    return max(1, min(wanted, 180_000 // per_stage))


def gemm_launch(cfg: dict, MP: int, itemsize: int) -> tuple[int, int, int]:
    """(num_warps, num_stages, BLOCK_K) of the forward GEMM: twice the warps for the [BLOCK_T, 128]
    accumulator of n >= 7 (it spills at 4). Where the wanted stages of the K tile would overflow shared
    memory (n >= 5 pads M to 64 or 128), the tile is halved and one more stage wanted (64 x 4 is what
    those shapes ran with before the 128-wide tile); fewer stages where even that would overflow it."""
    warps, bk, want = cfg["gemm_warps"] * (2 if MP >= 128 else 1), cfg["gemm_k"], cfg["gemm_stages"]
    per_k = cfg["gemm_t"] * itemsize + 3 * MP * 2
    while bk > 64 and stages(want, per_k * bk) < want:
        bk, want = bk // 2, want + 1
    return warps, stages(want, per_k * bk), bk


def nd_launch(cfg: dict, MP: int, itemsize: int, tma: bool = False) -> tuple[int, int]:
    """(num_warps, num_stages) of the dx/dphi kernel: twice the warps where M pads past 32. Its TMA path
    stages g_in's tile too."""
    warps = cfg["nd_warps"] * (2 if MP > 32 else 1)
    tile = cfg["BLOCK_ND"] * itemsize * cfg["BLOCK_T"]
    return warps, stages(cfg["nd_stages"], 3 * MP * 2 * cfg["BLOCK_T"] + tile * (2 if tma else 1))


# Host-side integer helpers in plain Python: triton.cdiv and next_power_of_2 are constexpr functions
# whose calls cost microseconds each on the host, and a forward + backward makes about twenty.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _p2(v: int) -> int:
    return 1 << (max(1, v) - 1).bit_length()


def _programs(device: torch.device, per_sm: int) -> int:
    """Programs to aim for: a few per SM on a GPU (CONFIG's count itself under the interpreter)."""
    if device.type != "cuda":
        return per_sm
    return per_sm * torch.cuda.get_device_properties(device).multi_processor_count


def dims(x: Tensor, phi: Tensor) -> tuple[int, int, int, int, int, int]:
    if x.dim() != 4:
        raise ValueError(f"mhc_pre_triton: x must be [B, S, n, D], got shape {tuple(x.shape)}")
    B, S, n, D = x.shape
    M = n * n + 2 * n
    if tuple(phi.shape) != (M, n * D):
        raise ValueError(f"mhc_pre_triton: phi must be [n*n+2n, n*D] = [{M}, {n * D}], "
                         f"got {tuple(phi.shape)}")
    if x.dtype not in _X_PARTS:
        raise ValueError(f"mhc_pre_triton: x.dtype {x.dtype} is not float32, bfloat16 or float16")
    return B, S, n, D, M, n * D


def padded_rows(M: int) -> int:
    """Rows of h_mix and of the weight parts: M padded to a power of two (at least 16), zeros past M."""
    return max(16, _p2(M))


def weight_parts(phi: Tensor, gamma: Tensor | None, M: int, MP: int) -> Tensor:
    """phi * gamma as three bf16 parts [3, MP, nD] whose sum is exact (rows past M zero): what the forward's
    GEMM and the backward's dx read."""
    nD = phi.shape[1]
    wparts = torch.empty((3, MP, nD), dtype=torch.bfloat16, device=phi.device)
    wb = CONFIG["wparts_block"]
    K._fwd_wparts_kernel[(_cdiv(nD, wb),)](
        phi, gamma if gamma is not None else phi, wparts, nD, M, *phi.stride(),
        HAS_GAMMA=gamma is not None, MP=MP, BLOCK=wb)
    return wparts


def forward_outputs(x: Tensor, MP: int) -> tuple[Tensor, ...]:
    """The forward's outputs for x [B, S, n, D]: h_in [B, S, D] (x's dtype), h_post [B, S, n], h_res [B, S, n, n],
    and what the backward reads: h_mix [T, MP], inv_rms [T], h_pre [T, n] (float32, dense)."""
    B, S, n, D = x.shape
    T, f32 = B * S, dict(dtype=torch.float32, device=x.device)
    return (torch.empty((B, S, D), dtype=x.dtype, device=x.device), torch.empty((B, S, n), **f32),
            torch.empty((B, S, n, n), **f32), torch.empty((T, MP), **f32), torch.empty((T,), **f32),
            torch.empty((T, n), **f32))


def mhc_pre_forward(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None,
                    norm_eps: float, hc_eps: float, post_mult: float) -> tuple[Tensor, ...]:
    """h_in, h_post, h_res, and for the backward: h_mix [T, MP], inv_rms [T], h_pre [T, n] and the bf16
    parts of phi * gamma [3, MP, nD]."""
    B, S, n, D, M, nD = dims(x, phi)
    T, MP, NP = B * S, padded_rows(M), _p2(n)
    cfg, dev = CONFIG, x.device
    f32 = dict(dtype=torch.float32, device=dev)
    wparts = weight_parts(phi, gamma, M, MP)
    bt = cfg["gemm_t"]
    warps, nst, bk = gemm_launch(cfg, MP, x.element_size())
    # K tiles: BLOCK_K features of one stream; split-K over them fills the GPU even at small T
    ntb, nk = _cdiv(T, bt), n * _cdiv(D, bk)
    ksplit = max(1, min(nk, _cdiv(_programs(dev, cfg["gemm_programs"]), ntb)))
    kchunk = _cdiv(nk, ksplit)
    ksplit = _cdiv(nk, kchunk)
    part = torch.empty((ksplit, T, MP), **f32)
    ssq = torch.empty((ksplit, T), **f32)
    K._fwd_gemm_kernel[(ksplit, ntb)](
        x, wparts, part, ssq, T, S, n, D, nD, kchunk, *x.stride(),
        X_PARTS=_X_PARTS[x.dtype], MP=MP, BLOCK_T=bt, BLOCK_K=bk,
        EMU=INTERPRET, num_warps=warps, num_stages=nst)
    h_in, h_post, h_res, h_mix, inv, h_pre = forward_outputs(x, MP)
    mt = cfg["mix_t"]
    K._fwd_mix_kernel[(_cdiv(T, mt),)](
        x, part, ssq, alpha, bias, h_in, h_post, h_res, h_mix, inv, h_pre,
        T, S, n, D, nD, M, ksplit, norm_eps, hc_eps, post_mult, *x.stride(),
        MP=MP, NP=NP, BLOCK_T=mt, BLOCK_D=min(_p2(D), max(16, cfg["mix_elems"] // (mt * NP))),
        num_warps=cfg["mix_warps"])
    return h_in, h_post, h_res, h_mix, inv, h_pre, wparts


def _tokens_2d(t: Tensor, B: int, S: int) -> int | None:
    """The stride of token b*S + s in a [B, S, ...] tensor if one stride walks all tokens, else None."""
    if S == 1:
        return t.stride(0)
    if B == 1:
        return t.stride(1)
    return t.stride(1) if t.stride(0) == S * t.stride(1) else None


# the dx/dphi kernel reads x and g_in through TMA descriptors where it can (False: always pointers)
ND_TMA = True


def _nd_descriptors(x: Tensor, g_in: Tensor, bt: int, bnd: int) -> tuple[object, object] | None:
    """x as [T, n, D] and g_in as [T, D] TMA tensor descriptors of [BLOCK_T, (1,) BLOCK_ND] tiles where the
    copy engine can address them: a Hopper GPU, features contiguous, one stride over the tokens, 16-byte
    aligned strides and bases. None where it cannot: the kernel then loads through pointers."""
    if not ND_TMA or INTERPRET or x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] < 9:
        return None
    B, S, n, D = x.shape
    sx, sg, es = _tokens_2d(x, B, S), _tokens_2d(g_in, B, S), x.element_size()
    if sx is None or sg is None or x.stride(3) != 1 or g_in.stride(2) != 1 or g_in.dtype != x.dtype:
        return None
    if min(sx, sg, x.stride(2)) <= 0:  # broadcast (stride-0) tokens or streams: pointers handle them
        return None
    if any((v * es) % 16 for v in (sx, x.stride(2), sg)) or x.data_ptr() % 16 or g_in.data_ptr() % 16:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor(x, [B * S, n, D], [sx, x.stride(2), 1], [bt, 1, bnd]),
            TensorDescriptor(g_in, [B * S, D], [sg, 1], [bt, bnd]))


def mhc_pre_backward(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None,
                     h_mix: Tensor, inv: Tensor, h_pre: Tensor, wparts: Tensor, g_in: Tensor, g_post: Tensor,
                     g_res: Tensor, post_mult: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """dx (x's dtype and shape, contiguous), dphi, dalpha, dbias, dgamma ([nD], or None)."""
    B, S, n, D, M, nD = dims(x, phi)
    T, MP, NP = B * S, padded_rows(M), _p2(n)
    cfg, dev = CONFIG, x.device
    f32 = dict(dtype=torch.float32, device=dev)
    tt = cfg["tok_t"]
    ntb = _cdiv(T, tt)
    dh_mix = torch.empty((3, T, MP), dtype=torch.bfloat16, device=dev)
    coef = torch.empty((T,), **f32)
    pcol = torch.empty((ntb, 2, MP), **f32)
    K._bwd_token_kernel[(ntb,)](
        x, g_in, g_post, g_res, h_mix, inv, alpha, bias, dh_mix, coef, pcol,
        T, S, n, D, nD, M, post_mult, *x.stride(), *g_in.stride(), *g_post.stride(), *g_res.stride(),
        MP=MP, NP=NP, BLOCK_T=tt, BLOCK_D=min(_p2(D), max(16, cfg["tok_elems"] // (tt * NP))),
        num_warps=cfg["tok_warps"])

    bt, bnd = cfg["BLOCK_T"], cfg["BLOCK_ND"]
    nblk = n * _cdiv(D, bnd)  # blocks of BLOCK_ND features within each stream
    desc = _nd_descriptors(x, g_in, bt, bnd)
    # token groups: enough (nD block, group) programs to fill the GPU; partials are [G, MP, nD]
    per_sm = cfg["nd_programs_tma" if desc else "nd_programs"]
    G = max(1, min(_cdiv(T, bt), _cdiv(_programs(dev, per_sm), nblk)))
    per_group = _cdiv(_cdiv(T, G), bt) * bt
    G = _cdiv(T, per_group)
    dx = torch.empty(x.shape, dtype=x.dtype, device=dev)
    pphi = torch.empty((G, MP, nD), **f32)
    # dx only needs the 16-bit precision of its own dtype: two fewer split terms than float32 needs
    warps, nst = nd_launch(cfg, MP, x.element_size(), desc is not None)
    xa, ga = desc if desc else (x, g_in)
    K._bwd_nd_kernel[(nblk, G)](
        xa, ga, wparts, dh_mix, coef, h_pre, dx, pphi,
        T, S, n, D, nD, per_group, *x.stride(), *g_in.stride(),
        X_PARTS=_X_PARTS[x.dtype], MM_ORDER=2 if x.dtype == torch.float32 else 1, MP=MP, BLOCK_T=bt,
        BLOCK_ND=bnd, EMU=INTERPRET, TMA=desc is not None,
        num_warps=warps, num_stages=nst)

    # zero-filled so that a result that is never written reads as zeros, not as stale memory
    dphi = torch.zeros((M, nD), **f32)
    dgamma = torch.zeros((nD,), **f32) if gamma is not None else None
    dalpha = torch.empty((3,), **f32)
    dbias = torch.empty((M,), **f32)
    rnd = cfg["red_nd"]
    g = gamma if gamma is not None else phi
    K._bwd_reduce_kernel[(_cdiv(nD, rnd) + 1,)](
        pphi, pcol, phi, g, dphi, dgamma if dgamma is not None else dphi, dalpha, dbias,
        n, nD, M, G, ntb, *phi.stride(), HAS_GAMMA=gamma is not None, MP=MP, BLOCK_ND=rnd,
        BLOCK_R=cfg["red_r"], num_warps=cfg["red_warps"])
    return dx, dphi, dalpha, dbias, dgamma


def operands(phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """alpha, bias, gamma as the kernels index them (dense float32); a clear error otherwise."""
    for name, t in (("phi", phi), ("alpha", alpha), ("bias", bias), ("gamma", gamma)):
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f"mhc_pre_triton: {name} must be float32, got {t.dtype}")
    # the kernels index these densely; x and the upstream gradients may have any strides
    return alpha.contiguous(), bias.contiguous(), gamma.contiguous() if gamma is not None else None


# The harness's pair of callables (forward -> (outputs, saved); backward(saved, grads) -> gradients), as
# the golden backend registers them, and what the autograd Function below wraps for mhc_pre_triton. The
# harness calls the pair without autograd's engine between the bench's timer and the kernels: through
# autograd, a backward at T=16384, n=4, D=4096 cost 0.76-1.05 ms of CPU per call on one H100 machine
# (0.24-0.57 ms called directly), more than its 0.79 ms of kernels: the bench timed it at 1.09 ms there
# (reports/bench-mhc_pre.md at 265c9ab).
def forward_saved(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
                  norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> tuple[dict, tuple]:
    alpha, bias, gamma = operands(phi, alpha, bias, gamma)
    h_in, h_post, h_res, h_mix, inv, h_pre, wparts = mhc_pre_forward(
        x, phi, alpha, bias, gamma, float(norm_eps), float(hc_eps), float(post_mult))
    saved = (x, phi, alpha, bias, gamma, h_mix, inv, h_pre, wparts, float(post_mult))
    return {"h_in": h_in, "h_post": h_post, "h_res": h_res}, saved


def backward_saved(saved: tuple, grads: dict[str, Tensor]) -> dict[str, Tensor | None]:
    *fwd, post_mult = saved
    dx, dphi, dalpha, dbias, dgamma = mhc_pre_backward(*fwd, grads["h_in"], grads["h_post"], grads["h_res"],
                                                       post_mult)
    return {"x": dx, "phi": dphi, "alpha": dalpha, "bias": dbias, "gamma": dgamma}


class MhcPreFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None,
                norm_eps: float, hc_eps: float, post_mult: float) -> tuple[Tensor, Tensor, Tensor]:
        outs, saved = forward_saved(x, phi, alpha, bias, gamma, norm_eps=norm_eps, hc_eps=hc_eps,
                                    post_mult=post_mult)
        ctx.save_for_backward(*saved[:-1])
        ctx.post_mult = saved[-1]
        return outs["h_in"], outs["h_post"], outs["h_res"]

    @staticmethod
    def backward(ctx, g_in: Tensor, g_post: Tensor, g_res: Tensor):
        g = backward_saved((*ctx.saved_tensors, ctx.post_mult), {"h_in": g_in, "h_post": g_post, "h_res": g_res})
        return g["x"], g["phi"], g["alpha"], g["bias"], g["gamma"], None, None, None


def mhc_pre_triton(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
                   norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> dict[str, Tensor]:
    """mHC pre-mix with Triton kernels: h_in [B,S,D] (x.dtype), h_post [B,S,n], h_res [B,S,n,n] (fp32)."""
    h_in, h_post, h_res = MhcPreFunction.apply(x, phi, alpha, bias, gamma, float(norm_eps), float(hc_eps),
                                               float(post_mult))
    return {"h_in": h_in, "h_post": h_post, "h_res": h_res}
