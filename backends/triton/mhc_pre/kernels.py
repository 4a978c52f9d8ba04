"""Triton kernels of ``mhc_pre`` (docs/specs/mhc_pre.md): forward GEMM + epilogue, two-phase backward.

Exact float32 GEMMs on bf16 tensor cores: a float32 operand is split into three bf16 parts (hi + mid
+ lo hold all 24 significant bits; bf16 x is exact in one part, fp16 in two). Products of parts are
exact in float32, so the skinny GEMMs are as accurate as a float32 FMA loop at tensor-core speed (an
FMA loop would be compute bound here). Two details make that true on the GPU:
  - the MMA adds in float32 with truncation, which over a long K biases the sum toward zero; every
    long sum is therefore a chain of short MMA partials (one tile) added with ordinary rounding adds;
  - the weight parts are precomputed once (_fwd_wparts_kernel, _bwd_token_kernel) so that the hot
    loops feed them straight from memory to the dots, where the compiler pipelines the loads.
Under the interpreter (EMU) the parts are multiplied as float32 (its bf16 dot is wrong); same values.

The forward reads x twice (GEMM, then h_in once h_pre is known) and the backward too (token kernel,
then dx/dphi once dh_pre is known). One-launch variants that re-read x from L2 or keep it on chip were
all slower than these kernels in the same run (bf16, T=16384, n=4; branches keep the code and figures):
  - mhc-fused: (token block, D slice) items meet, then mix their slice: 0.434 vs 0.461 ms (H100, D=4096);
  - mhc-fwd-roles: GEMM producers and mix consumers; the consumers lag and the re-read misses L2, or,
    throttled, they convoy: 0.35-2.0 vs 0.35 ms (H200);
  - mhc-fwd-sliced: programs own feature slices, keep x in registers and meet per token block: x leaves
    DRAM once, but the per-block chain is serial: 2.6-3.5 vs 0.36 ms (H200);
  - mhc-fused-bwd: token and dx/dphi items by ticket in L2-sized chunks: the in-flight items exceed L2,
    the re-read misses (1.43 GB of DRAM reads): 1.0 vs 0.88 ms (H100);
  - mhc-fwd-gluon: Gluon, warp-specialized; teams of D/64 programs keep x in shared memory (TMA ring)
    across two global meetings per token block: x leaves DRAM once, but the per-block chain of
    release/poll/L2 round trips bounds it: 0.50 vs 0.46 ms (H100, D=4096), 1.28 vs 0.78 (D=7168);
  - mhc-fwd-chunked: one persistent cooperative launch over L2-sized token chunks (GEMM items, a global
    meeting, then each program mixes the slice its own GEMM item read, so the re-read hits L2: 628 MB of
    DRAM reads), but the short phases stream below the separate kernels: 0.57 vs 0.44 ms (H100, D=4096),
    1.09 vs 0.76 (D=7168);
  - mhc-fwd-sm: two programs per SM (by %smid), a ticketed GEMM streamer and a mixer of the same SM's
    queue, throttled to a lag: items long enough to stream keep too much x in flight and the re-read
    misses (1.07 GB of DRAM reads); short ones stall on the cross-SM chain of block completions: 0.39 vs
    0.35 ms at best (H200, D=4096), 0.72 vs 0.59 (D=7168).
The re-read distance in bytes is about the GPU's bandwidth times one item's duration, i.e. about L2's
size for items long enough to stream well. Keeping the next loads in flight across the meeting (TMA,
mbarriers, warp specialisation: mhc-fwd-gluon) is not enough while the meeting goes through global
memory; sharing the team's partials on chip needs thread-block clusters (in gluon from 3.9, not 3.6).

Forward:  _fwd_wparts_kernel  W = phi * gamma as three bf16 parts [3, MP, nD]
          _fwd_gemm_kernel    split-K partial h_mix = x @ W^T and sum of squares per token
          _fwd_mix_kernel     sums the partials, sigmoid/affine epilogue, h_in = sum_k h_pre_k x_k
Backward: _bwd_token_kernel   per-token scalars: dh_pre = <g_in, x_k>, dh_mix (as bf16 parts), the
                              dinv_rms coefficient, per-token-block partials of dbias and dalpha
          _bwd_nd_kernel      (stream block) x (token group): dx, and partials P = dh_mix^T @ x; on
                              Hopper, where x and g_in allow it, they come through TMA descriptors
                              (pipelined by the compiler): backward 0.80 vs 0.86 ms (H100, D=4096)
          _bwd_reduce_kernel  fixed-order sums of the partials (bitwise reproducible, no atomics):
                              dphi = gamma * P, dgamma = sum_m phi * P, dbias, dalpha
"""

import triton
import triton.language as tl


@triton.jit
def _parts(a, N: tl.constexpr):
    """bf16 parts of a tile whose sum is exactly ``a`` (N = 1 only for bf16 data)."""
    if N == 1:
        p0 = a.to(tl.bfloat16)
        p1 = p0
        p2 = p0
    elif N == 2:
        af = a.to(tl.float32)
        p0 = af.to(tl.bfloat16)
        p1 = (af - p0.to(tl.float32)).to(tl.bfloat16)
        p2 = p1
    else:
        af = a.to(tl.float32)
        p0 = af.to(tl.bfloat16)
        r = af - p0.to(tl.float32)
        p1 = r.to(tl.bfloat16)
        p2 = (r - p1.to(tl.float32)).to(tl.bfloat16)
    return p0, p1, p2


@triton.jit
def _dot_pp(a0, a1, a2, b0, b1, b2, acc, A_PARTS: tl.constexpr, ORDER: tl.constexpr, EMU: tl.constexpr):
    """acc + a @ b from bf16 parts: the terms a_i b_j with i < A_PARTS and i + j <= ORDER, smallest
    first (ORDER 2 keeps every product bit above 2^-24; ORDER 1 is enough for a 16-bit result)."""
    if EMU:
        a0 = a0.to(tl.float32)
        a1 = a1.to(tl.float32)
        a2 = a2.to(tl.float32)
        b0 = b0.to(tl.float32)
        b1 = b1.to(tl.float32)
        b2 = b2.to(tl.float32)
    if ORDER >= 2:
        if A_PARTS >= 3:
            acc = tl.dot(a2, b0, acc)
        if A_PARTS >= 2:
            acc = tl.dot(a1, b1, acc)
        acc = tl.dot(a0, b2, acc)
    if A_PARTS >= 2:
        acc = tl.dot(a1, b0, acc)
    acc = tl.dot(a0, b1, acc)
    acc = tl.dot(a0, b0, acc)
    return acc


@triton.jit
def _affine(hm, inv, alpha_ptr, bias_ptr, n, M, MP: tl.constexpr):
    """t = h_mix * inv_rms and z = alpha[section] * t + bias, for the MP (padded) columns."""
    m = tl.arange(0, MP)
    sec = (m >= n).to(tl.int32) + (m >= 2 * n).to(tl.int32)
    a = tl.load(alpha_ptr + sec)
    bia = tl.load(bias_ptr + m, mask=m < M, other=0.0)
    t = hm * inv[:, None]
    z = a[None, :] * t + bia[None, :]
    return t, z, a


@triton.jit
def _div(a, b):
    """IEEE a / b (``/`` compiles to div.full, 2 ulp); b may be a scalar."""
    return tl.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def _sigmoid(z):
    return tl.div_rn(tl.full(z.shape, 1.0, tl.float32), 1.0 + tl.exp(-z))


@triton.jit
def _fwd_wparts_kernel(phi_ptr, gamma_ptr, w_ptr, nD, M, sphm, sphj,
                       HAS_GAMMA: tl.constexpr, MP: tl.constexpr, BLOCK: tl.constexpr):
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    jm = j < nD
    m = tl.arange(0, MP)
    w = tl.load(phi_ptr + m[:, None] * sphm + j[None, :] * sphj, mask=(m < M)[:, None] & jm[None, :], other=0.0)
    if HAS_GAMMA:
        w = w * tl.load(gamma_ptr + j, mask=jm, other=0.0)[None, :]
    w0, w1, w2 = _parts(w, 3)
    off = (m * nD)[:, None] + j[None, :]
    tl.store(w_ptr + off, w0, mask=jm[None, :])
    tl.store(w_ptr + MP * nD + off, w1, mask=jm[None, :])
    tl.store(w_ptr + 2 * MP * nD + off, w2, mask=jm[None, :])


@triton.jit
def _fwd_gemm_kernel(x_ptr, w_ptr, part_ptr, ssq_ptr,
                     T, S, n, D, nD, KCHUNK,
                     sxb, sxs, sxn, sxd,
                     X_PARTS: tl.constexpr, MP: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, EMU: tl.constexpr):
    c = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    base = (rows // S).to(tl.int64) * sxb + (rows % S).to(tl.int64) * sxs
    m = tl.arange(0, MP)
    acc = tl.zeros([BLOCK_T, MP], dtype=tl.float32)
    # squares summed per lane, reduced once after the loop (no cross-thread reduction per step)
    sq = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    # K tiles are BLOCK_K features of one stream: contiguous addresses along d (vector loads)
    ndb = tl.cdiv(D, BLOCK_K)
    it_lo = c * KCHUNK
    it_hi = tl.minimum(it_lo + KCHUNK, n * ndb)
    for it in range(it_lo, it_hi):
        k = it // ndb
        d = (it - k * ndb) * BLOCK_K + tl.arange(0, BLOCK_K)
        dm = d < D
        j = k * D + d
        xt = tl.load(x_ptr + base[:, None] + (k.to(tl.int64) * sxn + d.to(tl.int64) * sxd)[None, :],
                     mask=rmask[:, None] & dm[None, :], other=0.0)
        xf = xt.to(tl.float32)
        sq += xf * xf
        woff = (m * nD)[None, :] + j[:, None]
        w0 = tl.load(w_ptr + woff, mask=dm[:, None], other=0.0)
        w1 = tl.load(w_ptr + MP * nD + woff, mask=dm[:, None], other=0.0)
        w2 = tl.load(w_ptr + 2 * MP * nD + woff, mask=dm[:, None], other=0.0)
        x0, x1, x2 = _parts(xt, X_PARTS)
        # one tile's products in the MMA, the running sum in rounding float32 adds
        acc += _dot_pp(x0, x1, x2, w0, w1, w2, tl.zeros([BLOCK_T, MP], dtype=tl.float32), X_PARTS, 2, EMU)
    out = (c * T + rows).to(tl.int64) * MP
    tl.store(part_ptr + out[:, None] + m[None, :], acc, mask=rmask[:, None])
    tl.store(ssq_ptr + c * T + rows, tl.sum(sq, axis=1), mask=rmask)


@triton.jit
def _fwd_mix_kernel(x_ptr, part_ptr, ssq_ptr, alpha_ptr, bias_ptr,
                    hin_ptr, hpost_ptr, hres_ptr, hmix_ptr, inv_ptr, hpre_ptr,
                    T, S, n, D, nD, M, KSPLIT, norm_eps, hc_eps, post_mult,
                    sxb, sxs, sxn, sxd,
                    MP: tl.constexpr, NP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    # last token blocks first: the GEMM kernel read them last, so their x may still be in L2
    tb = tl.num_programs(0) - 1 - tl.program_id(0)
    rows = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    m = tl.arange(0, MP)
    hm = tl.zeros([BLOCK_T, MP], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for c in range(KSPLIT):
        hm += tl.load(part_ptr + ((c * T + rows).to(tl.int64) * MP)[:, None] + m[None, :],
                      mask=rmask[:, None], other=0.0)
        ss += tl.load(ssq_ptr + c * T + rows, mask=rmask, other=0.0)
    inv = tl.div_rn(tl.full(ss.shape, 1.0, tl.float32), tl.sqrt_rn(_div(ss, nD) + norm_eps))
    t, z, a = _affine(hm, inv, alpha_ptr, bias_ptr, n, M, MP)
    sig = _sigmoid(z)
    pre = (m < n)[None, :]
    post = ((m >= n) & (m < 2 * n))[None, :]
    res = ((m >= 2 * n) & (m < M))[None, :]
    r2 = rmask[:, None]
    rl = rows.to(tl.int64)[:, None]
    hpre = tl.where(pre, sig + hc_eps, 0.0)
    tl.store(hmix_ptr + rl * MP + m[None, :], hm, mask=r2)
    tl.store(inv_ptr + rows, inv, mask=rmask)
    tl.store(hpre_ptr + rl * n + m[None, :], hpre, mask=r2 & pre)
    tl.store(hpost_ptr + rl * n + (m - n)[None, :], post_mult * sig, mask=r2 & post)
    tl.store(hres_ptr + rl * (n * n) + (m - 2 * n)[None, :], z, mask=r2 & res)

    # h_pre as a [BLOCK_T, NP] tile, then h_in = sum_k h_pre_k * x_k over D in blocks
    k = tl.arange(0, NP)
    hp = tl.sum(tl.where(m[None, None, :] == k[None, :, None], hpre[:, None, :], 0.0), axis=2)
    base = (rows // S).to(tl.int64) * sxb + (rows % S).to(tl.int64) * sxs
    kmask = (k < n)[None, :, None]
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        off = k.to(tl.int64)[:, None] * sxn + d.to(tl.int64)[None, :] * sxd
        xt = tl.load(x_ptr + base[:, None, None] + off[None, :, :],
                     mask=rmask[:, None, None] & kmask & dm[None, None, :], other=0.0)
        hin = tl.sum(hp[:, :, None] * xt.to(tl.float32), axis=1)
        tl.store(hin_ptr + rl * D + d[None, :], hin.to(hin_ptr.dtype.element_ty), mask=r2 & dm[None, :])


@triton.jit
def _bwd_token_kernel(x_ptr, gin_ptr, gpost_ptr, gres_ptr, hmix_ptr, inv_ptr, alpha_ptr, bias_ptr,
                      dhmix_ptr, coef_ptr, pcol_ptr,
                      T, S, n, D, nD, M, post_mult,
                      sxb, sxs, sxn, sxd, sgb, sgs, sgd, spb, sps, spk, srb, srs, srp, srq,
                      MP: tl.constexpr, NP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    tb = tl.program_id(0)
    rows = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    b = (rows // S).to(tl.int64)
    s = (rows % S).to(tl.int64)
    xbase = b * sxb + s * sxs
    gbase = b * sgb + s * sgs
    k = tl.arange(0, NP)
    kmask = (k < n)[None, :, None]
    # dh_pre[t, k] = sum_d g_in[t, d] * x[t, k, d]; products summed per lane, reduced after the loop
    acc = tl.zeros([BLOCK_T, NP, BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < D
        off = k.to(tl.int64)[:, None] * sxn + d.to(tl.int64)[None, :] * sxd
        xt = tl.load(x_ptr + xbase[:, None, None] + off[None, :, :],
                     mask=rmask[:, None, None] & kmask & dm[None, None, :], other=0.0)
        g = tl.load(gin_ptr + gbase[:, None] + d.to(tl.int64)[None, :] * sgd,
                    mask=rmask[:, None] & dm[None, :], other=0.0)
        acc += xt.to(tl.float32) * g.to(tl.float32)[:, None, :]
    dhp = tl.sum(acc, axis=2)
    m = tl.arange(0, MP)
    dhp_m = tl.sum(tl.where(k[None, :, None] == m[None, None, :], dhp[:, :, None], 0.0), axis=1)

    r2 = rmask[:, None]
    rl = rows.to(tl.int64)[:, None]
    hm = tl.load(hmix_ptr + rl * MP + m[None, :], mask=r2, other=0.0)
    inv = tl.load(inv_ptr + rows, mask=rmask, other=0.0)
    t, z, a = _affine(hm, inv, alpha_ptr, bias_ptr, n, M, MP)
    sig = _sigmoid(z)
    pre = (m < n)[None, :]
    post = ((m >= n) & (m < 2 * n))[None, :]
    res = ((m >= 2 * n) & (m < M))[None, :]
    gp = tl.load(gpost_ptr + (b * spb + s * sps)[:, None] + (m - n)[None, :] * spk, mask=r2 & post, other=0.0)
    q = m - 2 * n
    gr = tl.load(gres_ptr + (b * srb + s * srs)[:, None] + ((q // n) * srp + (q % n) * srq)[None, :],
                 mask=r2 & res, other=0.0)
    hpost = post_mult * sig
    # dz = [dh_pre2 | dh_post2 | g_res]: the gradient of the sigmoid/affine arguments (= dbias per token)
    dz = tl.where(pre, dhp_m * sig * (1.0 - sig), 0.0)
    dz = tl.where(post, gp * hpost * (1.0 - _div(hpost, post_mult)), dz)
    dz = tl.where(res, gr, dz)
    dz = tl.where(r2, dz, 0.0)
    dt = a[None, :] * dz
    dinv = tl.sum(dt * hm, axis=1)
    h0, h1, h2 = _parts(dt * inv[:, None], 3)
    # dh_mix as three bf16 parts [3, T, MP]: the dx kernel feeds them straight to its dots
    tl.store(dhmix_ptr + rl * MP + m[None, :], h0, mask=r2)
    tl.store(dhmix_ptr + T * MP + rl * MP + m[None, :], h1, mask=r2)
    tl.store(dhmix_ptr + 2 * T * MP + rl * MP + m[None, :], h2, mask=r2)
    tl.store(coef_ptr + rows, _div(dinv * inv * inv * inv, nD), mask=rmask)
    # per-token-block column sums: [0] -> dbias, [1] -> dalpha (by section); summed in a fixed order later
    tl.store(pcol_ptr + (tb * 2) * MP + m, tl.sum(dz, axis=0))
    tl.store(pcol_ptr + (tb * 2 + 1) * MP + m, tl.sum(dz * t, axis=0))


@triton.jit
def _bwd_nd_kernel(x_ptr, gin_ptr, w_ptr, dhmix_ptr, coef_ptr, hpre_ptr, dx_ptr, pphi_ptr,
                   T, S, n, D, nD, TOK_PER_GROUP,
                   sxb, sxs, sxn, sxd, sgb, sgs, sgd,
                   X_PARTS: tl.constexpr, MM_ORDER: tl.constexpr, MP: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_ND: tl.constexpr, EMU: tl.constexpr,
                   TMA: tl.constexpr = False):
    # One program: one BLOCK_ND block of stream k's D features, for one token group. Blocks never
    # straddle two streams (contiguous, vectorizable addresses; h_pre[t, k] is one column).
    # Tiles are [nD, token]: every dot then has BLOCK_ND as its M dimension, which the warps split
    # without replication, and they share one accumulator layout.
    # The n streams of one feature block are neighbours in launch order: they run together and walk
    # the same tokens, so g_in (which they share) is read from DRAM about once (ncu, H100, D=4096: 710 MB
    # of DRAM reads against 671 MB of x and g_in; 807 MB in stream-major order).
    # TMA: x_ptr and gin_ptr are tensor descriptors ([T, n, D] and [T, D]; wrapper._nd_descriptors).
    dblk = tl.program_id(0) // n
    k = tl.program_id(0) - dblk * n
    d0 = dblk * BLOCK_ND
    # last token group first, each walked backwards: the token kernel read those tokens last
    grp = tl.num_programs(1) - 1 - tl.program_id(1)
    d = d0 + tl.arange(0, BLOCK_ND)
    dm = d < D
    j = k * D + d
    m = tl.arange(0, MP)
    # (phi * gamma)^T as the forward's bf16 parts, [BLOCK_ND, MP]
    woff = (m * nD)[None, :] + j[:, None]
    p0 = tl.load(w_ptr + woff, mask=dm[:, None], other=0.0)
    p1 = tl.load(w_ptr + MP * nD + woff, mask=dm[:, None], other=0.0)
    p2 = tl.load(w_ptr + 2 * MP * nD + woff, mask=dm[:, None], other=0.0)
    acc_phi = tl.zeros([BLOCK_ND, MP], dtype=tl.float32)
    t_lo = grp * TOK_PER_GROUP
    t_hi = tl.minimum(t_lo + TOK_PER_GROUP, T)
    if TMA:
        acc_phi = _nd_tma_loop(x_ptr, gin_ptr, dx_ptr, dhmix_ptr, coef_ptr, hpre_ptr, p0, p1, p2, acc_phi,
                               k, d0, t_lo, t_hi, T, n, nD, j, dm, X_PARTS, MM_ORDER, MP, BLOCK_T, BLOCK_ND)
    else:
        acc_phi = _nd_ptr_loop(x_ptr, gin_ptr, dx_ptr, dhmix_ptr, coef_ptr, hpre_ptr, p0, p1, p2, acc_phi,
                               k, d, t_lo, t_hi, T, S, n, nD, j, dm, sxb, sxs, sxn, sxd, sgb, sgs, sgd,
                               X_PARTS, MM_ORDER, MP, BLOCK_T, BLOCK_ND, EMU)
    # this token group's P[m, j] = sum_t dh_mix[t, m] x[t, j]; dphi = gamma * P, dgamma = sum_m phi * P
    # (the M = n * n + 2n real rows: the reduce kernel never reads the padding)
    tl.store(pphi_ptr + ((grp * MP + m).to(tl.int64) * nD)[None, :] + j[:, None], acc_phi,
             mask=dm[:, None] & (m < n * n + 2 * n)[None, :])


@triton.jit
def _nd_tma_loop(x_desc, g_desc, dx_ptr, dhmix_ptr, coef_ptr, hpre_ptr, p0, p1, p2, acc_phi,
                 k, d0, t_lo, t_hi, T, n, nD, j, dm,
                 X_PARTS: tl.constexpr, MM_ORDER: tl.constexpr, MP: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_ND: tl.constexpr):
    """The token tiles walked backwards, x and g_in read by the copy engine ([T, n, D] and [T, D]
    descriptors: zero padding past T and D), which the compiler pipelines; the per-token scalars are
    loaded one iteration ahead by hand. (A TMA store of dx, through shared memory, made the backward
    16% slower: H100, D=4096.)"""
    nit = tl.cdiv(t_hi - t_lo, BLOCK_T)
    rows = t_lo + (nit - 1) * BLOCK_T + tl.arange(0, BLOCK_T)
    ncf, nhp = _token_scalars(coef_ptr, hpre_ptr, rows, rows < t_hi, n, k)
    for i in range(nit):
        t0 = t_lo + (nit - 1 - i) * BLOCK_T
        cur = t0 + tl.arange(0, BLOCK_T)
        cf = ncf
        hp = nhp
        rows = cur - BLOCK_T
        ncf, nhp = _token_scalars(coef_ptr, hpre_ptr, rows, rows >= t_lo, n, k)
        xt = tl.trans(tl.reshape(x_desc.load([t0, k, d0]), [BLOCK_T, BLOCK_ND]))
        gi = tl.trans(g_desc.load([t0, d0])).to(tl.float32)
        acc_phi = _nd_tile(xt, gi, cf, hp, cur, (cur < t_hi)[None, :], dx_ptr, dhmix_ptr, p0, p1, p2, acc_phi,
                           T, nD, j, dm, X_PARTS, MM_ORDER, MP, BLOCK_ND, BLOCK_T, False)
    return acc_phi


@triton.jit
def _nd_ptr_loop(x_ptr, gin_ptr, dx_ptr, dhmix_ptr, coef_ptr, hpre_ptr, p0, p1, p2, acc_phi,
                 k, d, t_lo, t_hi, T, S, n, nD, j, dm, sxb, sxs, sxn, sxd, sgb, sgs, sgd,
                 X_PARTS: tl.constexpr, MM_ORDER: tl.constexpr, MP: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_ND: tl.constexpr, EMU: tl.constexpr):
    """The token tiles walked backwards, x and g_in through pointers (any strides); the next tile's x,
    g_in and per-token scalars are loaded one iteration ahead by hand (the compiler pipelines only the
    loads that feed a dot directly)."""
    xoff = (k.to(tl.int64) * sxn + d.to(tl.int64) * sxd)[:, None]
    goff = (d.to(tl.int64) * sgd)[:, None]
    nit = tl.cdiv(t_hi - t_lo, BLOCK_T)
    rows = t_lo + (nit - 1) * BLOCK_T + tl.arange(0, BLOCK_T)
    nmask = (rows < t_hi)[None, :]
    bs = (rows // S).to(tl.int64)[None, :] * sxb + (rows % S).to(tl.int64)[None, :] * sxs
    gs = (rows // S).to(tl.int64)[None, :] * sgb + (rows % S).to(tl.int64)[None, :] * sgs
    nx = tl.load(x_ptr + bs + xoff, mask=nmask & dm[:, None], other=0.0)
    ng = tl.load(gin_ptr + gs + goff, mask=nmask & dm[:, None], other=0.0)
    ncf, nhp = _token_scalars(coef_ptr, hpre_ptr, rows, rows < t_hi, n, k)
    for _ in range(nit):
        cur = rows
        r2 = nmask
        xt = nx
        gi = ng.to(tl.float32)
        cf = ncf
        hp = nhp
        rows = cur - BLOCK_T
        nmask = (rows >= t_lo)[None, :]
        bs = (rows // S).to(tl.int64)[None, :] * sxb + (rows % S).to(tl.int64)[None, :] * sxs
        gs = (rows // S).to(tl.int64)[None, :] * sgb + (rows % S).to(tl.int64)[None, :] * sgs
        nx = tl.load(x_ptr + bs + xoff, mask=nmask & dm[:, None], other=0.0)
        ng = tl.load(gin_ptr + gs + goff, mask=nmask & dm[:, None], other=0.0)
        ncf, nhp = _token_scalars(coef_ptr, hpre_ptr, rows, rows >= t_lo, n, k)
        acc_phi = _nd_tile(xt, gi, cf, hp, cur, r2, dx_ptr, dhmix_ptr, p0, p1, p2, acc_phi,
                           T, nD, j, dm, X_PARTS, MM_ORDER, MP, BLOCK_ND, BLOCK_T, EMU)
    return acc_phi


@triton.jit
def _token_scalars(coef_ptr, hpre_ptr, rows, mask, n, k):
    """The dinv_rms coefficient and h_pre[k] of a tile's tokens (zero where masked)."""
    return (tl.load(coef_ptr + rows, mask=mask, other=0.0),
            tl.load(hpre_ptr + rows.to(tl.int64) * n + k, mask=mask, other=0.0))


@triton.jit
def _nd_tile(xt, gi, cf, hp, cur, r2, dx_ptr, dhmix_ptr, p0, p1, p2, acc_phi, T, nD, j, dm,
             X_PARTS: tl.constexpr, MM_ORDER: tl.constexpr, MP: tl.constexpr, BLOCK_ND: tl.constexpr,
             BLOCK_T: tl.constexpr, EMU: tl.constexpr):
    """One [BLOCK_ND, BLOCK_T] tile: stores dx = (phi * gamma)^T dh_mix^T - coef x + h_pre g_in and
    returns acc_phi + x dh_mix (this block's partial P)."""
    m = tl.arange(0, MP)
    hoff = cur.to(tl.int64)[None, :] * MP + m[:, None]
    h0 = tl.load(dhmix_ptr + hoff, mask=r2, other=0.0)
    h1 = tl.load(dhmix_ptr + T * MP + hoff, mask=r2, other=0.0)
    h2 = tl.load(dhmix_ptr + 2 * T * MP + hoff, mask=r2, other=0.0)
    # mmg = (phi * gamma)^T @ dh_mix^T = (dvecX_mm * gamma)^T on this block
    mmg = _dot_pp(p0, p1, p2, h0, h1, h2, tl.zeros([BLOCK_ND, BLOCK_T], dtype=tl.float32), 3, MM_ORDER, EMU)
    xf = xt.to(tl.float32)
    dxv = mmg - cf[None, :] * xf + hp[None, :] * gi
    msk = r2 & dm[:, None]
    tl.store(dx_ptr + cur.to(tl.int64)[None, :] * nD + j[:, None], dxv.to(dx_ptr.dtype.element_ty), mask=msk)
    x0, x1, x2 = _parts(xt, X_PARTS)
    return acc_phi + _dot_pp(x0, x1, x2, tl.trans(h0), tl.trans(h1), tl.trans(h2),
                             tl.zeros([BLOCK_ND, MP], dtype=tl.float32), X_PARTS, 2, EMU)


@triton.jit
def _bwd_reduce_kernel(pphi_ptr, pcol_ptr, phi_ptr, gamma_ptr, dphi_ptr, dgamma_ptr, dalpha_ptr, dbias_ptr,
                       n, nD, M, G, NTB, sphm, sphj,
                       HAS_GAMMA: tl.constexpr, MP: tl.constexpr, BLOCK_ND: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    m = tl.arange(0, MP)
    mrow = m < M
    if pid < tl.cdiv(nD, BLOCK_ND):
        j0 = pid * BLOCK_ND
        j = j0 + tl.arange(0, BLOCK_ND)
        jm = j < nD
        msk = mrow[:, None] & jm[None, :]
        P = tl.zeros([MP, BLOCK_ND], dtype=tl.float32)
        for g in range(G):
            P += tl.load(pphi_ptr + ((g * MP + m).to(tl.int64) * nD)[:, None] + j[None, :], mask=msk, other=0.0)
        if HAS_GAMMA:
            # dgamma[j] = sum_t x[t, j] * dvecX_mm[t, j] = sum_m phi[m, j] * P[m, j]
            ph = tl.load(phi_ptr + m[:, None] * sphm + j[None, :] * sphj, mask=msk, other=0.0)
            dg = tl.sum(ph * P, axis=0)
            tl.store(dgamma_ptr + j, dg, mask=jm)
            P = P * tl.load(gamma_ptr + j, mask=jm, other=0.0)[None, :]
        tl.store(dphi_ptr + (m.to(tl.int64) * nD)[:, None] + j[None, :], P, mask=msk)
    else:
        cb = tl.zeros([BLOCK_R, MP], dtype=tl.float32)
        ca = tl.zeros([BLOCK_R, MP], dtype=tl.float32)
        for r0 in range(0, NTB, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            rm = (r < NTB)[:, None]
            cb += tl.load(pcol_ptr + (r * 2)[:, None] * MP + m[None, :], mask=rm, other=0.0)
            ca += tl.load(pcol_ptr + (r * 2 + 1)[:, None] * MP + m[None, :], mask=rm, other=0.0)
        colb = tl.sum(cb, axis=0)
        cola = tl.sum(ca, axis=0)
        tl.store(dbias_ptr + m, colb, mask=mrow)
        sec = (m >= n).to(tl.int32) + (m >= 2 * n).to(tl.int32)
        for i in tl.static_range(3):
            tl.store(dalpha_ptr + i, tl.sum(tl.where(mrow & (sec == i), cola, 0.0), axis=0))
