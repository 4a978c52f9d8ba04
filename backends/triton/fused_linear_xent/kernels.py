"""Triton kernels of the fused linear cross-entropy (docs/specs/fused_linear_xent.md).

Naming: T tokens (rows of hidden), V vocabulary entries (rows of weight), H hidden features.
GEMM kernels share one main loop (``_mm``) and differ in their epilogues: logits with online-LSE
partials (``_logits_kernel``), logits turned straight into dZ (``_dz_gemm_kernel``, lean mode),
``dweight = dZ^T @ hidden`` (``_dw_kernel``) and ``dhidden = dZ @ weight`` (``_dh_kernel``).
All accumulation is float32; dZ is rounded to the input dtype only as a GEMM operand.

The fast mode keeps a chunk's logits in a [C, V] buffer and overwrites it in place with dZ in the
input dtype. With 16-bit inputs the buffer is float16 and holds z - m, m the float32 max of the
logits tile (the online-LSE partial, kept anyway): the entries whose softmax matters have z - m near
0, where float16 keeps 11 bits of z - m, while dZ itself is then rounded to the 8 or 11 bits of the
GEMM dtype (see _dz_chunk_kernel). Half the bytes of float32 logits: twice the tokens per chunk in
the same memory, so half the float32 dweight read-modify-write passes.
"""

import triton
import triton.language as tl


@triton.jit
def _tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """Grouped tile order: GROUP row blocks walk the column blocks together (L2 reuse).

    GEMM kernels take one tile per program, with no loop over tiles: the logits kernel wrapped in a
    one-trip tile loop (kept for a persistent option) took 16.67 ms where the same chains without it
    took 15.94 ms, bitwise equal (H100, N=8192, H=4096, V=128256 bf16, .ci/flx-logits-ab); persistent
    grids had measured slower (the dweight running-sum read stalls each tile; logits 49.5 against
    44.2 ms for the held fast mode's fwd+bwd, .ci/flx-ab)."""
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    width = GROUP * n_n
    first = (pid // width) * GROUP
    size = tl.minimum(n_m - first, GROUP)
    pid_m = first + (pid % width) % size
    pid_n = (pid % width) // size
    return pid_m, pid_n


@triton.jit
def _mm(a_ptr, b_ptr, rm, rn, M, N, K, s_am, s_ak, s_bk, s_bn, acc,
        BK: tl.constexpr, EVEN_K: tl.constexpr, PREC: tl.constexpr, KS: tl.constexpr = 0):
    """acc += A[rm, :K] @ B[:K, rn] with float32 accumulation.

    float32 operands: ieee dots are FMA chains, and one chain over K = V (~1e5 terms) would carry
    sqrt(K) roundings; each BK tile is summed on its own and added to a mid accumulator flushed
    every KMID tiles, so the longest chain is BK + KMID + K / (BK * KMID) additions. The tile's
    partial is added with an fma(x, 1, y) (one rounding, as an add): Triton's combiner rewrites
    ``y + dot(a, b)`` into ``dot(a, b, y)``, which would make the mid accumulator the dot's and
    the chain KMID * BK long again (seen on an H200: fp32 dhidden at 1.13x its rms bound, V=1025).

    16-bit operands: tensor-core dots (wgmma) chain the accumulator through every K step, and
    Hopper adds each MMA's products into it truncated, not rounded to nearest: the bias grows with
    the number of steps times ulp(acc). KS > 0 splits the chain: KS tiles go into a fresh mid
    accumulator, added to acc in float32 with round-to-nearest (for the logits, whose fp32 loss and
    LSE see that bias: fp16 loss at N=1, H=4096 was at 1.0x its bound).
    """
    rk = tl.arange(0, BK)
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * s_bn
    mask_m = rm[:, None] < M
    mask_n = rn[None, :] < N
    if a_ptr.dtype.element_ty == tl.float32:
        KMID: tl.constexpr = 32
        for k1 in range(0, K, BK * KMID):
            mid = tl.zeros_like(acc)
            for k0 in range(k1, tl.minimum(k1 + BK * KMID, K), BK):
                a, b = _mm_load(a_rows, b_cols, rk, k0, K, s_ak, s_bk, mask_m, mask_n, EVEN_K)
                mid = tl.fma(tl.dot(a, b, input_precision=PREC), 1.0, mid)
            acc += mid
    elif KS > 0:
        # one flat loop (a nested KS-tile loop defeats the software pipeline: 56.5 vs 53.2 ms for
        # fwd+bwd at N=8192, H=4096, V=128256 on an H200); the flush branch is uniform
        mid = tl.zeros_like(acc)
        for k0 in range(0, K, BK):
            a, b = _mm_load(a_rows, b_cols, rk, k0, K, s_ak, s_bk, mask_m, mask_n, EVEN_K)
            acc, mid = _chain_step(acc, tl.dot(a, b, mid, input_precision=PREC), k0, BK, KS)
        acc += mid
    else:
        for k0 in range(0, K, BK):
            a, b = _mm_load(a_rows, b_cols, rk, k0, K, s_ak, s_bk, mask_m, mask_n, EVEN_K)
            acc = tl.dot(a, b, acc, input_precision=PREC)
    return acc


@triton.jit
def _chain_step(acc, mid, k0, BK: tl.constexpr, KS: tl.constexpr):
    """After the K tile at k0: the chain of KS tiles in ``mid`` ends, and its sum goes into ``acc`` in
    float32 round-to-nearest (see _mm)."""
    if (k0 // BK) % KS == KS - 1:
        acc += mid
        mid = tl.zeros_like(acc)
    return acc, mid


@triton.jit
def _mm_tma(a_desc, b_desc, off_m, off_n, K, acc, BK: tl.constexpr, KS: tl.constexpr = 0):
    """acc += A[off_m:, :K] @ B[off_n:, :K]^T with 16-bit operands read through TMA tensor descriptors
    (rows contiguous): the copy engine fills shared memory, and its zero padding masks the edges. The
    products and the chains are those of _mm (bitwise-equal logits); KS: see _mm. Measured on an H100,
    logits of a 2048-token chunk, H=4096, V=128256, bf16, 128x128x64 KS=4: 4.19 ms against 4.89 ms
    with pointer loads (.scratch/logits_tma.py)."""
    if KS > 0:
        mid = tl.zeros_like(acc)
        for k0 in range(0, K, BK):
            acc, mid = _chain_step(acc, tl.dot(a_desc.load([off_m, k0]), b_desc.load([off_n, k0]).T, mid), k0, BK, KS)
        acc += mid
    else:
        for k0 in range(0, K, BK):
            acc = tl.dot(a_desc.load([off_m, k0]), b_desc.load([off_n, k0]).T, acc)
    return acc


@triton.jit
def _mm_load(a_rows, b_cols, rk, k0, K, s_ak, s_bk, mask_m, mask_n, EVEN_K: tl.constexpr):
    if EVEN_K:
        a = tl.load(a_rows + (k0 + rk)[None, :] * s_ak, mask=mask_m, other=0.0)
        b = tl.load(b_cols + (k0 + rk)[:, None] * s_bk, mask=mask_n, other=0.0)
    else:
        a = tl.load(a_rows + (k0 + rk)[None, :] * s_ak, mask=mask_m & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_cols + (k0 + rk)[:, None] * s_bk, mask=mask_n & ((k0 + rk)[:, None] < K), other=0.0)
    return a, b


@triton.jit
def _softcap(x, cap):
    """cap * tanh(x / cap); the series below |u| = 1/4 keeps full relative precision there,
    where 1 - exp(-2|u|) would cancel (libdevice.tanh is not available in the interpreter)."""
    u = x / cap
    au = tl.abs(u)
    e = tl.exp(-2.0 * au)
    u2 = u * u
    series = au * (1.0 + u2 * (-1.0 / 3.0 + u2 * (2.0 / 15.0 + u2 * (-17.0 / 315.0 + u2 * (62.0 / 2835.0)))))
    t = tl.where(au < 0.25, series, (1.0 - e) / (1.0 + e))
    return cap * tl.where(u < 0, -t, t)


@triton.jit
def _logits(acc, b_ptr, rn, V, s_b, cap, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn * s_b, mask=rn < V, other=0.0).to(tl.float32)[None, :]
    if SOFTCAP:
        acc = _softcap(acc, cap)
    return acc


@triton.jit
def _row_coef(rows, rmask, y_ptr, s_y, g_ptr, s_g, den_ptr, glse_ptr, s_gl, ignore_index,
              G_ROWS: tl.constexpr, SCALED: tl.constexpr, HAS_GLSE: tl.constexpr):
    """Targets, loss-path factor mu_i * g_i / D and LSE upstream gradient of a block of rows.

    SCALED=False leaves g / D out (mean/sum with a scalar g): the finished float32 sums are scaled
    once instead, which also keeps 16-bit dZ clear of underflow when D is large.
    """
    y = tl.load(y_ptr + rows * s_y, mask=rmask, other=ignore_index)
    valid = (y != ignore_index) & rmask
    if SCALED:
        den = tl.load(den_ptr)
        if G_ROWS:
            g = tl.load(g_ptr + rows * s_g, mask=rmask, other=0.0).to(tl.float32)
        else:
            g = tl.load(g_ptr).to(tl.float32)
        # D = 0 (every token ignored under mean): the gradient is exactly 0, not 0 * inf
        coef = tl.where(valid, tl.where(den > 0, g / den, 0.0), 0.0)
    else:
        coef = tl.where(valid, 1.0, 0.0)
    if HAS_GLSE:
        gl = tl.load(glse_ptr + rows * s_gl, mask=rmask, other=0.0).to(tl.float32)
    else:
        gl = tl.zeros_like(coef)
    return y, coef, gl


@triton.jit
def _dz(z, cols, y, lse, coef, gl, eps, lam, inv_v, cap, SOFTCAP: tl.constexpr):
    """dZ of docs/specs/softmax_xent.md for a tile of (softcapped) logits, then through the softcap."""
    p = tl.exp(z - lse[:, None])
    a = coef * (1.0 + 2.0 * lam * lse) + gl
    hit = cols[None, :] == y[:, None]
    # the true-class term is subtracted in float32, before any rounding (p_y -> 1 cancels)
    dz = a[:, None] * p - tl.where(hit, (coef * (1.0 - eps))[:, None], 0.0) - (coef * eps * inv_v)[:, None]
    if SOFTCAP:
        t = z / cap
        dz = dz * (1.0 - t * t)
    return dz


@triton.jit
def _logits_kernel(h_ptr, w_ptr, b_ptr, y_ptr, z_ptr, pm_ptr, ps_ptr, pz_ptr, zy_ptr,
                   T, V, H, s_ht, s_hk, s_wv, s_wk, s_b, s_y, s_zt, s_p, cap,
                   HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, STORE_Z: tl.constexpr,
                   EVEN_K: tl.constexpr, PREC: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                   KS: tl.constexpr, TMA: tl.constexpr = False, SMOOTH: tl.constexpr = True):
    """Logits tile z = h @ W^T (+ bias, softcap): per-row max, sum-exp and (SMOOTH: label smoothing's) sum
    of z over the tile, the target logit, and (fast mode) the logits themselves: float32, or into a
    float16 z_ptr as z minus the tile's row max (module doc). KS: see _mm (split chain).
    TMA: h_ptr and w_ptr are tensor descriptors (_mm_tma)."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), T, V, BM, BN, GROUP)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        acc = _mm_tma(h_ptr, w_ptr, pid_m * BM, pid_n * BN, H, acc, BK, KS)
    else:
        acc = _mm(h_ptr, w_ptr, rm, rn, T, V, H, s_ht, s_hk, s_wk, s_wv, acc, BK, EVEN_K, PREC, KS)
    z = _logits(acc, b_ptr, rn, V, s_b, cap, HAS_BIAS, SOFTCAP)
    rmask = rm < T
    cmask = rn < V
    mask = rmask[:, None] & cmask[None, :]
    zm = tl.where(cmask[None, :], z, float("-inf"))
    m = tl.max(zm, 1)
    if STORE_Z:
        zs = z
        if z_ptr.dtype.element_ty == tl.float16:
            zs = z - m[:, None]
        tl.store(z_ptr + rm.to(tl.int64)[:, None] * s_zt + rn[None, :], zs.to(z_ptr.dtype.element_ty), mask=mask)
    # r: the sum of exp(z - m) over the tile but one max entry (the other ties count 1 each), kept apart from
    # that entry's 1 so that a confident row's loss log1p(r) keeps its digits (_row_stats_kernel)
    top = zm == m[:, None]
    s = tl.sum(tl.where(top, 0.0, tl.exp(zm - m[:, None])), 1) + (tl.sum(top.to(tl.float32), 1) - 1.0)
    if SMOOTH:
        sz = tl.sum(tl.where(cmask[None, :], z, 0.0), 1)
        tl.store(pz_ptr + rm.to(tl.int64) * s_p + pid_n, sz, mask=rmask)
    poff = rm.to(tl.int64) * s_p + pid_n
    tl.store(pm_ptr + poff, m, mask=rmask)
    tl.store(ps_ptr + poff, s, mask=rmask)
    y = tl.load(y_ptr + rm * s_y, mask=rmask, other=-1)
    zy = tl.sum(tl.where(rn[None, :] == y[:, None], z, 0.0), 1)
    mine = rmask & (y >= pid_n * BN) & (y < pid_n * BN + BN) & (y < V)
    tl.store(zy_ptr + rm, zy, mask=mine)


@triton.jit
def _log1p(r):
    """log(1 + r) to float32's relative precision for r >= 0 (Kahan's: the rounding of 1 + r divided out), from
    tl.log alone: libdevice's log1p is not available in the interpreter."""
    u = 1.0 + r
    exact = u == 1.0
    return tl.where(exact, r, tl.log(u) * (r / tl.where(exact, 1.0, u - 1.0)))


@triton.jit
def _row_stats_kernel(pm_ptr, ps_ptr, pz_ptr, zy_ptr, y_ptr, lse_ptr, lt_ptr, T, NT, s_p, s_y,
                      ignore_index, eps, lam, inv_v, BR: tl.constexpr, BT: tl.constexpr, SMOOTH: tl.constexpr = True):
    """Combines the per-tile partials of rows into LSE_i and the masked per-token loss mu_i * l_i.

    A row's sum of exp(z - m) is carried as 1 + r, r without the max entry's 1 (the tiles' partials are r
    too): LSE = m + log1p(r), and the loss (1-eps) ((m - z_y) + log1p(r)) + eps ((m - mean z) + log1p(r)),
    so that a confident row (r ~ 1e-10) keeps its loss log1p(r), which m + log(1 + r) - z_y rounds to 0."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = rows < T
    m = tl.full((BR,), float("-inf"), tl.float32)
    r = tl.zeros((BR,), dtype=tl.float32)
    sz = tl.zeros((BR,), dtype=tl.float32)
    for t0 in range(0, NT, BT):
        cols = t0 + tl.arange(0, BT)
        mask = rmask[:, None] & (cols[None, :] < NT)
        off = rows.to(tl.int64)[:, None] * s_p + cols[None, :]
        pm = tl.load(pm_ptr + off, mask=mask, other=float("-inf"))
        pr = tl.load(ps_ptr + off, mask=mask, other=0.0)
        if SMOOTH:
            sz += tl.sum(tl.load(pz_ptr + off, mask=mask, other=0.0), 1)
        top = tl.max(pm, 1)
        m_new = tl.maximum(m, top)
        # rows past T stay at -inf; keep their exponents finite instead of NaN
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        # the one term whose max is m_new keeps its r alone (its 1 is the 1 of 1 + r): the running sum where
        # it holds the max, else the first tile at the max
        kept = m >= top
        first = tl.argmax(pm, 1)
        star = (cols[None, :] == (t0 + first)[:, None]) & (~kept)[:, None]
        tiles = tl.where(star, pr, (1.0 + pr) * tl.exp(pm - m_ref[:, None]))
        r = tl.where(kept, r, (1.0 + r) * tl.exp(m - m_ref)) + tl.sum(tiles, 1)
        m = m_new
    log_s = _log1p(r)
    lse = m + log_s
    y = tl.load(y_ptr + rows * s_y, mask=rmask, other=ignore_index)
    valid = (y != ignore_index) & rmask
    zy = tl.load(zy_ptr + rows, mask=valid, other=0.0)
    loss = (1.0 - eps) * ((m - zy) + log_s) + eps * ((m - inv_v * sz) + log_s) + lam * lse * lse
    tl.store(lse_ptr + rows, lse, mask=rmask)
    tl.store(lt_ptr + rows, tl.where(valid, loss, 0.0), mask=rmask)


@triton.jit
def _loss_kernel(lt_ptr, y_ptr, out_ptr, den_ptr, T, s_y, ignore_index, norm,
                 MEAN: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK: tl.constexpr):
    """Deterministic reduction of the per-token losses; also stores the divisor D for the backward."""
    tot = tl.zeros((BLOCK,), dtype=tl.float32)
    cnt = tl.zeros((BLOCK,), dtype=tl.float32)
    for t0 in range(0, T, BLOCK):
        rows = t0 + tl.arange(0, BLOCK)
        rmask = rows < T
        tot += tl.load(lt_ptr + rows, mask=rmask, other=0.0)
        y = tl.load(y_ptr + rows * s_y, mask=rmask, other=ignore_index)
        cnt += tl.where(y != ignore_index, 1.0, 0.0)
    if MEAN:
        if HAS_NORM:
            den = norm
        else:
            den = tl.sum(cnt, 0)
    else:
        den = 1.0
    # every token ignored under mean: 0 / 0 = NaN, as torch does
    tl.store(out_ptr, tl.sum(tot, 0) / den)
    tl.store(den_ptr, den)


@triton.jit
def _dz_chunk_kernel(z_ptr, pm_ptr, dz_ptr, y_ptr, lse_ptr, g_ptr, glse_ptr, den_ptr, dbp_ptr,
                     T, V, s_zt, s_p, s_dzt, s_y, s_g, s_gl, s_dbp, ignore_index, eps, lam, inv_v, cap,
                     G_ROWS: tl.constexpr, SCALED: tl.constexpr, HAS_GLSE: tl.constexpr,
                     SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, ZBN: tl.constexpr,
                     BR: tl.constexpr, BV: tl.constexpr, RB: tl.constexpr):
    """Fast mode: logits -> dZ in the GEMM dtype, in place (see module doc), for RB blocks of BR rows;
    with a bias, also the column sums of their float32 dZ (one partial row per program: RB blocks
    of rows share it, so the partials of a whole batch's logits stay small). A float16 z holds
    z - m, m the row max of the logits tile (ZBN wide) in pm; dZ's error from it is (m - z) * 2^-11
    relative (p is at most e^(z - m) of the row's largest entry, so at most e^-1 * 2^-11 of that
    entry), where dZ is then rounded to 2^-8 (bf16) or 2^-11 (fp16) of each entry anyway."""
    pid_r = tl.program_id(0)
    pid_v = tl.program_id(1)
    cols = pid_v * BV + tl.arange(0, BV)
    cmask = cols < V
    colsum = tl.zeros((BV,), dtype=tl.float32)
    for rb in range(RB):
        rows = (pid_r * RB + rb) * BR + tl.arange(0, BR)
        rmask = rows < T
        mask = rmask[:, None] & cmask[None, :]
        z = tl.load(z_ptr + rows.to(tl.int64)[:, None] * s_zt + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if z_ptr.dtype.element_ty == tl.float16:
            p_rows = pm_ptr + rows.to(tl.int64) * s_p
            if BV == ZBN:  # one logits tile across: its row max is one value per row
                z += tl.load(p_rows + pid_v, mask=rmask, other=0.0)[:, None]
            else:
                z += tl.load(p_rows[:, None] + (cols // ZBN)[None, :], mask=mask, other=0.0)
        lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
        y, coef, gl = _row_coef(rows, rmask, y_ptr, s_y, g_ptr, s_g, den_ptr, glse_ptr, s_gl, ignore_index,
                                G_ROWS, SCALED, HAS_GLSE)
        dz = tl.where(mask, _dz(z, cols, y, lse, coef, gl, eps, lam, inv_v, cap, SOFTCAP), 0.0)
        if HAS_BIAS:
            colsum += tl.sum(dz, 0)
        # dZ overwrites this tile's own logits: every thread must have read them first
        tl.debug_barrier()
        tl.store(dz_ptr + rows.to(tl.int64)[:, None] * s_dzt + cols[None, :], dz.to(dz_ptr.dtype.element_ty),
                 mask=mask)
    if HAS_BIAS:
        tl.store(dbp_ptr + pid_r * s_dbp + cols, colsum, mask=cmask)


@triton.jit
def _dz_gemm_kernel(h_ptr, w_ptr, b_ptr, y_ptr, lse_ptr, zy_ptr, g_ptr, glse_ptr, den_ptr, dz_ptr, dbp_ptr,
                    T, V, H, v_off, s_ht, s_hk, s_wv, s_wk, s_b, s_y, s_g, s_gl, s_dzt, s_dbp,
                    ignore_index, eps, lam, inv_v, cap,
                    G_ROWS: tl.constexpr, SCALED: tl.constexpr, HAS_GLSE: tl.constexpr,
                    HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_K: tl.constexpr, PREC: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                    TMA: tl.constexpr = False):
    """Lean mode: logits of a vocabulary slab recomputed and turned into dZ in the epilogue
    (LSE known from the forward); with a bias, column sums of this row block's float32 dZ.
    The target's logit is the forward's (zy_ptr), not the recomputed one: this GEMM's chain rounds otherwise
    than the one the LSE came from, by ~1e-5 at logits of 30, and at a confident token p_y - 1 =
    exp(z_y - LSE) - 1 (~-1e-10) would be that difference.
    TMA: h_ptr and w_ptr are tensor descriptors (_mm_tma)."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), T, V, BM, BN, GROUP)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        acc = _mm_tma(h_ptr, w_ptr, pid_m * BM, pid_n * BN, H, acc, BK)
    else:
        acc = _mm(h_ptr, w_ptr, rm, rn, T, V, H, s_ht, s_hk, s_wk, s_wv, acc, BK, EVEN_K, PREC)
    z = _logits(acc, b_ptr, rn, V, s_b, cap, HAS_BIAS, SOFTCAP)
    rmask = rm < T
    mask = rmask[:, None] & (rn[None, :] < V)
    lse = tl.load(lse_ptr + rm, mask=rmask, other=0.0)
    y, coef, gl = _row_coef(rm, rmask, y_ptr, s_y, g_ptr, s_g, den_ptr, glse_ptr, s_gl, ignore_index,
                            G_ROWS, SCALED, HAS_GLSE)
    mine = rmask & (y >= v_off + pid_n * BN) & (y < v_off + pid_n * BN + BN)
    zy = tl.load(zy_ptr + rm, mask=mine, other=0.0)
    z = tl.where((rn + v_off)[None, :] == y[:, None], zy[:, None], z)
    dz = tl.where(mask, _dz(z, rn + v_off, y, lse, coef, gl, eps, lam, inv_v, cap, SOFTCAP), 0.0)
    if HAS_BIAS:
        tl.store(dbp_ptr + pid_m * s_dbp + rn, tl.sum(dz, 0), mask=rn < V)
    tl.store(dz_ptr + rm.to(tl.int64)[:, None] * s_dzt + rn[None, :], dz.to(dz_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale(g_ptr, den_ptr, APPLY_G: tl.constexpr):
    """g / D for results computed with the loss gradient folded out (0 when D = 0)."""
    if APPLY_G:
        den = tl.load(den_ptr)
        return tl.where(den > 0, tl.load(g_ptr).to(tl.float32) / den, 0.0)
    else:
        return 1.0


@triton.jit
def _dw_kernel(dz_ptr, h_ptr, acc_ptr, out_ptr, g_ptr, den_ptr, V, H, T, s_dzt, s_ht, s_hk, s_acc, s_out,
               MODE: tl.constexpr, APPLY_G: tl.constexpr, EVEN_K: tl.constexpr,
               PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
               TMA: tl.constexpr = False):
    """dweight tile = dZ^T @ hidden over T tokens. MODE 0: store into the float32 accumulator,
    1: add to it (later chunks), 2: finished here, scaled and stored in the output dtype.
    TMA: dz_ptr and h_ptr are tensor descriptors of [BK, BM] and [BK, BN] blocks."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), V, H, BM, BN, GROUP)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < V) & (rn[None, :] < H)
    offs = rm.to(tl.int64)[:, None] * s_acc + rn[None, :]
    if MODE == 1:
        # the running sum is read before the main loop, which hides the read's latency (adding
        # it after the loop, in float32 round-to-nearest, measured 3% slower on an H200)
        acc = tl.load(acc_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        for k0 in range(0, T, BK):  # the descriptors' zero padding masks the tokens past T
            acc = tl.dot(dz_ptr.load([k0, pid_m * BM]).T, h_ptr.load([k0, pid_n * BN]), acc)
    else:
        acc = _mm(dz_ptr, h_ptr, rm, rn, V, H, T, 1, s_dzt, s_ht, s_hk, acc, BK, EVEN_K, PREC)
    if MODE == 2:
        acc = acc * _scale(g_ptr, den_ptr, APPLY_G)
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * s_out + rn[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(acc_ptr + offs, acc.to(acc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dh_kernel(dz_ptr, w_ptr, acc_ptr, out_ptr, g_ptr, den_ptr, T, H, V, s_dzt, s_wv, s_wk, s_acc, s_out,
               MODE: tl.constexpr, APPLY_G: tl.constexpr, EVEN_K: tl.constexpr,
               PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
               TMA: tl.constexpr = False):
    """dhidden tile = dZ @ weight over V vocabulary entries. MODE 0: store float32, 1: add to the
    float32 accumulator, 2: scaled into the output, 3: accumulator + this tile, scaled into the output.
    TMA: dz_ptr and w_ptr are tensor descriptors of [BM, BK] and [BK, BN] blocks."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), T, H, BM, BN, GROUP)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < T) & (rn[None, :] < H)
    offs = rm.to(tl.int64)[:, None] * s_acc + rn[None, :]
    if MODE == 1 or MODE == 3:
        acc = tl.load(acc_ptr + offs, mask=mask, other=0.0)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    if TMA:
        for k0 in range(0, V, BK):
            acc = tl.dot(dz_ptr.load([pid_m * BM, k0]), w_ptr.load([k0, pid_n * BN]), acc)
    else:
        acc = _mm(dz_ptr, w_ptr, rm, rn, T, H, V, s_dzt, 1, s_wv, s_wk, acc, BK, EVEN_K, PREC)
    if MODE >= 2:
        acc = acc * _scale(g_ptr, den_ptr, APPLY_G)
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * s_out + rn[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(acc_ptr + offs, acc, mask=mask)


@triton.jit
def _colsum_kernel(part_ptr, acc_ptr, R, V, s_p, ACCUM: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    """dbias partials [R, V] summed over their rows into a float32 accumulator, in a fixed order."""
    cols = tl.program_id(0) * BV + tl.arange(0, BV)
    cmask = cols < V
    tot = tl.zeros((BV,), dtype=tl.float32)
    for r0 in range(0, R, BR):
        rows = r0 + tl.arange(0, BR)
        mask = (rows[:, None] < R) & cmask[None, :]
        tot += tl.sum(tl.load(part_ptr + rows.to(tl.int64)[:, None] * s_p + cols[None, :], mask=mask, other=0.0), 0)
    if ACCUM:
        tot += tl.load(acc_ptr + cols, mask=cmask, other=0.0)
    tl.store(acc_ptr + cols, tot, mask=cmask)


@triton.jit
def _cast_kernel(src_ptr, dst_ptr, n, g_ptr, den_ptr, APPLY_G: tl.constexpr, BLOCK: tl.constexpr):
    """dst = src * (g / D) in dst's dtype: float32 accumulators into the returned gradients."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32) * _scale(g_ptr, den_ptr, APPLY_G)
    tl.store(dst_ptr + offs, x.to(dst_ptr.dtype.element_ty), mask=mask)
