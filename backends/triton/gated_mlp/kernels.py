"""Triton kernels of the gated MLP activations ``swiglu`` and ``geglu`` (docs/kernels/triton-gated_mlp.md).

``out = act(gate) * up``. One program per (row tile of BLOCK_R rows, feature block of BLOCK_F features),
feature blocks fastest; every tensor is addressed through its own strides (any layout, no copies) with
64-bit offsets. The
activation and its derivative are computed in float32 whatever the input dtype; the forward reads gate and
up once and writes out once, the backward reads gate, up and dout once and writes dgate and dup once.

ACT (constexpr): 0 silu, 1 gelu (exact, erf), 2 gelu (tanh approximation).
"""

import triton
import triton.language as tl

ACT_SILU, ACT_GELU, ACT_GELU_TANH = 0, 1, 2

# constants written out in _act: 0.7071067811865476 = 1/sqrt(2), 0.3989422804014327 = 1/sqrt(2 pi),
# 0.7978845608028654 = sqrt(2/pi), 0.044715 the tanh approximation's cubic coefficient


@triton.jit
def _tile(R, F, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """Rows and feature columns of this program's tile (int64) and its mask. Programs run feature blocks
    fastest: consecutive programs take consecutive memory of a row tile (row tiles fastest, they took tiles
    a row apart, 5% slower in the backward on an H200: docs/kernels/triton-gated_mlp.md)."""
    pid = tl.program_id(0)
    blocks = tl.cdiv(F, BLOCK_F)
    rows = (pid // blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % blocks) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < R)[:, None] & (cols < F)[None, :]
    return rows.to(tl.int64), cols.to(tl.int64), mask


@triton.jit
def _tanh_gap(x):
    # 1 - |tanh(x)| = 2q / (1 + q) with q = exp(-2|x|): computed directly, so that 1 + tanh(x) for x < 0 and
    # 1 - tanh(x)^2 keep their digits where tanh saturates (1 - t*t in float32 cancels to 0 or one ulp of 1
    # there); q underflows to 0 instead of exp overflowing
    q = tl.exp(-2.0 * tl.abs(x))
    return 2.0 * q / (1.0 + q)


@triton.jit
def _act(g, ACT: tl.constexpr):
    """(act(g), act'(g)) in float32; g is float32."""
    if ACT == 0:
        s = tl.sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        a = g * cdf
        da = cdf + g * (0.3989422804014327 * tl.exp(-0.5 * g * g))
    else:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        e = _tanh_gap(z)
        one_plus_t = tl.where(z < 0, e, 2.0 - e)
        a = 0.5 * g * one_plus_t
        # 1 - t^2 = (1 - |t|)(1 + |t|) = e (2 - e)
        da = 0.5 * one_plus_t + 0.5 * g * (e * (2.0 - e)) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
    return a, da


@triton.jit
def _fwd_kernel(gate_ptr, up_ptr, out_ptr, R, F, sgr, sgf, sur, suf, sor, sof,
                ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    rows, cols, mask = _tile(R, F, BLOCK_R, BLOCK_F)
    g = tl.load(gate_ptr + rows[:, None] * sgr + cols[None, :] * sgf, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * sur + cols[None, :] * suf, mask=mask, other=0.0).to(tl.float32)
    a, _ = _act(g, ACT)
    tl.store(out_ptr + rows[:, None] * sor + cols[None, :] * sof, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(gate_ptr, up_ptr, dout_ptr, dgate_ptr, dup_ptr, R, F, sgr, sgf, sur, suf, sdr, sdf,
                sdgr, sdgf, sdur, sduf, ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    rows, cols, mask = _tile(R, F, BLOCK_R, BLOCK_F)
    g = tl.load(gate_ptr + rows[:, None] * sgr + cols[None, :] * sgf, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * sur + cols[None, :] * suf, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(dout_ptr + rows[:, None] * sdr + cols[None, :] * sdf, mask=mask, other=0.0).to(tl.float32)
    a, da = _act(g, ACT)
    # dgate = dout * up * act'(gate), dup = dout * act(gate)
    tl.store(dgate_ptr + rows[:, None] * sdgr + cols[None, :] * sdgf, (d * u * da).to(dgate_ptr.dtype.element_ty),
             mask=mask)
    tl.store(dup_ptr + rows[:, None] * sdur + cols[None, :] * sduf, (d * a).to(dup_ptr.dtype.element_ty), mask=mask)
