"""softmax_xent in Gluon: one persistent kernel streaming rows through a TMA-fed shared-memory ring.

Each program owns the rows ``pid, pid + nprog, ...`` and walks one flat stream of ``[1, BLOCK_V]``
chunks over them: every chunk of a row for the statistics, then (when a gradient is written) every chunk
of the same row again for dlogits. The ring keeps ``STAGES`` chunks in flight along that stream, across
the boundary between the two passes and between rows, so the copy engine never waits for a row's
reduction. The second read of a row is meant to hit L2 (a program holds one row at a time, and the dlogits
stores are marked evict-first), so that DRAM sees one read of the logits and one write of dlogits; how much
of it does is not measured yet (no ncu run).

Numerics (the same as the CUDA backend's): float32 throughout. The statistics are kept per lane, as the
pair (m, r) with ``sum_j exp(z_j - m) = 1 + r`` and ``r`` the sum without one maximal element, updated
with one exponential per element and no cross-lane work until the row ends; the row's log-sum is then
``m + log1p(r)``, so a confident row (p_y -> 1) keeps its digits, and the target's ``p - 1`` is
``expm1`` of ``log p`` (one scalar per row) rather than a difference of two rounded numbers.

Modes (``MODE``, a constexpr):
  0  statistics and per-row losses only (no gradient wanted, or reduction "none");
  1  statistics, losses and dlogits for an upstream gradient of 1 (scaled by ``inv``, 1/D);
  2  dlogits recomputed from saved statistics for the upstream gradient g (the backward);
  3  dlogits scaled in place by g (the in-place backward: the buffer already holds dlogits for g = 1).
With ``SKIP_IF_ONE`` (modes 2 and 3, scalar g) the program reads g on the device and does nothing when g
is exactly 1, so ``loss.backward()`` costs no pass and no host synchronisation.

How the ring is fed (``RING``, a constexpr):
  1  by a producer warp (``gl.warp_specialize``): it waits on a slot's "empty" barrier and issues the TMA
     load; the consumer warps wait on its "ready" barrier and arrive on "empty" once they have read it;
  0  not at all: rows whose layout TMA cannot describe (a row stride that is not a multiple of 16 bytes,
     an unaligned base) are loaded from global memory directly, chunk by chunk.
A single-partition ring (the consumers issuing the loads themselves, after a CTA barrier per slot) measured
within 1.3% of the producer warp at its best configuration and was dropped (docs/kernels/gluon-softmax_xent.md).

Float32 logits take exp with the product d * log2(e) carried in two parts (PRECISE): exp2 of the rounded
product alone is off by |d| * 2^-24 relative, which the loss of a confident float32 row (a sum of such terms)
showed against its bound. Every dtype takes the precise exp for the per-lane factors of a row's combine
(_row_stats), which scale whole partial sums.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

LOG2E = gl.constexpr(1.4426950408889634)
# log2(e) - float32(log2(e)), and ln 2: the correction terms of _exp
LOG2E_LO = gl.constexpr(1.925963001e-08)
LN2 = gl.constexpr(0.6931471805599453)
# triton 3.6 (the GPU hosts) names the TMA load async_copy_global_to_shared; 3.9 (CI) renamed it async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _log1p(r):
    # Kahan's: log(u) * r / (u - 1) with u = 1 + r rounded; exact to a few ulps for tiny r
    u = 1.0 + r
    d = u - 1.0
    return gl.where(d == 0.0, r, gl.log(u) * (r / gl.where(d == 0.0, 1.0, d)))


@gluon.jit
def _expm1(t):
    # Kahan's: (u - 1) * t / log(u) with u = exp(t); keeps the digits of p - 1 for p -> 1
    u = gl.exp(t)
    d = u - 1.0
    lu = gl.log(u)
    return gl.where(d == 0.0, t, gl.where(d == -1.0, -1.0, d * (t / gl.where(lu == 0.0, 1.0, lu))))


@gluon.jit
def _coords(item, pid, nprog, per_row, nchunks, BLOCK_V: gl.constexpr):
    """(row, first column) of stream item ``item``: the rows pid, pid + nprog, ..., per_row items each."""
    return pid + (item // per_row) * nprog, ((item % per_row) % nchunks) * BLOCK_V


@gluon.jit
def _producer(desc, ring, ready, empty, total, pid, nprog, per_row, nchunks, BLOCK_V: gl.constexpr,
              STAGES: gl.constexpr):
    """The producer warp: every stream item into its slot once the consumers have released it."""
    for item in range(total):
        slot = item % STAGES
        # a fresh barrier counts as released (parity 1), so the first lap does not wait
        mbarrier.wait(empty.index(slot), ((item // STAGES) & 1) ^ 1)
        row, col = _coords(item, pid, nprog, per_row, nchunks, BLOCK_V)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        _tma_load(desc, [row, col], ready.index(slot), ring.index(slot))


@gluon.jit
def _next_chunk(desc, ring, ready, empty, src_ptr, row_off, cols, valid, item, total, pid, nprog, per_row,
                nchunks, layout: gl.constexpr, BLOCK_V: gl.constexpr, STAGES: gl.constexpr, RING: gl.constexpr,
                MASKED: gl.constexpr):
    """Stream item ``item`` as float32 ``[1, BLOCK_V]``, its ring slot handed back. MASKED (the row's last
    chunk): columns past V read as -inf."""
    if RING == 0:
        if MASKED:
            x = gl.load(src_ptr + row_off + cols, mask=valid, other=0.0)
        else:
            x = gl.load(src_ptr + row_off + cols)
    else:
        slot = item % STAGES
        mbarrier.wait(ready.index(slot), (item // STAGES) & 1)
        x = ring.index(slot).load(layout)
        # the consumers' reads of the slot are done before the copy engine may overwrite it
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
    x = x.to(gl.float32)
    if MASKED:
        x = gl.where(valid, x, float("-inf"))
    return x


@gluon.jit
def _exp(d, PRECISE: gl.constexpr):
    """exp(d) as exp2(d * log2 e); PRECISE: the product's rounding error (an FMA) and log2 e's own carried
    into a first-order correction, so the result is exp2's few ulps whatever |d|."""
    hi = d * LOG2E
    if PRECISE:
        # d = -inf (a lane's first element, a masked column) gives exp2 = 0 and a NaN correction: drop it
        lo = gl.where(hi > -160.0, gl.fma(d, LOG2E, -hi) + d * LOG2E_LO, 0.0)
        return gl.exp2(hi) * (1.0 + lo * LN2)
    else:
        return gl.exp2(hi)


@gluon.jit
def _prob(x, m, lg, PRECISE: gl.constexpr):
    """p = exp((x - m) - log1p(r)), x - m exact for close values."""
    if PRECISE:
        return _exp((x - m) - lg, True)
    else:
        return gl.exp2((x - m) * LOG2E - lg * LOG2E)


@gluon.jit
def _lane_stats(x, m_l, r_l, z_l, valid, MASKED: gl.constexpr, SMOOTH: gl.constexpr, PRECISE: gl.constexpr):
    """Per-lane online update of (max, sum without one maximal element, sum of logits): one exponential
    per element, no cross-lane work."""
    hi = gl.maximum(m_l, x)
    e = _exp(gl.minimum(m_l, x) - hi, PRECISE)
    r_new = gl.where(x > m_l, (1.0 + r_l) * e, r_l + e)
    if MASKED:
        # a -inf column would make e NaN (-inf - -inf); it adds nothing
        r_new = gl.where(valid, r_new, r_l)
    if SMOOTH:
        z_l += gl.where(valid, x, 0.0) if MASKED else x
    return hi, r_new, z_l


@gluon.jit
def _row_stats(m_l, r_l):
    """(m, r) of the row from its lanes: sum_j exp(z_j - m) = 1 + r, r without one maximal element.

    Each lane's factor exp(m_l - m) is the precise exp whatever the dtype: it scales the lane's whole sum, so its
    error does not average out, and in a confident row (m_l - m ~ -20) the plain exp2 of the rounded product is
    off by |d| * 2^-24 plus log2(e)'s own rounding, about 3e-7 relative, the same sign for every lane. 16-bit
    rows took it: their loss at N128-V1025-confident-none measured 2.8x the float32 floor (rms 1.12x its bound,
    bfloat16, an H200, seed 31), where the CUDA backend, which takes this factor with expf, measured 0.28x.
    One exponential per lane per row: the stream's per-element exps keep the plain exp2."""
    m = gl.max(gl.max(m_l, axis=1), axis=0)
    top = m_l == m
    rest = gl.where(top, r_l, (1.0 + r_l) * _exp(m_l - m, True))
    r = gl.sum(gl.sum(rest, axis=1), axis=0) + (gl.sum(gl.sum(top.to(gl.float32), axis=1), axis=0) - 1.0)
    return m, r


@gluon.jit
def _rows(desc, ring, ready, empty, src_ptr, ls, out_ptr, ds, tgt_ptr, ts, ignore_index, V, stats_ptr, loss_ptr,
          inv_ptr, g_ptr, gs, eps, lam, pid, nprog, nchunks, per_row, my_rows, total,
          MODE: gl.constexpr, RING: gl.constexpr, SMOOTH: gl.constexpr, BLOCK_V: gl.constexpr,
          STAGES: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr):
    """The consumer: this program's rows, each chunk taken from the stream in order."""
    PRECISE: gl.constexpr = src_ptr.dtype.element_ty == gl.float32
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [1, WARPS], [1, 0])
    offs = gl.expand_dims(gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, layout)), 0)
    inv = gl.load(inv_ptr)
    item = 0
    last = nchunks - 1
    for ri in range(my_rows):
        row = pid + ri * nprog
        row_off = row.to(gl.int64) * ls
        out_row = out_ptr + row.to(gl.int64) * ds
        y = gl.load(tgt_ptr + row.to(gl.int64) * ts)
        valid_row = y != ignore_index
        if MODE == 3:
            g = gl.load(g_ptr + row.to(gl.int64) * gs)
            for c in range(last):
                x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, offs + c * BLOCK_V, offs < V, item,
                                total, pid, nprog, per_row, nchunks, layout, BLOCK_V, STAGES, RING, False)
                item += 1
                gl.store(out_row + c * BLOCK_V + offs, (x * g).to(out_ptr.dtype.element_ty),
                         eviction_policy="evict_first")
            cols = offs + last * BLOCK_V
            x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, cols, cols < V, item, total, pid, nprog,
                            per_row, nchunks, layout, BLOCK_V, STAGES, RING, True)
            item += 1
            gl.store(out_row + cols, (x * g).to(out_ptr.dtype.element_ty), mask=cols < V,
                     eviction_policy="evict_first")
        else:
            zy = gl.load(src_ptr + row_off + y, mask=valid_row, other=0.0).to(gl.float32)
            if MODE == 2:
                m = gl.load(stats_ptr + row.to(gl.int64) * 2)
                lg = gl.load(stats_ptr + row.to(gl.int64) * 2 + 1)
                scale = gl.where(valid_row, inv * gl.load(g_ptr + row.to(gl.int64) * gs), 0.0)
            else:
                m_l = gl.full([1, BLOCK_V], float("-inf"), gl.float32, layout)
                r_l = gl.full([1, BLOCK_V], -1.0, gl.float32, layout)
                z_l = gl.zeros([1, BLOCK_V], gl.float32, layout)
                for c in range(last):
                    x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, offs + c * BLOCK_V, offs < V,
                                    item, total, pid, nprog, per_row, nchunks, layout, BLOCK_V, STAGES, RING, False)
                    item += 1
                    m_l, r_l, z_l = _lane_stats(x, m_l, r_l, z_l, offs < V, False, SMOOTH, PRECISE)
                cols = offs + last * BLOCK_V
                x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, cols, cols < V, item, total, pid,
                                nprog, per_row, nchunks, layout, BLOCK_V, STAGES, RING, True)
                item += 1
                m_l, r_l, z_l = _lane_stats(x, m_l, r_l, z_l, cols < V, True, SMOOTH, PRECISE)
                m, r = _row_stats(m_l, r_l)
                lg = _log1p(r)
                lse = m + lg
                # LSE - z_y as (m - z_y) + log1p(r): a confident row's loss keeps its digits
                loss = (m - zy) + lg + lam * lse * lse
                if SMOOTH:
                    loss += eps * (zy - gl.sum(gl.sum(z_l, axis=1), axis=0) / V)
                gl.store(loss_ptr + row, gl.where(valid_row, loss, 0.0))
                gl.store(stats_ptr + row.to(gl.int64) * 2, m)
                gl.store(stats_ptr + row.to(gl.int64) * 2 + 1, lg)
                scale = gl.where(valid_row, inv, 0.0)
            if MODE != 0:
                lse = m + lg
                coef = 1.0 + 2.0 * lam * lse
                # dz = p * a + b off the target; 0 - ... keeps an ignored row's zeros positive
                a = coef * scale
                b = 0.0 - (eps / V) * scale
                # the target's value, p - (1 - eps) formed without cancellation
                lpy = (zy - m) - lg
                tval = (_expm1(lpy) + (coef - 1.0) * gl.exp(lpy) + eps - eps / V) * scale
                for c in range(last):
                    x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, offs + c * BLOCK_V, offs < V,
                                    item, total, pid, nprog, per_row, nchunks, layout, BLOCK_V, STAGES, RING, False)
                    item += 1
                    dz = gl.where(offs == y - c * BLOCK_V, tval, _prob(x, m, lg, PRECISE) * a + b)
                    gl.store(out_row + c * BLOCK_V + offs, dz.to(out_ptr.dtype.element_ty),
                             eviction_policy="evict_first")
                cols = offs + last * BLOCK_V
                x = _next_chunk(desc, ring, ready, empty, src_ptr, row_off, cols, cols < V, item, total, pid,
                                nprog, per_row, nchunks, layout, BLOCK_V, STAGES, RING, True)
                item += 1
                dz = gl.where(cols == y, tval, _prob(x, m, lg, PRECISE) * a + b)
                gl.store(out_row + cols, dz.to(out_ptr.dtype.element_ty), mask=cols < V,
                         eviction_policy="evict_first")


@gluon.jit
def xent_rows_kernel(
        desc, src_ptr, ls, out_ptr, ds, tgt_ptr, ts, ignore_index, N, V,
        stats_ptr, loss_ptr, inv_ptr, g_ptr, gs, eps, lam,
        MODE: gl.constexpr, SKIP_IF_ONE: gl.constexpr, RING: gl.constexpr, SMOOTH: gl.constexpr,
        BLOCK_V: gl.constexpr, STAGES: gl.constexpr, VEC: gl.constexpr):
    WARPS: gl.constexpr = gl.num_warps()
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    nchunks = gl.cdiv(V, BLOCK_V)
    PASSES: gl.constexpr = 2 if MODE == 1 else 1
    per_row = nchunks * PASSES
    my_rows = gl.cdiv(N - pid, nprog)
    if SKIP_IF_ONE:
        # loss.backward(): the forward's dlogits are already right
        my_rows = gl.where(gl.load(g_ptr) == 1.0, 0, my_rows)
    total = my_rows * per_row
    if RING == 0:
        _rows(desc, 0, 0, 0, src_ptr, ls, out_ptr, ds, tgt_ptr, ts, ignore_index, V, stats_ptr, loss_ptr,
              inv_ptr, g_ptr, gs, eps, lam, pid, nprog, nchunks, per_row, my_rows, total,
              MODE, RING, SMOOTH, BLOCK_V, STAGES, VEC, WARPS)
    else:
        ring = gl.allocate_shared_memory(desc.dtype, [STAGES, 1, BLOCK_V], desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=1)
        gl.warp_specialize([
            (_rows, (desc, ring, ready, empty, src_ptr, ls, out_ptr, ds, tgt_ptr, ts, ignore_index, V,
                     stats_ptr, loss_ptr, inv_ptr, g_ptr, gs, eps, lam, pid, nprog, nchunks, per_row, my_rows,
                     total, MODE, RING, SMOOTH, BLOCK_V, STAGES, VEC, WARPS)),
            (_producer, (desc, ring, ready, empty, total, pid, nprog, per_row, nchunks, BLOCK_V, STAGES)),
        ], [1], [40])
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))
