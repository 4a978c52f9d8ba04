"""Triton kernels of ``lazy_attention`` (docs/specs/lazy_attention.md).

Scores are kept in log2 units, s2 = log2(e) * (scale q.k + bias[i-j]), so every exponential is an
exp2; ``LSE`` stores lse2 = log2(sum_j 2^s2) (float32) for the backward. Each key/query loop is split
in three ranges of blocks: far from the diagonal (distance >= W everywhere: no bias gather, no mask),
inside the bias table (gather bias by distance), and on the diagonal (gather + causal mask).

Forward: ``_lazy_fwd_lse_kernel`` (the LSE pass per query block, head and batch), then
``_lazy_fwd_kernel`` (the output pass).

Backward: ``_lazy_bwd_delta_kernel`` (per query block: Delta_i = sum_j p dp from float32 p and dp so that
dbias and dtau keep float32 accuracy with 16-bit inputs, the query block's share of dtau, and dq from two more
GEMMs in the same pass, see ``_delta_range``), then ``_lazy_bwd_dkdv_kernel`` (per key block: dk, dv and a
partial row of dbias). ``_lazy_bwd_reduce_kernel`` sums the partial rows (deterministic, one add per output
element). Nothing of size L*L is stored. Every tensor is addressed with its own strides, dO's head stride
included.

What the bias cost (H100, bf16, B=4, H=16, L=4096, Dh=128, torch.profiler, on the kernels from before dq
moved into the Delta pass): W = 512 against W = 1 added about 1.06 ms to fwd+bwd, 0.3 in the forward, 0.59
in the dq kernel of then (0.16 of it the diagonal sums of dbias), 0.13 in dk/dv and 0.07 in Delta.
Reading it from a Toeplitz table (contiguous loads from L2, pipelined) instead of the gather made the
forward 0.05 ms faster and the backward 0.35 ms slower (branch lazy-bias-table).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _load_rows(base, offs, s_row, s_col, offs_d, L):
    return tl.load(base + offs[:, None] * s_row + offs_d[None, :] * s_col, mask=offs[:, None] < L, other=0.0)


@triton.jit
def _bias_tile(bias_row, sbw, dist, W):
    # bias by distance i - j; 0 outside the table (W is not a window: attention stays causal)
    return tl.load(bias_row + dist * sbw, mask=(dist >= 0) & (dist < W), other=0.0)


@triton.jit
def _scores(q, k, offs_m, offs_n, bias_row, sbw, W, qk_scale, BIAS: tl.constexpr, PREC: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if BIAS:
        s += _bias_tile(bias_row, sbw, offs_m[:, None] - offs_n[None, :], W) * LOG2E
    return s


@triton.jit
def _fwd_lse_range(q, k_base, skl, skd, bias_row, sbw, offs_m, offs_d, m_i, l_i, lo, hi, L, W, qk_scale,
                   BLOCK_N: tl.constexpr, BIAS: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, skl, skd, offs_d, L)
        s = _scores(q, k, offs_m, offs_n, bias_row, sbw, W, qk_scale, BIAS, PREC)
        if CAUSAL:
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _fwd_out_range(q, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, acc,
                   lo, hi, L, W, qk_scale, BLOCK_N: tl.constexpr, BIAS: tl.constexpr, CAUSAL: tl.constexpr,
                   PREC: tl.constexpr):
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, skl, skd, offs_d, L)
        v = _load_rows(v_base, offs_n, svl, svd, offs_d, L)
        s = _scores(q, k, offs_m, offs_n, bias_row, sbw, W, qk_scale, BIAS, PREC)
        p = tl.exp2(s - lse2[:, None])
        keep = p + c[:, None] > 0
        if CAUSAL:
            # with tau > 0, p + c = c > 0 above the diagonal: the mask applies to e as well
            causal = offs_n[None, :] <= offs_m[:, None]
            p = tl.where(causal, p, 0.0)
            keep = keep & causal
        e = tl.where(keep, p + c[:, None], 0.0)
        acc = tl.dot(e.to(v.dtype), v, acc, input_precision=PREC)
    return acc


@triton.jit
def _query_block(BLOCK: tl.constexpr, DH: tl.constexpr):
    """This program's query block of a (query block, head, batch) grid: its index, head h, batch b, first
    row m0, the BLOCK row offsets and the DH feature offsets."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    m0 = pid_m * BLOCK
    return pid_m, h, b, m0, m0 + tl.arange(0, BLOCK), tl.arange(0, DH)


@triton.jit
def _lazy_fwd_lse_kernel(Q, K, Bias, LSE, sqb, sqh, sql, sqd, skb, skh, skl, skd, sbh, sbw, H, L, W, qk_scale,
                         DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, PREC: tl.constexpr):
    # The LSE pass, a kernel of its own: without the output accumulator it needs far fewer registers
    # than the output pass, so more programs share an SM (and it takes its own tile shape).
    pid_m, h, b, m0, offs_m, offs_d = _query_block(BLOCK_M, DH)
    q = _load_rows(Q + b * sqb + h * sqh, offs_m, sql, sqd, offs_d, L)
    k_base = K + b * skb + h * skh
    bias_row = Bias + h * sbh
    hi = tl.minimum(m0 + BLOCK_M, L)
    first_bias = tl.maximum(m0 - W + 1, 0)                        # keys below: distance >= W for every row
    bias_l = (first_bias // BLOCK_L) * BLOCK_L
    diag_l = (m0 // BLOCK_L) * BLOCK_L
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i, l_i = _fwd_lse_range(q, k_base, skl, skd, bias_row, sbw, offs_m, offs_d, m_i, l_i, 0, bias_l,
                              L, W, qk_scale, BLOCK_L, False, False, PREC)
    m_i, l_i = _fwd_lse_range(q, k_base, skl, skd, bias_row, sbw, offs_m, offs_d, m_i, l_i, bias_l, diag_l,
                              L, W, qk_scale, BLOCK_L, True, False, PREC)
    m_i, l_i = _fwd_lse_range(q, k_base, skl, skd, bias_row, sbw, offs_m, offs_d, m_i, l_i, diag_l, hi,
                              L, W, qk_scale, BLOCK_L, True, True, PREC)
    tl.store(LSE + (b * H + h) * L + offs_m, m_i + tl.log2(l_i), mask=offs_m < L)


@triton.jit
def _lazy_fwd_kernel(Q, K, V, Bias, Tau, LSE, O,
                     sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd, sob, soh, sol, sod,
                     sbh, sbw, stau, H, L, W, qk_scale,
                     DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    # The output pass, from the LSE kernel's lse2
    pid_m, h, b, m0, offs_m, offs_d = _query_block(BLOCK_M, DH)
    rows = offs_m < L
    q = _load_rows(Q + b * sqb + h * sqh, offs_m, sql, sqd, offs_d, L)
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    bias_row = Bias + h * sbh
    c = tl.load(Tau + h * stau) / (offs_m + 1).to(tl.float32)
    # padded rows: lse = +inf makes p = 0 there
    lse2 = tl.load(LSE + (b * H + h) * L + offs_m, mask=rows, other=float("inf"))

    hi = tl.minimum(m0 + BLOCK_M, L)
    first_bias = tl.maximum(m0 - W + 1, 0)                        # keys below: distance >= W for every row
    bias_lo = (first_bias // BLOCK_N) * BLOCK_N                   # first key block with distance < W
    diag_lo = (m0 // BLOCK_N) * BLOCK_N                           # first key block with some j > i
    acc = tl.zeros([BLOCK_M, DH], tl.float32)
    acc = _fwd_out_range(q, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, acc,
                         0, bias_lo, L, W, qk_scale, BLOCK_N, False, False, PREC)
    acc = _fwd_out_range(q, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, acc,
                         bias_lo, diag_lo, L, W, qk_scale, BLOCK_N, True, False, PREC)
    acc = _fwd_out_range(q, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, acc,
                         diag_lo, hi, L, W, qk_scale, BLOCK_N, True, True, PREC)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sol + offs_d[None, :] * sod,
             acc.to(O.dtype.element_ty), mask=rows[:, None])


@triton.jit
def _p_dp(q, g, k, v, offs_m, offs_n, bias_row, sbw, W, lse2, c, qk_scale,
          BIAS: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    # p (float32) and dp = m * (g . v) of one [query, key] tile, as the Delta and dq passes both need
    s = _scores(q, k, offs_m, offs_n, bias_row, sbw, W, qk_scale, BIAS, PREC)
    p = tl.exp2(s - lse2[:, None])
    keep = p + c[:, None] > 0
    if CAUSAL:
        causal = offs_n[None, :] <= offs_m[:, None]
        p = tl.where(causal, p, 0.0)
        keep = keep & causal
    dp = tl.where(keep, tl.dot(g, tl.trans(v), input_precision=PREC), 0.0)
    return p, dp


@triton.jit
def _delta_range(q, g, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, delta, dps,
                 delta_est, psum, acc_ds, acc_p, lo, hi, L, W, qk_scale,
                 BLOCK: tl.constexpr, BIAS: tl.constexpr, PREC: tl.constexpr):
    # Key blocks below the diagonal tile. sum_j p (dp - Delta) k_j = sum_j p (dp - est) k_j - (Delta - est)
    # sum_j p k_j for any est: neither sum needs Delta, so dq comes out of the pass that finds it; est close
    # to Delta keeps the second term (and the rounding of p to the dot's dtype in it) small. delta collects
    # sum_j p (dp - est) (Delta = delta + est * psum), which lets dp go before the dots.
    for n0 in range(lo, hi, BLOCK):
        offs_n = n0 + tl.arange(0, BLOCK)
        k = _load_rows(k_base, offs_n, skl, skd, offs_d, L)
        v = _load_rows(v_base, offs_n, svl, svd, offs_d, L)
        p, dp = _p_dp(q, g, k, v, offs_m, offs_n, bias_row, sbw, W, lse2, c, qk_scale, BIAS, False, PREC)
        dps += tl.sum(dp, 1).to(tl.float64)
        x = p * (dp - delta_est[:, None])
        delta += tl.sum(x, 1)
        psum += tl.sum(p, 1)
        acc_ds = tl.dot(x.to(k.dtype), k, acc_ds, input_precision=PREC)
        acc_p = tl.dot(p.to(k.dtype), k, acc_p, input_precision=PREC)
    return delta, dps, psum, acc_ds, acc_p


@triton.jit
def _delta_dq_diagonal(q, g, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, delta,
                       dps, delta_est, psum, acc_ds, m0, L, W, qk_scale, BLOCK: tl.constexpr, PREC: tl.constexpr):
    # The diagonal tile comes last: Delta is complete once its p dp is added, so its ds is exact (as on the
    # ds path) and goes into dq directly. Rows of the first query block have all their keys here.
    offs_n = m0 + tl.arange(0, BLOCK)
    k = _load_rows(k_base, offs_n, skl, skd, offs_d, L)
    v = _load_rows(v_base, offs_n, svl, svd, offs_d, L)
    p, dp = _p_dp(q, g, k, v, offs_m, offs_n, bias_row, sbw, W, lse2, c, qk_scale, True, True, PREC)
    dps += tl.sum(dp, 1).to(tl.float64)
    delta = delta + delta_est * psum + tl.sum(p * dp, 1)
    ds = p * (dp - delta[:, None])
    ds = tl.where(offs_m[:, None] == 0, 0.0, ds)     # row 0: ds = 0 exactly (see _dkdv_tile)
    acc_ds = tl.dot(ds.to(k.dtype), k, acc_ds, input_precision=PREC)
    return delta, dps, acc_ds


@triton.jit
def _bwd_block(Q, DO, Tau, LSE, sqb, sqh, sql, sqd, sdob, sdoh, sdol, sdod, stau, H, L,
               DH: tl.constexpr, BLOCK: tl.constexpr):
    """How the Delta kernel starts: this program's query block (pid_m, head h, batch b), its rows, and their
    q, dO, lse2 and c = tau / (i + 1)."""
    pid_m, h, b, m0, offs_m, offs_d = _query_block(BLOCK, DH)
    rows = offs_m < L
    bh = b * H + h
    q = _load_rows(Q + b * sqb + h * sqh, offs_m, sql, sqd, offs_d, L)
    g = _load_rows(DO + b * sdob + h * sdoh, offs_m, sdol, sdod, offs_d, L)
    # padded rows: lse = +inf makes p = 0 there, so they add nothing to any sum
    lse2 = tl.load(LSE + bh * L + offs_m, mask=offs_m < L, other=float("inf"))
    c = tl.load(Tau + h * stau) / (offs_m + 1).to(tl.float32)
    return pid_m, h, b, bh, m0, offs_m, offs_d, rows, q, g, lse2, c


@triton.jit
def _lazy_bwd_delta_kernel(Q, K, V, DO, O, Bias, Tau, LSE, Delta, TauPart, DQ,
                           sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd,
                           sdob, sdoh, sdol, sdod, sob, soh, sol, sod, sdqb, sdqh, sdql, sdqd,
                           sbh, sbw, stau, H, L, W, qk_scale, scale,
                           DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    # One pass over the key blocks of one query block: Delta_i = sum_j p dp from float32 p and dp, this block's
    # share of dtau = sum_i 1/(i+1) sum_j dp, and dq (BLOCK_M a multiple of BLOCK_N; see _delta_range and
    # _delta_dq_diagonal).
    pid_m, h, b, bh, m0, offs_m, offs_d, rows, q, g, lse2, c = _bwd_block(
        Q, DO, Tau, LSE, sqb, sqh, sql, sqd, sdob, sdoh, sdol, sdod, stau, H, L, DH, BLOCK_M)
    k_base = K + b * skb + h * skh
    v_base = V + b * svb + h * svh
    bias_row = Bias + h * sbh
    first_bias = tl.maximum(m0 - W + 1, 0)          # keys below: distance >= W for every row of the block
    bias_d = (first_bias // BLOCK_N) * BLOCK_N
    # g . o, FlashAttention's Delta, is Delta + c g . (sum of the kept v): close to Delta where c is small
    o = _load_rows(O + b * sob + h * soh, offs_m, sol, sod, offs_d, L)
    delta_est = tl.sum(g.to(tl.float32) * o.to(tl.float32), 1)
    delta = tl.zeros([BLOCK_M], tl.float32)
    psum = tl.zeros([BLOCK_M], tl.float32)
    # dtau often cancels to much less than its terms: its row sums are carried in float64 (a BLOCK-vector
    # per tile, next to nothing), which keeps it well inside the float32 floor's bound
    dps = tl.zeros([BLOCK_M], tl.float64)
    acc_ds = tl.zeros([BLOCK_M, DH], tl.float32)
    acc_p = tl.zeros([BLOCK_M, DH], tl.float32)
    delta, dps, psum, acc_ds, acc_p = _delta_range(
        q, g, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, delta, dps,
        delta_est, psum, acc_ds, acc_p, 0, bias_d, L, W, qk_scale, BLOCK_N, False, PREC)
    delta, dps, psum, acc_ds, acc_p = _delta_range(
        q, g, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m, offs_d, lse2, c, delta, dps,
        delta_est, psum, acc_ds, acc_p, bias_d, m0, L, W, qk_scale, BLOCK_N, True, PREC)
    delta, dps, acc_ds = _delta_dq_diagonal(q, g, k_base, skl, skd, v_base, svl, svd, bias_row, sbw, offs_m,
                                            offs_d, lse2, c, delta, dps, delta_est, psum, acc_ds, m0, L, W,
                                            qk_scale, BLOCK_M, PREC)
    dq = acc_ds - (delta - delta_est)[:, None] * acc_p
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdql + offs_d[None, :] * sdqd,
             (dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None])
    tl.store(Delta + bh * L + offs_m, delta, mask=rows)
    inv = 1.0 / (offs_m + 1).to(tl.float64)
    tl.store(TauPart + (b * tl.num_programs(0) + pid_m) * H + h, tl.sum(tl.where(rows, dps * inv, 0.0), 0).to(tl.float32))


@triton.jit
def _dkdv_tile(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau, bias_row, sbw,
               offs_m, offs_n, offs_d, dk, dv, L, W, qk_scale,
               BIAS: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """One transposed tile (rows keys j, columns queries i) of the dk/dv pass: dk and dv updated, and ds
    (float32, for the dbias sums)."""
    q = _load_rows(q_base, offs_m, sql, sqd, offs_d, L)
    g = _load_rows(do_base, offs_m, sdol, sdod, offs_d, L)
    lse2 = tl.load(lse_base + offs_m, mask=offs_m < L, other=float("inf"))
    delta = tl.load(delta_base + offs_m, mask=offs_m < L, other=0.0)
    c = tau / (offs_m + 1).to(tl.float32)
    sT = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
    if BIAS:
        sT += _bias_tile(bias_row, sbw, offs_m[None, :] - offs_n[:, None], W) * LOG2E
    pT = tl.exp2(sT - lse2[None, :])
    keep = pT + c[None, :] > 0
    if CAUSAL:
        causal = offs_m[None, :] >= offs_n[:, None]
        pT = tl.where(causal, pT, 0.0)
        keep = keep & causal
    eT = tl.where(keep, pT + c[None, :], 0.0)
    dv = tl.dot(eT.to(g.dtype), g, dv, input_precision=PREC)
    dpT = tl.where(keep, tl.dot(v, tl.trans(g), input_precision=PREC), 0.0)
    dsT = pT * (dpT - delta[None, :])
    if CAUSAL:
        # row 0 has one key: p = 1 and ds = 0 exactly; rounding of p would leave noise where the true
        # gradient is exactly zero (all of dq, dk and dbias when L = 1)
        dsT = tl.where(offs_m[None, :] == 0, 0.0, dsT)
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=PREC)
    return dk, dv, dsT


@triton.jit
def _diag_chunks(dsT, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    # Diagonal sums of a [keys r, queries c] tile (BLOCK_N = BLOCK_M or 2 * BLOCK_M), distance c - r.
    # Rotating row r left by r % BLOCK_M puts its distance k - BLOCK_M * chunk in column k, with
    # chunk = r // BLOCK_M + (r % BLOCK_M + k >= BLOCK_M): chunk i holds distances -i * BLOCK_M + [0, BLOCK_M).
    r = tl.arange(0, BLOCK_N)[:, None]
    kk = tl.arange(0, BLOCK_M)[None, :]
    rr = r % BLOCK_M
    rot = tl.gather(dsT, (rr + kk) % BLOCK_M, axis=1)
    chunk = r // BLOCK_M + (rr + kk >= BLOCK_M).to(tl.int32)
    return (tl.sum(tl.where(chunk == 0, rot, 0.0), 0), tl.sum(tl.where(chunk == 1, rot, 0.0), 0),
            tl.sum(tl.where(chunk == 2, rot, 0.0), 0))


@triton.jit
def _dkdv_step(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau, bias_row, sbw,
               part_row, offs_n, offs_d, dk, dv, ca, cb, n0, m0, L, W, qk_scale,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BIAS: tl.constexpr, CAUSAL: tl.constexpr,
               PREC: tl.constexpr):
    offs_m = m0 + tl.arange(0, BLOCK_M)
    dk, dv, dsT = _dkdv_tile(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau,
                             bias_row, sbw, offs_m, offs_n, offs_d, dk, dv, L, W, qk_scale, BIAS, CAUSAL, PREC)
    if BIAS:
        # chunk i of this tile lies at distances m0 - n0 - i * BLOCK_M + [0, BLOCK_M); the query
        # block steps by BLOCK_M, so the chunk at m0 - n0 - 2 * BLOCK_M is complete now: stored once
        s0, s1, s2 = _diag_chunks(dsT, BLOCK_N, BLOCK_M)
        dist = (m0 - n0 - 2 * BLOCK_M) + tl.arange(0, BLOCK_M)
        tl.store(part_row + dist, ca + s2, mask=(dist >= 0) & (dist < W))
        ca = cb + s1
        cb = s0
    return dk, dv, ca, cb


@triton.jit
def _dkdv_range(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau, bias_row, sbw,
                part_row, offs_n, offs_d, dk, dv, ca, cb, n0, lo, hi, L, W, qk_scale,
                BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BIAS: tl.constexpr, CAUSAL: tl.constexpr,
                SPAN: tl.constexpr, PREC: tl.constexpr):
    if SPAN > 0:
        # dk and dv summed over SPAN query blocks at a time, then into the totals: a key near the start has
        # L terms, and one running float32 sum of them was 2.25x the float32 floor's rms error in dv (L=4096,
        # H100 sweep at bcd7cf0). For float32 inputs; 16-bit ones have no registers to spare for it.
        for s0 in range(lo, hi, SPAN * BLOCK_M):
            dk_s = tl.zeros_like(dk)
            dv_s = tl.zeros_like(dv)
            for m0 in range(s0, tl.minimum(s0 + SPAN * BLOCK_M, hi), BLOCK_M):
                dk_s, dv_s, ca, cb = _dkdv_step(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base,
                                                tau, bias_row, sbw, part_row, offs_n, offs_d, dk_s, dv_s, ca, cb,
                                                n0, m0, L, W, qk_scale, BLOCK_N, BLOCK_M, BIAS, CAUSAL, PREC)
            dk += dk_s
            dv += dv_s
    else:
        for m0 in range(lo, hi, BLOCK_M):
            dk, dv, ca, cb = _dkdv_step(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau,
                                        bias_row, sbw, part_row, offs_n, offs_d, dk, dv, ca, cb, n0, m0, L, W,
                                        qk_scale, BLOCK_N, BLOCK_M, BIAS, CAUSAL, PREC)
    return dk, dv, ca, cb


@triton.jit
def _lazy_bwd_dkdv_kernel(Q, K, V, DO, Bias, Tau, LSE, Delta, DK, DV, Part,
                          sqb, sqh, sql, sqd, skb, skh, skl, skd, svb, svh, svl, svd,
                          sdob, sdoh, sdol, sdod, sdkb, sdkh, sdkl, sdkd, sdvb, sdvh, sdvl, sdvd,
                          sbh, sbw, stau, H, L, W, qk_scale, scale,
                          DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPAN: tl.constexpr,
                          PREC: tl.constexpr):
    # One pass over the query blocks of one key block, after the Delta kernel: dk, dv and a partial row of
    # dbias. BLOCK_N is BLOCK_M or 2 * BLOCK_M (three diagonal chunks per tile at most); SPAN: see _dkdv_range.
    pid_n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DH)
    k = _load_rows(K + b * skb + h * skh, offs_n, skl, skd, offs_d, L)
    v = _load_rows(V + b * svb + h * svh, offs_n, svl, svd, offs_d, L)
    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sdob + h * sdoh
    bh = b * H + h
    tau = tl.load(Tau + h * stau)
    bias_row = Bias + h * sbh
    n_n = tl.num_programs(0)
    part_row = Part + ((b * n_n + pid_n) * H + h) * W

    m_lo = (n0 // BLOCK_M) * BLOCK_M                                          # first block with i >= n0
    diag_hi = tl.minimum(tl.cdiv(n0 + BLOCK_N, BLOCK_M) * BLOCK_M, L)         # blocks with some i < j
    bias_hi = tl.minimum(tl.maximum(tl.cdiv(n0 + BLOCK_N - 1 + W, BLOCK_M) * BLOCK_M, diag_hi), L)
    dk = tl.zeros([BLOCK_N, DH], tl.float32)
    dv = tl.zeros([BLOCK_N, DH], tl.float32)
    ca = tl.zeros([BLOCK_M], tl.float32)
    cb = tl.zeros([BLOCK_M], tl.float32)
    lse_base = LSE + bh * L
    delta_base = Delta + bh * L
    dk, dv, ca, cb = _dkdv_range(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau,
                                 bias_row, sbw, part_row, offs_n, offs_d, dk, dv, ca, cb, n0, m_lo, diag_hi, L, W,
                                 qk_scale, BLOCK_N, BLOCK_M, True, True, SPAN, PREC)
    dk, dv, ca, cb = _dkdv_range(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau,
                                 bias_row, sbw, part_row, offs_n, offs_d, dk, dv, ca, cb, n0, diag_hi, bias_hi, L,
                                 W, qk_scale, BLOCK_N, BLOCK_M, True, False, SPAN, PREC)
    # the two chunks still open end at the table's edge: later tiles hold distances >= W only (m_end: the
    # query block after the last one seen, bias_hi rounded up as the loops step)
    m_end = m_lo + tl.cdiv(bias_hi - m_lo, BLOCK_M) * BLOCK_M
    dist = (m_end - n0 - 2 * BLOCK_M) + tl.arange(0, BLOCK_M)
    tl.store(part_row + dist, ca, mask=(dist >= 0) & (dist < W))
    tl.store(part_row + dist + BLOCK_M, cb, mask=(dist + BLOCK_M >= 0) & (dist + BLOCK_M < W))
    dk, dv, ca, cb = _dkdv_range(k, v, q_base, sql, sqd, do_base, sdol, sdod, lse_base, delta_base, tau,
                                 bias_row, sbw, part_row, offs_n, offs_d, dk, dv, ca, cb, n0, bias_hi, L, L, W,
                                 qk_scale, BLOCK_N, BLOCK_M, False, False, SPAN, PREC)
    cols = offs_n[:, None] < L
    tl.store(DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkl + offs_d[None, :] * sdkd,
             (dk * scale).to(DK.dtype.element_ty), mask=cols)
    tl.store(DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvl + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=cols)


@triton.jit
def _lazy_bwd_reduce_kernel(Part, TauPart, DBias, DTau, R, R2, H, W, BLOCK_W: tl.constexpr):
    # dbias[h, :W] = sum over the R partial rows [R, H, W] of head h; dtau[h] (column W) = sum of the R2
    # per-query-block shares [R2, H] of the Delta kernel. Fixed order, float64 sums.
    h = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    acc = tl.zeros([BLOCK_W], tl.float64)
    for r in range(0, R):
        acc += tl.load(Part + (r * H + h) * W + cols, mask=cols < W, other=0.0).to(tl.float64)
    for r in range(0, R2):
        acc += tl.load(TauPart + r * H + h + cols * 0, mask=cols == W, other=0.0).to(tl.float64)
    acc = acc.to(tl.float32)
    dst_h = h  # the output slot of this head
    # outputs start at zero and each element receives exactly one add: deterministic
    tl.atomic_add(DBias + dst_h * W + cols, acc, mask=cols < W)
    tl.atomic_add(DTau + dst_h + cols * 0, acc, mask=cols == W)
