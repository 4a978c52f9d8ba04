"""Triton kernels of ``layernorm`` (docs/kernels/triton-layernorm.md).

Two families. Rows that fit one feature block (F <= BLOCK_F) take the ``_rows`` kernels: each tile of rows is
read once and kept in registers, and the backward is persistent (a program takes row tiles p, p + P, ... and
keeps its dw and db partials in registers across them). Wider rows take the looped kernels: a tile of BLOCK_R
rows, the features in blocks of BLOCK_F (any feature count), read three times (forward) or twice (backward).
Every tensor is addressed through its own strides (any layout, no copies); row offsets are int64. All math
is float32; the variance is the centered two-pass one. Runs on a GPU, or on CPU tensors with
TRITON_INTERPRET=1.
"""

import triton
import triton.language as tl


@triton.jit
def _rsqrt_rn(v):
    # correctly rounded sqrt and division: tl.rsqrt is approximate on the GPU
    return tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))


@triton.jit
def _dx_tile(dy, w, xhat, mg, mgx, rstd):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (both backward kernels)."""
    return rstd[:, None] * (dy * w[None, :] - mg[:, None] - xhat * mgx[:, None])


@triton.jit
def _dw_terms(dy, xhat):
    """One tile's terms of dw = sum over rows of dy * xhat, in float32 (both backward kernels)."""
    return dy * xhat


@triton.jit
def _fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, R, F, eps, sxr, sxf, sw, sb, syr, syf,
                BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """y = (x - mean) * rstd * w + b; mean and rstd = 1 / sqrt(mean((x - mean)^2) + eps) stored per row."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    offs = tl.arange(0, BLOCK_F)
    nf = tl.zeros([BLOCK_R], tl.float32) + F
    s = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        s += tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
    mean = tl.div_rn(tl.sum(s, axis=1), nf)
    ss = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        xc = tl.where(mask, x - mean[:, None], 0.0)
        ss += xc * xc
    rstd = _rsqrt_rn(tl.div_rn(tl.sum(ss, axis=1), nf) + eps)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        fmask = cols < F
        mask = rmask[:, None] & fmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols * sb, mask=fmask, other=0.0).to(tl.float32)
        y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + rows[:, None] * syr + cols[None, :] * syf, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, pw_ptr, pb_ptr, R, F,
                sxr, sxf, sw, sdyr, sdyf, sdxr, sdxf, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, for one row tile; and the tile's float32
    partials pw[tile, f] = sum over its rows of dy * xhat (dw), pb[tile, f] = sum of dy (db)."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    offs = tl.arange(0, BLOCK_F)
    nf = tl.zeros([BLOCK_R], tl.float32) + F
    mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    sg = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    sgx = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        g = dy * w[None, :]
        sg += g
        sgx += g * tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    mg = tl.div_rn(tl.sum(sg, axis=1), nf)
    mgx = tl.div_rn(tl.sum(sgx, axis=1), nf)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        fmask = cols < F
        mask = rmask[:, None] & fmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        dx = _dx_tile(dy, w, xhat, mg, mgx, rstd)
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(pw_ptr + pid * F + cols, tl.sum(_dw_terms(dy, xhat), axis=0), mask=fmask)
        tl.store(pb_ptr + pid * F + cols, tl.sum(dy, axis=0), mask=fmask)


@triton.jit
def _fwd_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, R, F, eps, sxr, sxf, sw, sb, syr, syf,
                     BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """The forward of rows that fit one feature block (F <= BLOCK_F): x is read once and kept in registers;
    the same centered two-pass variance, over the registers."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    cols = tl.arange(0, BLOCK_F)
    fmask = cols < F
    mask = rmask[:, None] & fmask[None, :]
    nf = tl.zeros([BLOCK_R], tl.float32) + F
    x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
    mean = tl.div_rn(tl.sum(x, axis=1), nf)
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = _rsqrt_rn(tl.div_rn(tl.sum(xc * xc, axis=1), nf) + eps)
    tl.store(mean_ptr + rows, mean, mask=rmask)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols * sb, mask=fmask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows[:, None] * syr + cols[None, :] * syf, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_rows_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, pw_ptr, pb_ptr, R, F, T,
                     sxr, sxf, sw, sdyr, sdyf, sdxr, sdxf, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """The backward of rows that fit one feature block, persistent: program p takes row tiles p, p + P, ... of
    the T tiles, reads each once, writes its dx, and keeps its sums of dy * xhat and dy in registers; its
    float32 partials are pw[p, f] and pb[p, f] (P partials instead of T)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_F)
    fmask = cols < F
    w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
    nf = tl.zeros([BLOCK_R], tl.float32) + F
    acc_w = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for t in range(pid, T, tl.num_programs(0)):
        rows = (t * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # t * BLOCK_R < R < 2^31
        rmask = rows < R
        mask = rmask[:, None] & fmask[None, :]
        mean = tl.load(mean_ptr + rows, mask=rmask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        mg = tl.div_rn(tl.sum(g, axis=1), nf)
        mgx = tl.div_rn(tl.sum(g * xhat, axis=1), nf)
        dx = _dx_tile(dy, w, xhat, mg, mgx, rstd)
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        acc_w += _dw_terms(dy, xhat)
        acc_b += dy
    prow = pid.to(tl.int64) * F + cols
    tl.store(pw_ptr + prow, tl.sum(acc_w, axis=0), mask=fmask)
    tl.store(pb_ptr + prow, tl.sum(acc_b, axis=0), mask=fmask)


@triton.jit
def _reduce_kernel(part_ptr, out_ptr, T, F, so, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr):
    """out[f] = sum over the T row tiles of part[t, f], in a fixed order (deterministic, no atomics)."""
    cols = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = cols < F
    acc = tl.zeros([BLOCK_T, BLOCK_F], dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        acc += tl.load(part_ptr + t.to(tl.int64)[:, None] * F + cols[None, :],
                       mask=(t < T)[:, None] & fmask[None, :], other=0.0)
    tl.store(out_ptr + cols * so, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=fmask)
