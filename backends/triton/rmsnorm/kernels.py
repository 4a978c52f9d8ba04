"""Triton kernels of ``rmsnorm`` (docs/kernels/triton-rmsnorm.md).

Two families. Rows that fit one feature block (F <= BLOCK_F) take the ``_rows`` kernels: each tile of rows is
read once and kept in registers, and the backward is persistent (a program takes row tiles p, p + P, ... and
keeps its dw partial in registers across them). Wider rows take the looped kernels: a tile of BLOCK_R rows,
the features in blocks of BLOCK_F (any feature count), read twice. Every tensor is addressed through its own
strides (any layout, no copies); row offsets are int64. All math is float32. Runs on a GPU, or on CPU tensors
with TRITON_INTERPRET=1.
"""

import triton
import triton.language as tl


@triton.jit
def _rsqrt_rn(v):
    # correctly rounded sqrt and division: tl.rsqrt is approximate on the GPU
    return tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))


@triton.jit
def _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES: tl.constexpr):
    """h = x (+ residual) of a [BLOCK_R, BLOCK_F] tile, in float32."""
    h = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        h += tl.load(r_ptr + rows[:, None] * srr + cols[None, :] * srf, mask=mask, other=0.0).to(tl.float32)
    return h


@triton.jit
def _store_residual_out(ro_ptr, h, rows, cols, mask, sor, sof, HAS_RES: tl.constexpr):
    """residual_out = h, the sum the fused add hands to the next layer (both forward kernels store it here)."""
    if HAS_RES:
        tl.store(ro_ptr + rows[:, None] * sor + cols[None, :] * sof, h.to(ro_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dx_tile(dy, w, h, c, rstd, dro_ptr, rows, cols, mask, sdor, sdof, HAS_RES: tl.constexpr):
    """dx = rstd * (dy*w - h*c) (+ d residual_out), c = mean(dy*w*h) * rstd^2 per row (both backward kernels)."""
    dx = rstd[:, None] * (dy * w[None, :] - h * c[:, None])
    if HAS_RES:
        dx += tl.load(dro_ptr + rows[:, None] * sdor + cols[None, :] * sdof, mask=mask, other=0.0).to(tl.float32)
    return dx


@triton.jit
def _fwd_kernel(x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr, rstd_ptr, R, F, eps,
                sxr, sxf, srr, srf, sw, syr, syf, sor, sof,
                HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """y = h * rstd * w, rstd = 1 / sqrt(mean(h^2) + eps), h = x (+ residual, stored as residual_out)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    offs = tl.arange(0, BLOCK_F)
    ss = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
        ss += h * h
        _store_residual_out(ro_ptr, h, rows, cols, mask, sor, sof, HAS_RES)
    rstd = _rsqrt_rn(tl.div_rn(tl.sum(ss, axis=1), tl.zeros([BLOCK_R], tl.float32) + F) + eps)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        y = h * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows[:, None] * syr + cols[None, :] * syf, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(x_ptr, r_ptr, w_ptr, dy_ptr, dro_ptr, rstd_ptr, dx_ptr, part_ptr, R, F,
                sxr, sxf, srr, srf, sw, sdyr, sdyf, sdor, sdof, sdxr, sdxf,
                HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """dx = rstd * (dy*w - h * rstd^2 * mean(dy*w*h)) (+ d residual_out) for one row tile, and the tile's
    float32 dw partials part[tile, f] = sum over its rows of dy * h * rstd."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    offs = tl.arange(0, BLOCK_F)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    acc = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        acc += dy * w[None, :] * h
    c = tl.div_rn(tl.sum(acc, axis=1), tl.zeros([BLOCK_R], tl.float32) + F) * rstd * rstd
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + offs
        fmask = cols < F
        mask = rmask[:, None] & fmask[None, :]
        h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
        w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        dx = _dx_tile(dy, w, h, c, rstd, dro_ptr, rows, cols, mask, sdor, sdof, HAS_RES)
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        part = tl.sum(dy * h * rstd[:, None], axis=0)
        tl.store(part_ptr + pid * F + cols, part, mask=fmask)


@triton.jit
def _fwd_rows_kernel(x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr, rstd_ptr, R, F, eps,
                     sxr, sxf, srr, srf, sw, syr, syf, sor, sof,
                     HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """The forward of rows that fit one feature block (F <= BLOCK_F): h is read once and kept in registers."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    cols = tl.arange(0, BLOCK_F)
    fmask = cols < F
    mask = rmask[:, None] & fmask[None, :]
    h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
    _store_residual_out(ro_ptr, h, rows, cols, mask, sor, sof, HAS_RES)
    rstd = _rsqrt_rn(tl.div_rn(tl.sum(h * h, axis=1), tl.zeros([BLOCK_R], tl.float32) + F) + eps)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
    y = h * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * syr + cols[None, :] * syf, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_rows_kernel(x_ptr, r_ptr, w_ptr, dy_ptr, dro_ptr, rstd_ptr, dx_ptr, part_ptr, R, F, T,
                     sxr, sxf, srr, srf, sw, sdyr, sdyf, sdor, sdof, sdxr, sdxf,
                     HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """The backward of rows that fit one feature block, persistent: program p takes row tiles p, p + P, ... of
    the T tiles, reads each once, writes its dx, and keeps sum dy * h * rstd over its rows in registers; its
    float32 dw partial is part[p, f] (P partials instead of T: less to write and to reduce)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_F)
    fmask = cols < F
    w = tl.load(w_ptr + cols * sw, mask=fmask, other=0.0).to(tl.float32)
    nf = tl.zeros([BLOCK_R], tl.float32) + F
    acc = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.float32)
    for t in range(pid, T, tl.num_programs(0)):
        rows = (t * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # t * BLOCK_R < R < 2^31
        rmask = rows < R
        mask = rmask[:, None] & fmask[None, :]
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        h = _load_h(x_ptr, r_ptr, rows, cols, mask, sxr, sxf, srr, srf, HAS_RES)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        c = tl.div_rn(tl.sum(dy * w[None, :] * h, axis=1), nf) * rstd * rstd
        dx = _dx_tile(dy, w, h, c, rstd, dro_ptr, rows, cols, mask, sdor, sdof, HAS_RES)
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        acc += dy * h * rstd[:, None]
    tl.store(part_ptr + pid.to(tl.int64) * F + cols, tl.sum(acc, axis=0), mask=fmask)


@triton.jit
def _reduce_kernel(part_ptr, dw_ptr, T, F, sdw, BLOCK_T: tl.constexpr, BLOCK_F: tl.constexpr):
    """dw[f] = sum over the T row tiles of part[t, f], in a fixed order (deterministic, no atomics)."""
    cols = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = cols < F
    acc = tl.zeros([BLOCK_T, BLOCK_F], dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        acc += tl.load(part_ptr + t.to(tl.int64)[:, None] * F + cols[None, :],
                       mask=(t < T)[:, None] & fmask[None, :], other=0.0)
    tl.store(dw_ptr + cols * sdw, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=fmask)
