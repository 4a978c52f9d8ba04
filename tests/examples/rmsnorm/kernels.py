"""Triton kernels of the example RMSNorm, their launchers and the autograd Function.

Each program takes a tile of ROWS rows and loops over the features in blocks of BLOCK (any feature
count); every tensor is addressed through its own strides (any layout, no copies). Runs on a GPU, or
on CPU tensors with TRITON_INTERPRET=1.
"""

import torch
import triton
import triton.language as tl

# small, so that modest feature counts span several blocks (what exposes block bugs) on any device
BLOCK = 32
ROWS = 16


@triton.jit
def _div(a, b):
    # IEEE division: `/` compiles to an approximate division (2 ulp) on the GPU
    return tl.div_rn(a, tl.zeros_like(a) + b)


@triton.jit
def _rsqrt(v):
    # correctly rounded sqrt and division: tl.rsqrt is approximate on the GPU
    return tl.div_rn(tl.full(v.shape, 1.0, tl.float32), tl.sqrt_rn(v))


@triton.jit
def _forward(x_ptr, w_ptr, y_ptr, rstd_ptr, R, F, eps, sxr, sxf, sw, syr, syf,
             ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ss = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        ss += x * x
    rstd = _rsqrt(_div(tl.sum(ss, axis=1), F) + eps)
    tl.store(rstd_ptr + rows, rstd, mask=rmask)
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows[:, None] * syr + cols[None, :] * syf, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_dx(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, R, F, sxr, sxf, sw, sdyr, sdyf, sdxr, sdxf,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        acc += dy * w[None, :] * x
    # dx = rstd * (dy*w - x * rstd^2 * mean(dy*w*x)): the second pass needs the whole row's sum
    c = _div(tl.sum(acc, axis=1), F) * rstd * rstd
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * sw, mask=cols < F, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        dx = rstd[:, None] * (dy * w[None, :] - x * c[:, None])
        tl.store(dx_ptr + rows[:, None] * sdxr + cols[None, :] * sdxf, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_dw(x_ptr, dy_ptr, rstd_ptr, part_ptr, R, F, sxr, sxf, sdyr, sdyf,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """dw partials of one tile of rows: part[program, f] = sum over its rows of dy * x * rstd."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        part = tl.sum(dy * x * rstd[:, None], axis=0)
        tl.store(part_ptr + pid * F + cols, part, mask=cols < F)


@triton.jit
def _backward_dw_last_block(x_ptr, dy_ptr, rstd_ptr, part_ptr, R, F, sxr, sxf, sdyr, sdyf,
                            ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """The planted bug of the backend example-triton-wrong: _backward_dw with its store one indent
    short, after the feature loop, so that only the last feature block's partial is stored."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
    cols = offs
    part = tl.zeros([BLOCK], dtype=tl.float32)
    for f0 in range(0, F, BLOCK):
        cols = f0 + offs
        mask = rmask[:, None] & (cols < F)[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxr + cols[None, :] * sxf, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * sdyr + cols[None, :] * sdyf, mask=mask, other=0.0).to(tl.float32)
        part = tl.sum(dy * x * rstd[:, None], axis=0)
    tl.store(part_ptr + pid * F + cols, part, mask=cols < F)


def rmsnorm_forward(x, w, eps):
    R, F = x.shape
    y = torch.empty((R, F), dtype=x.dtype, device=x.device)
    rstd = torch.empty((R,), dtype=torch.float32, device=x.device)
    _forward[(triton.cdiv(R, ROWS),)](x, w, y, rstd, R, F, eps, *x.stride(), *w.stride(), *y.stride(),
                                      ROWS=ROWS, BLOCK=BLOCK)
    return y, rstd


def rmsnorm_backward(dy, x, w, rstd, dw_kernel=_backward_dw):
    R, F = x.shape
    tiles = triton.cdiv(R, ROWS)
    dx = torch.empty((R, F), dtype=x.dtype, device=x.device)
    _backward_dx[(tiles,)](x, w, dy, rstd, dx, R, F, *x.stride(), *w.stride(), *dy.stride(), *dx.stride(),
                           ROWS=ROWS, BLOCK=BLOCK)
    # dw: float32 partials per row tile, summed in a fixed order (deterministic, no atomics)
    part = torch.empty((tiles, F), dtype=torch.float32, device=x.device)
    dw_kernel[(tiles,)](x, dy, rstd, part, R, F, *x.stride(), *dy.stride(), ROWS=ROWS, BLOCK=BLOCK)
    return dx, part.sum(0).to(w.dtype)


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, dw_kernel):
        y, rstd = rmsnorm_forward(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        ctx.dw_kernel = dw_kernel
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_backward(dy, x, w, rstd, ctx.dw_kernel)
        return dx, dw, None, None


def rmsnorm(x, w, *, eps):
    return {"y": RMSNorm.apply(x, w, eps, _backward_dw)}


def rmsnorm_last_block_dw(x, w, *, eps):
    return {"y": RMSNorm.apply(x, w, eps, _backward_dw_last_block)}
