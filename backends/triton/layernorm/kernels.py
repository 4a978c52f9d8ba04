"""Triton kernels of ``layernorm`` (docs/kernels/triton-layernorm.md).

Every program takes a tile of BLOCK_R rows and loops over the features in blocks of BLOCK_F (any feature
count); every tensor is addressed through its own strides (any layout, no copies); row offsets are int64.
All math is float32; the variance is the centered two-pass one. Runs on a GPU, or on CPU tensors with
TRITON_INTERPRET=1.
"""

import triton
import triton.language as tl


@triton.jit
def _rsqrt_rn(v):
    # correctly rounded sqrt and division: tl.rsqrt is approximate on the GPU
    return tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))


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
        dx = rstd[:, None] * (dy * w[None, :] - mg[:, None] - xhat * mgx[:, None])
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(pw_ptr + pid * F + cols, tl.sum(dy * xhat, axis=0), mask=fmask)
        tl.store(pb_ptr + pid * F + cols, tl.sum(dy, axis=0), mask=fmask)


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
