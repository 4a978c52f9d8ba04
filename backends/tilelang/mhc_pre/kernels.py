"""TileLang kernels of ``mhc_pre`` (docs/specs/mhc_pre.md), specialized per (n, D, dtype).

Layout: x is viewed as X [T, n*D] (row-major, made contiguous by the wrapper); T is a dynamic
dimension, n, D and the scalars are compile-time constants. M = n*n + 2n is padded to Mp (a
multiple of 16) inside; padded rows of phi are zero, so padded columns of h_mix are zero.

Precision: the GEMMs run on tensor cores in bfloat16 with float32 accumulation, on operands split
into bf16 pieces (v = hi + mid + lo, about 24 significant bits, as float32 has): phi (and phi*gamma)
in 3 pieces, x in 1 (bf16 is exact), 2 (fp16) or 3 (fp32) pieces, dh_mix in 3. Every product of
pieces whose orders add up to at most 2 is kept. The tensor cores' float32 accumulation truncates,
which over a long K drifts (measured on an H200: h_mix 3-8x the fp32 floor at nD = 16384), so the
long reductions (forward over nD, dphi over tokens) restart from zero on every tile and are summed
with round-to-nearest float32 adds.

Pipelines: where D % 64 == 0 the tile copies may lower to TMA (TileLang then warp-specializes);
elsewhere they are plain cp.async pipelines (use_tma). bwd_col pipelines only where every copy of
its loop is a TMA copy (col_pipelined: bf16, n = 4 as planned) and runs a plain serial loop
elsewhere: TileLang warp-specializes a loop with one TMA copy among plain ones and releases each
stage after the last read of its TMA buffers only (a race on the plainly copied tiles).

Kernels (all reductions over tokens write per-block partials summed in a fixed order: deterministic):
  prep      phi, gamma -> P = pieces(phi*gamma), Q = pieces(phi), each [3*Mp, nD] bf16
  fwd       per token tile: h_mix = X @ P^T (+ sum of squares) -> inv_rms, h_pre, h_post, h_res;
            then h_in = sum_k h_pre[k] * x[k] (x is read twice: the row does not fit on chip)
  bwd_tok   per token tile: dh_pre = g_in . x[k] -> dt, dh_mix, coef = dinv_rms*inv_rms^3/nD,
            and per-tile partials of dbias and dalpha
  bwd_col   per (D slice of all n streams, token split): dvec = dh_mix @ Q, dx, and a partial of
            raw = dh_mix^T @ X for its columns
  fin_phi   dphi = gamma * sum_splits raw; dgamma = sum_m phi * sum_splits raw
  fin_small dbias, dalpha from the per-tile partials
"""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations, which
# name closure variables (e.g. dynamic sizes used only in a signature).
from dataclasses import dataclass

import tilelang.language as T

F32 = "float32"
BF16 = "bfloat16"
# bf16 pieces needed to represent one x value exactly
X_PIECES = {"bfloat16": 1, "float16": 2, "float32": 3}
ESIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
SMEM_BUDGET = 200 * 1024


def m_pad(n: int) -> int:
    m = n * n + 2 * n
    return (m + 15) // 16 * 16


def m_frag(n: int) -> int:
    """Mp rounded up to a power of two: TileLang finds no register layout for a fragment whose last
    dimension is e.g. 48 or 80 (\"no available layout found\")."""
    p = 16
    while p < m_pad(n):
        p *= 2
    return p


def _pow2_floor(v: int) -> int:
    p = 1
    while p * 2 <= v:
        p *= 2
    return p


@dataclass(frozen=True)
class Plan:
    """Tile sizes of one (n, D, dtype) specialization."""

    n: int
    D: int
    dtype: str
    Mp: int          # M padded to a multiple of 16 (forward GEMM, h_mix)
    MF: int          # M padded to a power of two (backward fragments and GEMMs)
    BT: int          # forward token tile (BLOCK_T)
    BK: int          # forward nD tile (BLOCK_ND)
    BDC: int         # forward h_in pass: D chunk
    BT1: int         # bwd_tok token tile
    BD1: int         # bwd_tok D chunk
    BT2: int         # bwd_col token tile
    BD: int          # bwd_col D slice (per stream)
    NC: int          # bwd_col padded column count (>= n*BD, multiple of 64)
    col_stages: int  # bwd_col pipeline depth
    stage_dm: bool   # bwd_col: dh_mix tile through shared memory (else read from global)


def _col_smem(n: int, dtype: str, MF: int, BT2: int, BD: int, NC: int, stages: int, stage_dm: bool) -> int:
    es, nx = ESIZE[dtype], X_PIECES[dtype]
    per_stage = BT2 * NC * es + BT2 * BD * es + BT2 * 4 + BT2 * n * 4 + (BT2 * MF * 4 if stage_dm else 0)
    fixed = 3 * MF * NC * 2 + 6 * BT2 * MF * 2 + NC * 4 + (nx * BT2 * NC * 2 if nx > 1 else 0)
    return fixed + stages * per_stage


def plan(n: int, D: int, dtype: str) -> Plan:
    if not 1 <= n <= 8:
        raise ValueError(f"mhc_pre tilelang: n must be in 1..8, got {n}")
    es = ESIZE[dtype]
    # h_in pass: n tiles of [64, BDC] per stage, 16 KB in all
    BDC = max(16, _pow2_floor(max(1, 256 // (n * (es // 2)))))
    BD1 = max(16, _pow2_floor(max(1, 256 // n)))
    MF = m_frag(n)
    # prefer wide column slices and a 2-deep pipeline; BD >= 16 (narrower slices of a K-major
    # tile have no valid TMA/swizzle layout); BT2 = 32 (no wgmma) only when nothing else fits
    for BT2 in (64, 32):
        for nc_target in (256, 128):
            BD = max(16, _pow2_floor(max(1, nc_target // n)))
            NC = max(64, (n * BD + 63) // 64 * 64)
            for stages, stage_dm in ((2, True), (1, True), (2, False), (1, False)):
                if _col_smem(n, dtype, MF, BT2, BD, NC, stages, stage_dm) <= SMEM_BUDGET:
                    return Plan(n, D, dtype, m_pad(n), MF, 64, 64, BDC, 32, BD1, BT2, BD, NC, stages, stage_dm)
    raise AssertionError(f"no bwd_col tiling fits shared memory for n={n}, dtype={dtype}")


def _split3(v):
    """v (float32) -> three bf16 pieces whose sum is v to about 2^-24 relative."""
    h = T.cast(v, BF16)
    r = v - T.cast(h, F32)
    m = T.cast(r, BF16)
    lo = T.cast(r - T.cast(m, F32), BF16)
    return h, m, lo


def _copy(src, dst, tma: bool):
    """T.copy global -> shared; with tma=False never through TMA (plain cp.async pipelines, no
    warp specialization). Returns the copy: a bare call statement in a prim_func emits it."""
    if tma:
        return T.copy(src, dst)
    return T.copy(src, dst, annotations={"disable_tma": True})


def _tile_loop(extent, stages: int, tma: bool):
    """The loop over token tiles of bwd_col: a TMA pipeline, or (tma=False) a plain serial loop."""
    return T.Pipelined(extent, num_stages=stages) if tma else T.serial(extent)


def use_tma(n: int, D: int, dtype: str) -> bool:
    """TMA (and TileLang's warp-specialized pipelines) only where every tile is aligned to a D slice."""
    return D % 64 == 0


def _sigmoid(z):
    return 1.0 / (1.0 + T.exp(-z))


def prep_kernel(n: int, D: int):
    """P[b*Mp + m, c] = piece b of phi[m, c]*gamma[c]; QT[b*nD + c, m] = piece b of phi[m, c]
    (transposed, so that every GEMM operand with a short M side is K-major); zero for m >= M."""
    nD, M, Mp, MF = n * D, n * n + 2 * n, m_pad(n), m_frag(n)
    BC = 128

    @T.prim_func
    def mhc_prep(phi: T.Tensor((M, nD), F32), gamma: T.Tensor((nD,), F32),
                 P: T.Tensor((3 * Mp, nD), BF16), QT: T.Tensor((3 * nD, MF), BF16)):
        with T.Kernel(T.ceildiv(nD, BC), threads=128) as bx:
            for m, c in T.Parallel(MF, BC):
                col = bx * BC + c
                if col < nD:
                    v = T.if_then_else(m < M, phi[T.min(m, M - 1), col], T.float32(0))
                    qh, qm, ql = _split3(v)
                    QT[col, m] = qh
                    QT[nD + col, m] = qm
                    QT[2 * nD + col, m] = ql
                    if m < Mp:
                        ph, pm, pl = _split3(v * gamma[col])
                        P[m, col] = ph
                        P[Mp + m, col] = pm
                        P[2 * Mp + m, col] = pl

    return mhc_prep


def fwd_kernel(n: int, D: int, dtype: str, norm_eps: float, hc_eps: float, post_mult: float,
               tma: bool = True):
    p = plan(n, D, dtype)
    nD, M, Mp = n * D, n * n + 2 * n, p.Mp
    BT, BK, BDC = p.BT, p.BK, p.BDC
    NX = X_PIECES[dtype]
    Tn = T.dynamic("T")

    @T.prim_func
    def mhc_fwd(x: T.Tensor((Tn, nD), dtype), P: T.Tensor((3 * Mp, nD), BF16),
                alpha: T.Tensor((3,), F32), bias: T.Tensor((M,), F32),
                h_in: T.Tensor((Tn, D), dtype), h_post: T.Tensor((Tn, n), F32),
                h_res: T.Tensor((Tn, n * n), F32), h_mix: T.Tensor((Tn, Mp), F32),
                inv_rms: T.Tensor((Tn,), F32), h_pre: T.Tensor((Tn, n), F32),
                s_comp: T.Tensor((Tn, n), F32)):
        with T.Kernel(T.ceildiv(Tn, BT), threads=128) as bx:
            xs = T.alloc_shared((BT, BK), dtype)
            ps = T.alloc_shared((3 * Mp, BK), BF16)
            pieces = [xs] if NX == 1 else [T.alloc_shared((BT, BK), BF16) for _ in range(NX)]
            acc = T.alloc_fragment((BT, 3 * Mp), F32)
            blk = T.alloc_fragment((BT, 3 * Mp), F32)
            sq = T.alloc_fragment((BT, BK), F32)
            T.clear(acc)
            T.clear(sq)
            # pass 1: h_mix (three column groups, one per piece of phi*gamma) and sum of squares
            for ko in T.Pipelined(T.ceildiv(nD, BK), num_stages=2):
                _copy(x[bx * BT, ko * BK], xs, tma)
                _copy(P[0, ko * BK], ps, tma)
                for i, j in T.Parallel(BT, BK):
                    sq[i, j] += T.cast(xs[i, j], F32) * T.cast(xs[i, j], F32)
                if NX > 1:
                    for i, j in T.Parallel(BT, BK):
                        v = T.cast(xs[i, j], F32)
                        h = T.cast(v, BF16)
                        r = v - T.cast(h, F32)
                        pieces[0][i, j] = h
                        pieces[1][i, j] = T.cast(r, BF16)
                        if NX > 2:
                            pieces[2][i, j] = T.cast(r - T.cast(T.cast(r, BF16), F32), BF16)
                # the tensor cores' float32 accumulation drifts over long K (measured: h_mix errors
                # 3-8x the fp32 floor at nD = 16384): each K tile starts from zero and is added
                # to the running sum with round-to-nearest float32 adds
                # smallest piece first: the MMA truncates each partial sum to the magnitude of
                # what it holds, so the large products go in last (fewer truncated adds)
                for q, pc in enumerate(reversed(pieces)):
                    T.gemm(pc, ps, blk, transpose_B=True, clear_accum=(q == 0))
                for i, j in T.Parallel(BT, 3 * Mp):
                    acc[i, j] += blk[i, j]
            hm_s = T.alloc_shared((BT, 3 * Mp), F32)
            T.copy(acc, hm_s)
            sqr = T.alloc_fragment((BT,), F32)
            T.reduce_sum(sq, sqr, dim=1)
            ir_s = T.alloc_shared((BT,), F32)
            for i in T.Parallel(BT):
                ir_s[i] = T.rsqrt(sqr[i] / T.float32(nD) + T.float32(norm_eps))
                if bx * BT + i < Tn:
                    inv_rms[bx * BT + i] = ir_s[i]
            # coefficients of each token
            hp_s = T.alloc_shared((BT, n), F32)
            for i, j in T.Parallel(BT, Mp):
                row = bx * BT + i
                hmv = hm_s[i, j] + (hm_s[i, Mp + j] + hm_s[i, 2 * Mp + j])
                tv = hmv * ir_s[i]
                jb = T.min(j, M - 1)
                if j < n:
                    hp_s[i, j] = _sigmoid(alpha[0] * tv + bias[jb]) + T.float32(hc_eps)
                if row < Tn:
                    h_mix[row, j] = hmv
                    if j < n:
                        h_pre[row, j] = _sigmoid(alpha[0] * tv + bias[jb]) + T.float32(hc_eps)
                        # 1 - s from the logit, for the backward's s (1 - s) (bwd_tok_kernel)
                        s_comp[row, j] = _sigmoid(-(alpha[0] * tv + bias[jb]))
                    if j >= n:
                        if j < 2 * n:
                            h_post[row, j - n] = T.float32(post_mult) * _sigmoid(alpha[1] * tv + bias[jb])
                    if j >= 2 * n:
                        if j < M:
                            h_res[row, j - 2 * n] = alpha[2] * tv + bias[jb]
            # pass 2: h_in = sum_k h_pre[k] * x[k]   (tiles of the last chunk may read the next
            # stream's columns: those lanes are never stored)
            xk = [T.alloc_shared((BT, BDC), dtype) for _ in range(n)]
            for dc in T.Pipelined(T.ceildiv(D, BDC), num_stages=2):
                for k in list(range(n)):
                    _copy(x[bx * BT, k * D + dc * BDC], xk[k], tma)
                for i, j in T.Parallel(BT, BDC):
                    v = hp_s[i, 0] * T.cast(xk[0][i, j], F32)
                    for k in list(range(1, n)):
                        v = v + hp_s[i, k] * T.cast(xk[k][i, j], F32)
                    row = bx * BT + i
                    col = dc * BDC + j
                    if row < Tn:
                        if col < D:
                            h_in[row, col] = T.cast(v, dtype)

    return mhc_fwd


def bwd_tok_kernel(n: int, D: int, dtype: str, hc_eps: float, post_mult: float, tma: bool = True):
    p = plan(n, D, dtype)
    nD, M, Mp, MF = n * D, n * n + 2 * n, p.Mp, m_frag(n)
    BT1, BD1 = p.BT1, p.BD1
    Tn = T.dynamic("T")
    NB = T.dynamic("NB")

    @T.prim_func
    def mhc_bwd_tok(x: T.Tensor((Tn, nD), dtype), g_in: T.Tensor((Tn, D), dtype),
                    g_post: T.Tensor((Tn, n), F32), g_res: T.Tensor((Tn, n * n), F32),
                    h_mix: T.Tensor((Tn, Mp), F32), inv_rms: T.Tensor((Tn,), F32),
                    h_pre: T.Tensor((Tn, n), F32), s_comp: T.Tensor((Tn, n), F32),
                    h_post: T.Tensor((Tn, n), F32), alpha: T.Tensor((3,), F32),
                    dhm: T.Tensor((Tn, MF), F32), coef: T.Tensor((Tn,), F32),
                    part_bias: T.Tensor((NB, MF), F32), part_alpha: T.Tensor((NB, MF), F32)):
        with T.Kernel(T.ceildiv(Tn, BT1), threads=128) as bx:
            gs = T.alloc_shared((BT1, BD1), dtype)
            xk = [T.alloc_shared((BT1, BD1), dtype) for _ in range(n)]
            accs = [T.alloc_fragment((BT1, BD1), F32) for _ in range(n)]
            for a in accs:
                T.clear(a)
            # dh_pre[t, k] = sum_d g_in[t, d] * x[t, k, d]
            for dc in T.Pipelined(T.ceildiv(D, BD1), num_stages=2):
                _copy(g_in[bx * BT1, dc * BD1], gs, tma)
                for k in list(range(n)):
                    _copy(x[bx * BT1, k * D + dc * BD1], xk[k], tma)
                for k in list(range(n)):
                    for i, j in T.Parallel(BT1, BD1):
                        # lanes past D hold the next stream's x: mask them (g_in is zero-filled there)
                        accs[k][i, j] += T.if_then_else(
                            dc * BD1 + j < D, T.cast(gs[i, j], F32) * T.cast(xk[k][i, j], F32), T.float32(0))
            dp_s = T.alloc_shared((BT1, n), F32)
            reds = [T.alloc_fragment((BT1,), F32) for _ in range(n)]
            for k in list(range(n)):
                T.reduce_sum(accs[k], reds[k], dim=1)
                for i in T.Parallel(BT1):
                    dp_s[i, k] = reds[k][i]
            dt_f = T.alloc_fragment((BT1, MF), F32)
            pr_f = T.alloc_fragment((BT1, MF), F32)
            g2_f = T.alloc_fragment((BT1, MF), F32)
            ta_f = T.alloc_fragment((BT1, MF), F32)
            for i, j in T.Parallel(BT1, MF):
                row = bx * BT1 + i
                rc = T.min(row, Tn - 1)
                hm = T.if_then_else(j < M, h_mix[rc, T.min(j, Mp - 1)], T.float32(0))
                ir = inv_rms[rc]
                jn = T.min(j, n - 1)
                jp = T.min(T.max(j - n, 0), n - 1)
                jr = T.min(T.max(j - 2 * n, 0), n * n - 1)
                # s (1 - s): s = h_pre - hc_eps keeps its digits where s is small, the forward's 1 - s (s_comp)
                # where s is near 1; 1 - (h_pre - hc_eps) kept few there (saturating gates: dalpha.pre at 5x the
                # floor's error on an H200)
                s = h_pre[rc, jn] - T.float32(hc_eps)
                g2pre = dp_s[i, jn] * s * s_comp[rc, jn]
                hp = h_post[rc, jp]
                g2post = g_post[rc, jp] * hp * (T.float32(1) - hp / T.float32(post_mult))
                g2 = T.if_then_else(
                    row < Tn,
                    T.if_then_else(j < n, g2pre, T.if_then_else(
                        j < 2 * n, g2post, T.if_then_else(j < M, g_res[rc, jr], T.float32(0)))),
                    T.float32(0))
                a = T.if_then_else(j < n, alpha[0], T.if_then_else(j < 2 * n, alpha[1], alpha[2]))
                dt_f[i, j] = a * g2
                pr_f[i, j] = a * g2 * hm
                g2_f[i, j] = g2
                ta_f[i, j] = g2 * (hm * ir)
            dinv = T.alloc_fragment((BT1,), F32)
            T.reduce_sum(pr_f, dinv, dim=1)
            for i in T.Parallel(BT1):
                row = bx * BT1 + i
                if row < Tn:
                    ir = inv_rms[row]
                    coef[row] = dinv[i] * ir * ir * ir / T.float32(nD)
            for i, j in T.Parallel(BT1, MF):
                row = bx * BT1 + i
                if row < Tn:
                    dhm[row, j] = dt_f[i, j] * inv_rms[row]
            pb = T.alloc_fragment((MF,), F32)
            pa = T.alloc_fragment((MF,), F32)
            T.reduce_sum(g2_f, pb, dim=0)
            T.reduce_sum(ta_f, pa, dim=0)
            for j in T.Parallel(MF):
                part_bias[bx, j] = pb[j]
            for j in T.Parallel(MF):
                part_alpha[bx, j] = pa[j]

    return mhc_bwd_tok


def col_pipelined(n: int, D: int, dtype: str, tma: bool = True) -> bool:
    """bwd_col runs a (warp-specialized) TMA pipeline only where every copy of its loop is a TMA
    copy: x in bf16 column blocks of >= 64 features (narrower blocks of the swizzled tile have no
    valid TMA layout: compile error at n = 6), h_pre rows of 16-byte multiples. TileLang releases
    a stage after the last read of its TMA buffers only, so a plain copy among TMA ones is
    overwritten while still read (from the third tile of a split on)."""
    p = plan(n, D, dtype)
    return tma and X_PIECES[dtype] == 1 and p.BD >= 64 and (n * 4) % 16 == 0


def bwd_col_kernel(n: int, D: int, dtype: str, tma: bool = True):
    p = plan(n, D, dtype)
    nD, MF = n * D, p.MF
    BT2, BD, NC = p.BT2, p.BD, p.NC
    NX = X_PIECES[dtype]
    tma = col_pipelined(n, D, dtype, tma)
    nBD = n * BD
    Tn = T.dynamic("T")
    S = T.dynamic("S")
    # products of pieces kept: orders a + b <= 2 (the rest is below 2^-24 relative), smallest
    # first into each accumulator (the MMA's float32 adds truncate to the running sum's magnitude:
    # the large products go in last, as in the Triton backend's _dot_pp)
    vec_pairs = sorted(((a, b) for a in range(3) for b in range(3) if a + b <= 2), key=lambda ab: -(ab[0] + ab[1]))
    raw_pairs = sorted(((a, b) for a in range(NX) for b in range(3) if a + b <= 2), key=lambda ab: -(ab[0] + ab[1]))

    @T.prim_func
    def mhc_bwd_col(x: T.Tensor((Tn, nD), dtype), g_in: T.Tensor((Tn, D), dtype),
                    dhm: T.Tensor((Tn, MF), F32), coef: T.Tensor((Tn,), F32),
                    h_pre: T.Tensor((Tn, n), F32), QT: T.Tensor((3 * nD, MF), BF16),
                    gamma: T.Tensor((nD,), F32),
                    dx: T.Tensor((Tn, nD), dtype), part: T.Tensor((S, MF, nD), F32)):
        with T.Kernel(T.ceildiv(D, BD), S, threads=256) as (bd, bs):
            qs = [T.alloc_shared((NC, MF), BF16) for _ in range(3)]   # pieces of phi^T, K-major
            xs = T.alloc_shared((BT2, NC), dtype)
            xp = [xs] if NX == 1 else [T.alloc_shared((BT2, NC), BF16) for _ in range(NX)]
            gs = T.alloc_shared((BT2, BD), dtype)
            # dh_mix pieces: [BT2, MF] as the A operand of dvec, and transposed [MF, BT2] as the
            # K-major B operand of raw (wgmma rejects MN-major operands whose MN side is short)
            dmp = [T.alloc_shared((BT2, MF), BF16) for _ in range(3)]
            dmq = [T.alloc_shared((MF, BT2), BF16) for _ in range(3)]
            cf_s = T.alloc_shared((BT2,), F32)
            hp_s = T.alloc_shared((BT2, n), F32)
            gam_s = T.alloc_shared((NC,), F32)
            dvec = T.alloc_fragment((BT2, NC), F32)
            raw = T.alloc_fragment((NC, MF), F32)
            rblk = T.alloc_fragment((NC, MF), F32)
            d0 = bd * BD
            # this CTA's columns: c = k*BD + dd  <->  x[:, k, d0 + dd]; columns c >= n*BD are padding
            # (and lanes with d0 + dd >= D hold the next stream's data): none of them is stored
            # loaded once per CTA, element by element (a TMA copy of a [BD, MF] row block into
            # the swizzled tile has no valid layout when MF = 128)
            for b in list(range(3)):
                for c, m in T.Parallel(NC, MF):
                    qrow = b * nD + (c // BD) * D + d0 + c % BD
                    qs[b][c, m] = T.if_then_else(c < nBD, T.if_then_else(
                        qrow < 3 * nD, QT[T.min(qrow, 3 * nD - 1), m], T.cast(0, BF16)), T.cast(0, BF16))
            for c in T.Parallel(NC):
                col = (c // BD) * D + d0 + c % BD
                gam_s[c] = T.if_then_else(c < nBD, T.if_then_else(d0 + c % BD < D, gamma[T.min(col, nD - 1)],
                                                                  T.float32(0)), T.float32(0))
            T.clear(raw)
            per = T.ceildiv(Tn, BT2 * S)  # token tiles per split
            if p.stage_dm:
                dm_s = T.alloc_shared((BT2, MF), F32)
            # tma=False (col_pipelined): a plain loop (copies, then compute, synchronized per
            # tile). Not a pipeline: TileLang's cp.async pipeline over this dynamic-extent loop
            # fails in CUDA codegen ("Downcast from tirx.Sub to ir.IntImm"), and one with a TMA
            # copy among plain ones is warp-specialized with the stage released after the last
            # read of its TMA buffers only, while the plainly copied x, g_in, coef and h_pre of
            # that stage are still read (a race once a split has 3 or more tiles)
            for it in _tile_loop(per, p.col_stages, tma):
                t0 = (bs * per + it) * BT2
                if BD >= 32 and NX == 1:
                    for k in list(range(n)):
                        _copy(x[t0, k * D + d0], xs[0:BT2, k * BD:(k + 1) * BD], tma)
                elif BD >= 32:
                    # a TMA box into a column block of the float32 tile has no valid layout (BD = 32)
                    for k in list(range(n)):
                        T.copy(x[t0, k * D + d0], xs[0:BT2, k * BD:(k + 1) * BD],
                               annotations={"disable_tma": True})
                else:
                    # a [BT2, 16] block of the swizzled tile has no valid copy layout: element-wise
                    for i, c in T.Parallel(BT2, NC):
                        xrow = T.min(t0 + i, Tn - 1)
                        xcol = T.min((c // BD) * D + d0 + c % BD, nD - 1)
                        xs[i, c] = T.if_then_else(t0 + i < Tn, x[xrow, xcol], T.cast(0, dtype))
                _copy(g_in[t0, d0], gs, tma)
                if p.stage_dm:
                    _copy(dhm[t0, 0], dm_s, tma)
                _copy(coef[t0], cf_s, tma)
                _copy(h_pre[t0, 0], hp_s, tma)
                for i, m in T.Parallel(BT2, MF):
                    if p.stage_dm:
                        v = dm_s[i, m]
                    else:
                        v = T.if_then_else(t0 + i < Tn, dhm[T.min(t0 + i, Tn - 1), m], T.float32(0))
                    h = T.cast(v, BF16)
                    r = v - T.cast(h, F32)
                    lo = T.cast(r - T.cast(T.cast(r, BF16), F32), BF16)
                    dmp[0][i, m] = h
                    dmp[1][i, m] = T.cast(r, BF16)
                    dmp[2][i, m] = lo
                    dmq[0][m, i] = h
                    dmq[1][m, i] = T.cast(r, BF16)
                    dmq[2][m, i] = lo
                if NX > 1:
                    for i, c in T.Parallel(BT2, NC):
                        v = T.cast(xs[i, c], F32)
                        h = T.cast(v, BF16)
                        r = v - T.cast(h, F32)
                        xp[0][i, c] = h
                        xp[1][i, c] = T.cast(r, BF16)
                        if NX > 2:
                            xp[2][i, c] = T.cast(r - T.cast(T.cast(r, BF16), F32), BF16)
                T.clear(dvec)
                for a, b in vec_pairs:
                    T.gemm(dmp[a], qs[b], dvec, transpose_B=True)
                # per-tile partial from zero, added in float32 (see the forward's h_mix)
                for q, (a, b) in enumerate(raw_pairs):
                    T.gemm(xp[a], dmq[b], rblk, transpose_A=True, transpose_B=True, clear_accum=(q == 0))
                for c, m in T.Parallel(NC, MF):
                    raw[c, m] += rblk[c, m]
                for i, c in T.Parallel(BT2, NC):
                    k = c // BD
                    dd = c % BD
                    row = t0 + i
                    if c < nBD:
                        if d0 + dd < D:
                            if row < Tn:
                                dx[row, k * D + d0 + dd] = T.cast(
                                    dvec[i, c] * gam_s[c] - cf_s[i] * T.cast(xs[i, c], F32)
                                    + hp_s[i, k] * T.cast(gs[i, dd], F32), dtype)
            for c, m in T.Parallel(NC, MF):
                dd = c % BD
                if c < nBD:
                    if d0 + dd < D:
                        part[bs, m, (c // BD) * D + d0 + dd] = raw[c, m]

    return mhc_bwd_col


def fin_phi_kernel(n: int, D: int):
    nD, M, MF = n * D, n * n + 2 * n, m_frag(n)
    BC = 128
    S = T.dynamic("S")

    @T.prim_func
    def mhc_fin_phi(part: T.Tensor((S, MF, nD), F32), phi: T.Tensor((M, nD), F32),
                    gamma: T.Tensor((nD,), F32), dphi: T.Tensor((M, nD), F32),
                    dgamma: T.Tensor((nD,), F32)):
        with T.Kernel(T.ceildiv(nD, BC), threads=128) as bx:
            acc = T.alloc_fragment((MF, BC), F32)
            pr = T.alloc_fragment((MF, BC), F32)
            T.clear(acc)
            for s in T.serial(S):
                for m, c in T.Parallel(MF, BC):
                    col = bx * BC + c
                    acc[m, c] += T.if_then_else(col < nD, part[s, m, T.min(col, nD - 1)], T.float32(0))
            for m, c in T.Parallel(MF, BC):
                col = bx * BC + c
                colc = T.min(col, nD - 1)
                pr[m, c] = T.if_then_else(m < M, phi[T.min(m, M - 1), colc], T.float32(0)) * acc[m, c]
                if m < M:
                    if col < nD:
                        dphi[m, col] = acc[m, c] * gamma[col]
            dg = T.alloc_fragment((BC,), F32)
            T.reduce_sum(pr, dg, dim=0)
            for c in T.Parallel(BC):
                if bx * BC + c < nD:
                    dgamma[bx * BC + c] = dg[c]

    return mhc_fin_phi


def fin_small_kernel(n: int):
    M, MF = n * n + 2 * n, m_frag(n)
    RB = 32
    NB = T.dynamic("NB")

    @T.prim_func
    def mhc_fin_small(part_bias: T.Tensor((NB, MF), F32), part_alpha: T.Tensor((NB, MF), F32),
                      dbias: T.Tensor((M,), F32), dalpha: T.Tensor((3,), F32)):
        with T.Kernel(1, threads=128) as bx:  # noqa: F841  (one block: the partials are few)
            ab = T.alloc_fragment((RB, MF), F32)
            aa = T.alloc_fragment((RB, MF), F32)
            T.clear(ab)
            T.clear(aa)
            for bo in T.serial(T.ceildiv(NB, RB)):
                for r, j in T.Parallel(RB, MF):
                    b = bo * RB + r
                    ab[r, j] += T.if_then_else(b < NB, part_bias[T.min(b, NB - 1), j], T.float32(0))
                    aa[r, j] += T.if_then_else(b < NB, part_alpha[T.min(b, NB - 1), j], T.float32(0))
            rb = T.alloc_fragment((MF,), F32)
            ra = T.alloc_fragment((MF,), F32)
            T.reduce_sum(ab, rb, dim=0)
            T.reduce_sum(aa, ra, dim=0)
            ra_s = T.alloc_shared((MF,), F32)
            for j in T.Parallel(MF):
                ra_s[j] = ra[j]
                if j < M:
                    dbias[j] = rb[j]
            g3 = T.alloc_fragment((4, MF), F32)
            for g, j in T.Parallel(4, MF):
                grp = T.if_then_else(j < n, 0, T.if_then_else(j < 2 * n, 1, T.if_then_else(j < M, 2, 3)))
                g3[g, j] = T.if_then_else(grp == g, ra_s[j], T.float32(0))
            r3 = T.alloc_fragment((4,), F32)
            T.reduce_sum(g3, r3, dim=1)
            for g in T.Parallel(4):
                if g < 3:
                    dalpha[g] = r3[g]

    return mhc_fin_small


def kernel_funcs(n: int, D: int, dtype: str, norm_eps: float = 1e-6, hc_eps: float = 1e-6,
                 post_mult: float = 2.0, tma: bool | None = None) -> dict:
    """Every prim_func the backend launches for one (n, D, dtype), by name."""
    tma = use_tma(n, D, dtype) if tma is None else tma
    return {
        "prep": prep_kernel(n, D),
        "fwd": fwd_kernel(n, D, dtype, norm_eps, hc_eps, post_mult, tma),
        "bwd_tok": bwd_tok_kernel(n, D, dtype, hc_eps, post_mult, tma),
        "bwd_col": bwd_col_kernel(n, D, dtype, tma),
        "fin_phi": fin_phi_kernel(n, D),
        "fin_small": fin_small_kernel(n),
    }
