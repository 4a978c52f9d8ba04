"""Launch helpers, the autograd Function and the user-facing ``fused_linear_xent`` of the Triton backends.

Two modes (docs/specs/fused_linear_xent.md, "two honest designs"):

* ``fast``, held logits (``holds_logits``: when the whole batch's logits take no more memory than the
  token-chunk design below would): the forward forms every token's logits with online-LSE partials
  (float32, or for 16-bit inputs float16 offsets from each tile's max: kernels module doc) and keeps
  them; the backward turns them into dZ in place with the real upstream gradient and finishes
  dhidden = dZ @ W and dweight = dZ^T @ h in one float32-accumulated GEMM each: 6*N*H*V FLOPs for
  every reduction and LSE output, no float32 [V, H] buffer.
* ``fast``, token chunks (larger batches). Per chunk, logits as above, dZ once (in place over the
  logits, in the GEMM dtype), dweight += dZ^T @ h into a float32 [V, H] buffer and
  dhidden = dZ @ W: 6*N*H*V FLOPs. With reduction mean/sum and no LSE output the gradients are
  formed in the forward with the upstream gradient g folded out and scaled by g / D in the backward;
  otherwise (per-token or LSE upstream gradients) the backward runs the chunks: 8*N*H*V.
* ``lean``: vocabulary outer. The forward is an LSE pass; the backward recomputes the logits of each
  vocabulary slab for all tokens, finishes that slab of dweight in one float32 GEMM over all tokens
  and adds dZ @ W_slab to a float32 [N, H] accumulator: 8*N*H*V FLOPs, no V*H float32 buffer. The
  accumulator lives in dweight's last rows and most slabs' dZ in its rows not yet written (_lean_plan),
  so that the gradients plus one cfg.slab-wide dZ buffer are its memory; the accumulator's slabs are
  recomputed once more for their dweight rows (4N/V * N*H*V FLOPs more for 16-bit inputs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton

from . import kernels as K

Tensor = torch.Tensor
F32 = torch.float32
REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class Gemm:
    """Tile of one GEMM kernel and its launch parameters."""

    BM: int
    BN: int
    BK: int
    GROUP: int
    warps: int = 8
    stages: int = 3
    ksplit: int = 0  # logits: K tiles per tensor-core accumulator chain, 0 = one chain (kernels._mm)


@dataclass(frozen=True)
class Config:
    chunk: int  # tokens per chunk (fast mode, and the forward LSE pass of both modes)
    slab: int  # vocabulary entries per slab of the lean backward whose dZ has a buffer of its own (its memory)
    vblock: int  # vocabulary tile of the dZ pass
    rows: int  # token rows per program of the dZ pass
    logits: Gemm  # logits + LSE partials (both modes' forward, fast backward)
    dw: Gemm  # fast: dweight += dZ^T h over a chunk
    dh: Gemm  # fast: dhidden = dZ W over the vocabulary
    dzg: Gemm  # lean: logits of a slab straight into dZ
    ldw: Gemm  # lean: dweight slab = dZ^T h over all tokens
    ldh: Gemm  # lean: dhidden += dZ W_slab
    dw_small: Gemm | None = None  # fast dweight of a chunk shorter than one K step (see GPU)
    # fast mode, 16-bit inputs: the chunk's logits as float16 offsets from their tile's max (kernels
    # module doc), dZ in place over them; else float32 logits (and for fp16 inputs dZ beside them)
    z16: bool = False
    dz_warps: int = 4  # warps of a dZ-pass program
    rblocks: int = 1  # blocks of ``rows`` tokens per program of the dZ pass (they share a dbias partial row)
    hdw: Gemm | None = None  # held logits (holds_logits): dweight over all tokens at once; None = ldw
    cublas: bool = False  # held logits, bf16 on a GPU: dhidden and dweight by cuBLAS (torch.mm)
    slab_max: int = 0  # lean: widest slab whose dZ goes into dweight rows not written yet (0: slab; _lean_plan)


# Interpreter blocks are small so that the CPU sizes of the tests and presets span several of each.
# adapter.py repeats BLOCK_N / BLOCK_V / BLOCK_H (it must not import this module); a test checks it.
INTERPRETER = Config(chunk=16, slab=128, vblock=128, rows=16, logits=Gemm(16, 128, 16, 2),
                     dw=Gemm(128, 16, 16, 1), dh=Gemm(16, 16, 64, 2), dzg=Gemm(16, 128, 16, 2),
                     ldw=Gemm(128, 16, 16, 1), ldh=Gemm(16, 16, 64, 2), slab_max=256)
# Picked on an H200 at N=8192, H=4096, V=128256 (bf16) from interleaved timings of the whole pass;
# persistent grids were slower there (the dweight kernel's running-sum read then stalls each tile).
# Per-kernel do_bench at one 2048-token chunk (H200, triton 3.6): logits 128x256x64 w8 s3 3.96 ms
# (s4 4.10, 256x128 4.17, 128x128 4.61); dweight (running-sum mode) 128x256x64 G8 w8 s4 4.40 ms
# (256x128x64 G1 w8 s3 4.55); dhidden 128x256x64 G8 w8 s3 3.15 ms (128x128 3.91, 256x128 3.65).
# chunk: 4096 tokens of float16 logit offsets take the memory that 2048 of float32 logits took, and
# halve the float32 dweight read-modify-write passes (dweight was 18.6 ms of 49.5 in fast mode's
# fwd+bwd, N=8192, H=4096, V=128256 on an H100, at 2048 tokens of float32 logits).
GPU = Config(chunk=4096, slab=4096, vblock=128, rows=8, logits=Gemm(128, 128, 64, 16, 8, 4, ksplit=4),
             dw=Gemm(128, 256, 64, 8, 8, 4), dh=Gemm(128, 256, 64, 16), dzg=Gemm(128, 256, 64, 8),
             ldw=Gemm(128, 256, 64, 1), ldh=Gemm(128, 256, 64, 8), dw_small=Gemm(256, 128, 64, 1, 8, 3),
             z16=True, dz_warps=1, rblocks=16, hdw=Gemm(128, 256, 64, 8, 8, 4), cublas=True, slab_max=16384)
# Held logits (the default at N=8192, H=4096, V=128256, bf16; .ci/flx-ab on an H100, each kernel alone, median
# of do_bench): dZ pass 128 columns x 8 rows x 16 row blocks on 1 warp 1.59 ms (2 warps 1.78; 128x4x32 1.59;
# 256x16x8 on 4 warps 2.59; 128x32x4 1.87; 512x16x8 on 8 warps 3.14; a torch copy of the buffer 2.94); dweight
# over all 8192 tokens 128x256 G8 s4 11.64-11.67 ms (the lean tile G1 s3 12.31-12.66, 256x128 12.21-12.28);
# dhidden G16 11.11-11.57 ms, G8 11.11-11.23, G4 11.33.
# dw_small: a chunk of one token makes Triton specialize T = 1, and that build of the 128x256 s4
# dweight kernel wants 320 KB of shared memory (sm_90 allows 227 KB; seen as OutOfResources at
# N=1 on an H200); the 256x128 s3 tile needs 208 KB there. Used for chunks shorter than dw.BK.
# logits: 16-bit inputs split the tensor-core accumulation chain every 4 K tiles (kernels._mm, KS). Hopper's
# MMA truncates its accumulation, and that bias, the same sign on every token, survives the mean over
# tokens: with one chain the bf16 loss was at 2.47x its bound at N=8192, H=2048, V=2 and 1.52x at
# N=1000, H=4096, V=1000 (fp16, split every 16 tiles: 1.41x); split every 4 tiles both are at 0.25x and
# 0.07x (every 8: 0.69x). Two float32 accumulators need the smaller 128x128 tile (at 128x256 they
# spill). Measured on an H200 (N=8192, H=4096, V=128256, bf16, fwd+bwd, torch with bf16 logits 41.3
# ms): fast 49.4 -> 53.2 ms, lean 59.8 -> 64.1 ms; the logits would be fast and wrong otherwise.
# At one 2048-token chunk (H200, .scratch run, bitwise-equal logits): this tile 4.85 ms (444 TFLOP/s); the
# same 256-wide chains as 128x128x128 KS=2: 3 stages 4.92, 2 stages 5.91; 5 stages 5.02; GROUP 8 4.94.
# fp16 inputs keep float32 logits: with fp16 dZ (2^-11) the offsets' error (up to (m - z) * 2^-11) is as
# large as dZ's own rounding; on the CPU sweep it raised the worst fp16 dweight ratio from 0.39 to 0.58
GPU_F16 = dataclasses.replace(GPU, chunk=2048, z16=False, cublas=False)
# float32 operands: ieee dots run on the FMA units, where small tiles do as well and fit the registers
_F32 = Gemm(64, 64, 32, 8, 4, 3)
GPU_FP32 = Config(chunk=2048, slab=8192, vblock=256, rows=16, logits=_F32, dw=_F32, dh=_F32, dzg=_F32,
                  ldw=_F32, ldh=_F32, rblocks=8)


def default_config(device: torch.device, dtype: torch.dtype) -> Config:
    if device.type != "cuda":
        return INTERPRETER
    return GPU_FP32 if dtype == torch.float32 else GPU_F16 if dtype == torch.float16 else GPU


@dataclass
class _Opts:
    ignore_index: int
    reduction: str
    eps: float
    lam: float
    cap: float | None
    normalizer: float | None

    def row_args(self, V: int) -> tuple:
        return self.ignore_index, self.eps, self.lam, 1.0 / V, float(self.cap or 1.0)


@dataclass
class _Grad:
    """Upstream gradients of one backward pass, as the dZ kernels and GEMM epilogues take them."""

    g: Tensor  # scalar (mean/sum) or [N] (none)
    glse: Tensor | None
    den: Tensor  # D of the mean (1 for sum/none), from the forward
    fold: bool  # g / D applied to the finished float32 sums instead of to dZ

    def dz_args(self, t0: int) -> tuple[tuple, dict]:
        rows = self.g.dim() == 1
        g = self.g[t0:] if rows else self.g
        gl = self.glse[t0:] if self.glse is not None else g
        return (g, gl, self.den), (g.stride(0) if rows else 0, gl.stride(0) if gl.dim() else 0), \
            dict(G_ROWS=rows, SCALED=not self.fold, HAS_GLSE=self.glse is not None)

    def scale_args(self) -> tuple[Tensor, Tensor]:
        return self.g, self.den


def _or(t: Tensor | None, dummy: Tensor) -> Tensor:
    """Absent optional tensors are passed as a dummy pointer that the kernel's flags never touch."""
    return t if t is not None else dummy


def _s0(t: Tensor | None) -> int:
    return t.stride(0) if t is not None else 0


def _launch(kernel, grid, gemm: Gemm | None, *args, **const) -> None:
    if gemm is not None:
        const.update(BM=gemm.BM, BN=gemm.BN, BK=gemm.BK, GROUP=gemm.GROUP, num_warps=gemm.warps,
                     num_stages=gemm.stages)
    kernel[grid](*args, **const)


def _grid(M: int, N: int, g: Gemm) -> tuple[int]:
    """One program per output tile (kernels._tile_ids)."""
    return (triton.cdiv(M, g.BM) * triton.cdiv(N, g.BN),)


# float32 inputs get true float32 products (no TF32); 16-bit inputs ignore it
PREC = "ieee"


def _tma_ok(*ts: Tensor) -> bool:
    """Whether the copy engine can read these operands: a Hopper GPU, 16-bit, rows contiguous, 16-byte
    aligned rows and bases (else the kernels load through pointers)."""
    t0 = ts[0]
    return (t0.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.get_device_capability(t0.device)[0] >= 9
            and all(t.dtype in (torch.bfloat16, torch.float16) and t.stride(1) == 1
                    and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in ts))


def _tma_args(*pairs: tuple[Tensor, list[int]]) -> tuple[list[Any], bool]:
    """GEMM operands as TMA tensor descriptors of these blocks where the copy engine can read them all,
    else as they are (the kernels' pointer loads); and which it is."""
    ts = [t for t, _ in pairs]
    if not _tma_ok(*ts):
        return ts, False
    from triton.tools.tensor_descriptor import TensorDescriptor

    return [TensorDescriptor.from_tensor(t, block) for t, block in pairs], True


def _logits(h, W, b, y, z, st, o: _Opts, cfg: Config) -> None:
    (T, H), V, g = h.shape, W.shape[0], cfg.logits
    pm, ps, pz, zy = st
    (ha, wa), tma = _tma_args((h, [g.BM, g.BK]), (W, [g.BN, g.BK]))
    _launch(K._logits_kernel, _grid(T, V, g), g, ha, wa, _or(b, pm), y, _or(z, pm), pm, ps, pz, zy,
            T, V, H, h.stride(0), h.stride(1), W.stride(0), W.stride(1), _s0(b), y.stride(0), _s0(z), pm.stride(0),
            float(o.cap or 1.0), HAS_BIAS=b is not None, SOFTCAP=o.cap is not None, STORE_Z=z is not None,
            EVEN_K=H % g.BK == 0, PREC=PREC, KS=_ksplit(g, H), TMA=tma, SMOOTH=o.eps != 0)


def _ksplit(g: Gemm, H: int) -> int:
    """K tiles per accumulator chain: g.ksplit, but at least two chains when H fits one (H = 256: the
    bf16 loss of N=1000, V=32000, scale 5 stood at 1.05x its bound on an H100 with one chain)."""
    tiles = triton.cdiv(H, g.BK)
    return max(1, tiles // 2) if 0 < tiles <= g.ksplit else g.ksplit


def _row_stats(st, y, lse, lt, V: int, o: _Opts) -> None:
    pm, ps, pz, zy = st
    T = y.shape[0]
    _launch(K._row_stats_kernel, (triton.cdiv(T, 16),), None, pm, ps, pz, zy, y, lse, lt, T, pm.shape[1],
            pm.stride(0), y.stride(0), o.ignore_index, o.eps, o.lam, 1.0 / V, BR=16, BT=64, SMOOTH=o.eps != 0,
            num_warps=4)


def _partials(T: int, V: int, o: _Opts, cfg: Config, device: torch.device) -> list[Tensor]:
    """Per logits tile of T tokens: row max, sum-exp and (label smoothing only) sum of the logits; and the
    target logit per token."""
    nt = triton.cdiv(V, cfg.logits.BN)
    pm, ps = (torch.empty((T, nt), dtype=F32, device=device) for _ in range(2))
    pz = torch.empty((T, nt), dtype=F32, device=device) if o.eps != 0 else pm  # pm: never read then
    return [pm, ps, pz, torch.empty((T,), dtype=F32, device=device)]


def _dw(dz, h, acc, out, gr: _Grad | None, mode: int, g: Gemm) -> None:
    """dweight rows of dZ's vocabulary range: into ``acc`` (float32, mode 0/1) or ``out`` (mode 2)."""
    (T, H), V = h.shape, _or(acc, out).shape[0]
    dummy = _or(acc, out)
    g_ptr, den_ptr = gr.scale_args() if gr is not None else (dummy, dummy)
    (da, ha), tma = _tma_args((dz[:T], [g.BK, g.BM]), (h, [g.BK, g.BN]))
    _launch(K._dw_kernel, _grid(V, H, g), g, da, ha, dummy, _or(out, dummy), g_ptr, den_ptr, V, H, T,
            dz.stride(0), h.stride(0), h.stride(1), _s0(acc), _s0(out), MODE=mode,
            APPLY_G=gr is not None and gr.fold, EVEN_K=T % g.BK == 0, PREC=PREC, TMA=tma)


def _dh(dz, W, acc, out, gr: _Grad | None, mode: int, g: Gemm) -> None:
    """dhidden = dZ @ W over W's rows: modes of kernels._dh_kernel."""
    T, (V, H) = _or(acc, out).shape[0], W.shape
    dummy = _or(acc, out)
    g_ptr, den_ptr = gr.scale_args() if gr is not None else (dummy, dummy)
    (da, wa), tma = _tma_args((dz[:T], [g.BM, g.BK]), (W, [g.BK, g.BN]))
    _launch(K._dh_kernel, _grid(T, H, g), g, da, wa, dummy, _or(out, dummy), g_ptr, den_ptr, T, H, V,
            dz.stride(0), W.stride(0), W.stride(1), _s0(acc), _s0(out), MODE=mode,
            APPLY_G=gr is not None and gr.fold, EVEN_K=V % g.BK == 0, PREC=PREC, TMA=tma)


def _colsum(part, rows: int, acc, accumulate: bool) -> None:
    V = acc.shape[0]
    _launch(K._colsum_kernel, (triton.cdiv(V, 256),), None, part, acc, rows, V, part.stride(0),
            ACCUM=accumulate, BR=8, BV=256, num_warps=4)


def _cast(src: Tensor, dtype: torch.dtype, gr: _Grad) -> Tensor:
    out = torch.empty(src.shape, dtype=dtype, device=src.device)
    n = src.numel()
    _launch(K._cast_kernel, (triton.cdiv(n, 4096),), None, src, out, n, *gr.scale_args(), APPLY_G=gr.fold,
            BLOCK=4096, num_warps=8)
    return out


def _dbias_partials(T: int, V: int, cfg: Config, device: torch.device) -> Tensor:
    """One float32 row of dbias partials per program of the dZ pass (cfg.rows * cfg.rblocks tokens)."""
    return torch.empty((triton.cdiv(T, cfg.rows * cfg.rblocks), V), dtype=F32, device=device)


def _dz_pass(z, pm, dz, y, lse, gr: _Grad, t0: int, dbp, o: _Opts, cfg: Config) -> None:
    """Logits (or float16 offsets from the tile maxima ``pm``) of T tokens -> dZ, in place where dz views z;
    with ``dbp``, the dbias partials. ``y`` and ``lse`` start at token t0 of the batch, as ``gr`` is cut."""
    T, V = z.shape
    ptrs, strides, flags = gr.dz_args(t0)
    _launch(K._dz_chunk_kernel, (triton.cdiv(T, cfg.rows * cfg.rblocks), triton.cdiv(V, cfg.vblock)), None,
            z, pm, dz, y, lse, *ptrs, _or(dbp, pm), T, V, z.stride(0), pm.stride(0), dz.stride(0), y.stride(0),
            *strides, _s0(dbp), *o.row_args(V), SOFTCAP=o.cap is not None, HAS_BIAS=dbp is not None,
            ZBN=cfg.logits.BN, BR=cfg.rows, BV=cfg.vblock, RB=cfg.rblocks, num_warps=cfg.dz_warps, **flags)


def _logit_layout(V: int, dtype: torch.dtype, cfg: Config) -> tuple[int, torch.dtype, bool]:
    """Row length (V padded to 64 entries: 16-bit dZ rows stay 16-byte aligned for the copy engine whatever V
    is), dtype of the fast mode's logits buffer, and whether dZ needs a buffer of its own (sizes differ)."""
    zdtype = torch.float16 if cfg.z16 and dtype != F32 else F32
    separate = zdtype.itemsize != dtype.itemsize
    return triton.cdiv(V, 64) * 64, zdtype, separate


def _logit_buffers(T: int, V: int, dtype: torch.dtype, cfg: Config, device: torch.device) -> tuple[Tensor, Tensor]:
    """The [T, V] logits buffer of the fast mode and dZ over it (the same memory where the dtypes' sizes
    agree, else a second buffer)."""
    Vp, zdtype, separate = _logit_layout(V, dtype, cfg)
    z = torch.empty((T, Vp), dtype=zdtype, device=device)[:, :V]
    dz = torch.empty((T, Vp), dtype=dtype, device=device)[:, :V] if separate else z.view(dtype)
    return z, dz


def logits_bytes_per_token(V: int, dtype: torch.dtype, cfg: Config) -> int:
    """Bytes one token's row takes in the fast mode's logits and dZ buffers."""
    Vp, zdtype, separate = _logit_layout(V, dtype, cfg)
    return Vp * (zdtype.itemsize + (dtype.itemsize if separate else 0))


def holds_logits(T: int, V: int, H: int, dtype: torch.dtype, cfg: Config) -> bool:
    """Whether the fast mode keeps the whole batch's logits from the forward to the backward: when they
    take no more memory than the token-chunk design's float32 [V, H] dweight buffer beside one chunk's
    logits (so peak memory stays O(chunk * V + V * H), docs/specs/fused_linear_xent.md). The backward then
    forms dZ with the real upstream gradient and finishes dweight and dhidden in one GEMM each over all
    tokens: no float32 buffer, no read-modify-write passes, no casts, 6*N*H*V FLOPs for every reduction and
    LSE output."""
    row = logits_bytes_per_token(V, dtype, cfg)
    return T <= cfg.chunk or T * row <= V * H * 4 + cfg.chunk * row


@dataclass
class _Held:
    """What the forward keeps for a held-logits backward (holds_logits)."""

    z: Tensor  # [T, V] logits, or float16 offsets from the tile maxima
    dz: Tensor  # dZ's buffer: a view of z where the sizes agree
    pm: Tensor  # [T, V tiles] tile maxima (the offsets' base)


def _held_forward(h, W, b, y, o: _Opts, cfg: Config, lse, lt) -> _Held:
    (T, _), V = h.shape, W.shape[0]
    z, dz = _logit_buffers(T, V, h.dtype, cfg, h.device)
    st = _partials(T, V, o, cfg, h.device)
    _logits(h, W, b, y, z, st, o, cfg)
    _row_stats(st, y, lse, lt, V, o)
    return _Held(z, dz, st[0])


def _held_backward(held: _Held, h, W, b, y, lse, gr: _Grad, o: _Opts, cfg: Config):
    (T, _), V = h.shape, W.shape[0]
    dbp = _dbias_partials(T, V, cfg, h.device) if b is not None else None
    cublas = cfg.cublas and h.is_cuda and h.dtype == torch.bfloat16
    if cublas:
        # g / D goes into dZ before its rounding (bf16 has float32's exponent range: nothing underflows), so
        # the GEMMs need no scale
        gr = dataclasses.replace(gr, fold=False)
    _dz_pass(held.z, held.pm, held.dz, y, lse, gr, 0, dbp, o, cfg)
    dz = held.dz
    if cublas:
        with _float32_reductions():
            dh, dw = torch.mm(dz, W), torch.mm(dz.t(), h)
    else:
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        _dh(dz, W, None, dh, gr, 2, cfg.dh)
        dw = torch.empty(W.shape, dtype=W.dtype, device=W.device)
        _dw(dz, h, None, dw, gr, 2, _dw_tile(cfg.hdw or cfg.ldw, T, cfg))
    return dh, dw, _dbias(dbp, b, gr)


@contextlib.contextmanager
def _float32_reductions():
    """cuBLAS bf16 GEMMs that reduce in float32 only: torch lets cuBLAS reduce split-K partials in bf16
    unless told otherwise, which would break the float32 accumulation of dweight and dhidden."""
    m = torch.backends.cuda.matmul
    saved = m.allow_bf16_reduced_precision_reduction
    m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_bf16_reduced_precision_reduction = saved


def _dbias(dbp: Tensor | None, b: Tensor | None, gr: _Grad) -> Tensor | None:
    """dbias from the dZ passes' float32 partials (scaled by g / D where the gradient was folded out)."""
    if b is None:
        return None
    db32 = torch.empty((b.shape[0],), dtype=F32, device=b.device)
    _colsum(dbp, dbp.shape[0], db32, accumulate=False)
    return _cast(db32, b.dtype, gr)


def _dw_tile(g: Gemm, T: int, cfg: Config) -> Gemm:
    """The dweight tile for T tokens: cfg.dw_small where T is shorter than one K step (see GPU)."""
    return cfg.dw_small if cfg.dw_small is not None and T < g.BK else g


def _chunks(h, W, b, y, o: _Opts, cfg: Config, lse, lt, gr: _Grad | None = None, dh=None, dh_mode=0, zy=None):
    """The token-chunk pass: LSE and per-token loss, and with ``gr`` the fast-mode gradients
    (dhidden rows into ``dh``: float32 with dh_mode 0, the output with dh_mode 2); with ``zy`` [T], each
    token's target logit as the forward's GEMM formed it (the lean backward's; ignored tokens left unwritten).

    Returns the float32 dweight and dbias accumulators (None without ``gr``)."""
    T, V = h.shape[0], W.shape[0]
    C = min(cfg.chunk, T)
    st = _partials(C, V, o, cfg, h.device)
    z = dz = dbp = dw = db = None
    if gr is not None:
        z, dz = _logit_buffers(C, V, h.dtype, cfg, h.device)
        dw = torch.empty(W.shape, dtype=torch.float32, device=h.device)  # dweight: float32 across chunks
        if b is not None:
            dbp = _dbias_partials(C, V, cfg, h.device)
            db = torch.empty((V,), dtype=F32, device=h.device)
    for t0 in range(0, T, C):
        c = min(C, T - t0)
        hc, yc = h[t0:t0 + c], y[t0:t0 + c]
        _logits(hc, W, b, yc, z, st, o, cfg)
        _row_stats(st, yc, lse[t0:t0 + c], lt[t0:t0 + c], V, o)
        if zy is not None:
            zy[t0:t0 + c].copy_(st[3][:c])
        if gr is None:
            continue
        _dz_pass(z[:c], st[0], dz[:c], yc, lse[t0:], gr, t0, dbp, o, cfg)
        _dw(dz, hc, dw, None, None, 0 if t0 == 0 else 1, _dw_tile(cfg.dw, c, cfg))
        _dh(dz, W, dh[t0:t0 + c] if dh_mode == 0 else None, dh[t0:t0 + c] if dh_mode == 2 else None,
            gr, dh_mode, cfg.dh)
        if b is not None:
            _colsum(dbp, triton.cdiv(c, cfg.rows * cfg.rblocks), db, accumulate=t0 > 0)
    return dw, db


@dataclass(frozen=True)
class _LeanStep:
    """One vocabulary slab of the lean backward: its logits recomputed into dZ, then dhidden's share
    (``dh``: dZ @ W_slab into the float32 accumulator, and the slab's dbias) and/or its dweight rows (``dw``).
    dZ goes into dweight rows from ``scratch`` on (rows no step has written yet, nor the accumulator's), or
    with ``scratch`` None into the dZ buffer of Config.slab columns."""

    v0: int
    s: int
    dh: bool
    dw: bool
    scratch: int | None = None


@dataclass(frozen=True)
class _LeanPlan:
    t0: int  # the accumulator's first dweight row (V: a buffer of its own, or none with one slab)
    steps: tuple[_LeanStep, ...]

    @property
    def accumulates(self) -> bool:
        """Whether dhidden has several shares to sum (in the accumulator), not one written straight."""
        return sum(st.dh for st in self.steps) > 1

    @property
    def buffer_cols(self) -> int:
        """Columns of the dZ buffer that the steps without dweight scratch need (0: none)."""
        return max((st.s for st in self.steps if st.scratch is None), default=0)

    @property
    def widest(self) -> int:
        return max(st.s for st in self.steps)


def dh_acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The lean backward's dhidden sum over vocabulary slabs:
    float32 whatever the inputs (docs/specs/fused_linear_xent.md)."""
    return F32


def _accumulator_row(T: int, H: int, V: int, dtype: torch.dtype) -> int:
    """The first of dweight's last rows (``dtype``, as the inputs) that can hold the lean backward's [T, H]
    dhidden accumulator, 16-byte aligned for the copy engine and cuBLAS; 0 where dweight is too short."""
    esz = dtype.itemsize
    t0 = V - -(-T * dh_acc_dtype(dtype).itemsize // esz)
    while t0 > 0 and (t0 * H * esz) % 16:
        t0 -= 1
    return max(t0, 0)


def _dh_accumulator(dw: Tensor, T: int, t0: int) -> Tensor:
    """The float32 [T, H] dhidden accumulator of the lean backward: in dweight's rows [t0, V), which the plan
    writes last, so that it costs no memory of its own (0.13 GB at N=8192, H=4096: the lean target of 1.2 GB
    leaves 83 MB beside the gradients); a buffer of its own where t0 is V (dweight too short to hold it)."""
    (V, H), acc = dw.shape, dh_acc_dtype(dw.dtype)
    if t0 == V:
        return torch.empty((T, H), dtype=acc, device=dw.device)
    return dw.view(-1)[t0 * H:t0 * H + T * H * acc.itemsize // dw.element_size()].view(acc).view(T, H)


def _slabs(v0: int, v1: int, room, T: int, H: int, S: int, wide: int) -> list[tuple[int, int, int | None]]:
    """Slabs covering [v0, v1) in order, each (start, width, scratch row). ``room(v, s)`` gives the free dweight
    rows [lo, hi) that a slab [v, v + s) may put its dZ in (its last T*s/H rows); a slab takes the widest
    width up to ``wide`` whose dZ fits there (a multiple of 64: aligned rows), else S columns of the buffer."""
    out = []
    while v0 < v1:
        s = min(wide, v1 - v0)
        while s > 0:
            lo, hi = room(v0, s)
            rows = -(-T * s // H)
            if hi - lo >= rows and s >= min(S, v1 - v0):
                out.append((v0, s, hi - rows))
                break
            s = (s - 1) // 64 * 64
        else:
            s = min(S, v1 - v0)
            out.append((v0, s, None))
        v0 += s
    return out


def _lean_plan(T: int, H: int, V: int, dtype: torch.dtype, cfg: Config) -> _LeanPlan:
    """The lean backward's slabs in order. The accumulator's rows [t0, V) of dweight go first, for dhidden only,
    their dZ in the (all free) rows below t0; every other slab does both, its dZ in rows above it that are still
    free; after the last dhidden share (which casts the accumulator into dhidden) the accumulator's slabs come
    back for their dweight rows, their logits recomputed: (V - t0) / V of one more logits pass buys the
    accumulator's memory. Wide slabs through dweight's free rows cut the passes over the float32 accumulator;
    the last ones, where too few rows are free, use the dZ buffer (cfg.slab columns: the memory it costs)."""
    S = min(cfg.slab, V)
    wide = max(cfg.slab_max, S)
    if V <= S:
        return _LeanPlan(V, (_LeanStep(0, V, True, True),))
    t0 = _accumulator_row(T, H, V, dtype) or V
    below = lambda v, s: (0, t0)  # noqa: E731  (the accumulator's slabs: every row under t0 is free)
    above = lambda v, s: (v + s, t0)  # noqa: E731
    after = lambda v, s: (v + s, V)  # noqa: E731  (once dhidden is cast, the accumulator's rows are free)
    tail = _slabs(t0, V, below, T, H, S, wide)
    head = _slabs(0, t0, above, T, H, S, wide)
    again = _slabs(t0, V, after, T, H, S, wide)
    return _LeanPlan(t0, tuple([_LeanStep(v, s, True, False, r) for v, s, r in tail]
                               + [_LeanStep(v, s, True, True, r) for v, s, r in head]
                               + [_LeanStep(v, s, False, True, r) for v, s, r in again]))


def lean_extra_bytes(T: int, H: int, V: int, dtype: torch.dtype, cfg: Config, bias: bool = True) -> int:
    """Bytes the lean backward allocates beside dhidden, dweight and dbias: the dZ buffer, the dbias partials
    and their float32 sum, and the accumulator where dweight cannot hold it."""
    plan = _lean_plan(T, H, V, dtype, cfg)
    extra = T * plan.buffer_cols * dtype.itemsize
    if bias:
        extra += (triton.cdiv(T, cfg.dzg.BM) * plan.widest + V) * 4
    if plan.t0 == V and plan.accumulates:
        extra += T * H * dh_acc_dtype(dtype).itemsize
    return extra


def _lean_backward(h, W, b, y, lse, zy, gr: _Grad, o: _Opts, cfg: Config):
    (T, H), V, g = h.shape, W.shape[0], cfg.dzg
    cublas = cfg.cublas and h.is_cuda and h.dtype == torch.bfloat16
    if cublas:  # as in _held_backward: g / D into dZ, so that the GEMMs need no scale
        gr = dataclasses.replace(gr, fold=False)
    plan = _lean_plan(T, H, V, h.dtype, cfg)
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    dw = torch.empty(W.shape, dtype=W.dtype, device=W.device)
    acc = _dh_accumulator(dw, T, plan.t0) if plan.accumulates else None
    buf = torch.empty((T, plan.buffer_cols), dtype=h.dtype, device=h.device) if plan.buffer_cols else None
    flat = dw.view(-1)
    # the slab's dbias partials (one float32 row per token block) and their sums
    dbp = torch.empty((triton.cdiv(T, g.BM), plan.widest), dtype=F32, device=h.device) if b is not None else None
    db32 = torch.empty((V,), dtype=F32, device=h.device) if b is not None else None
    dh_steps = [i for i, st in enumerate(plan.steps) if st.dh]
    for i, st in enumerate(plan.steps):
        v0, s = st.v0, st.s
        Ws = W[v0:v0 + s]
        dz = buf[:, :s] if st.scratch is None else flat[st.scratch * H:st.scratch * H + T * s].view(T, s)
        _dz_slab(h, Ws, b[v0:v0 + s] if b is not None else None, y, lse, zy, dz, dbp, v0, V, gr, o, g)
        if st.dw:
            _lean_dw(dz, h, dw[v0:v0 + s], gr, cfg, cublas)
        if st.dh:
            if b is not None:
                _colsum(dbp[:, :s], dbp.shape[0], db32[v0:v0 + s], accumulate=False)
            _lean_dh(dz, Ws, acc, dh, gr, cfg, cublas, first=i == dh_steps[0], last=i == dh_steps[-1])
    return dh, dw, _cast(db32, b.dtype, gr) if b is not None else None


def _dz_slab(h, Ws, bs, y, lse, zy, dz, dbp, v0: int, V: int, gr: _Grad, o: _Opts, g: Gemm) -> None:
    """The logits of vocabulary entries [v0, v0 + s) for all tokens, turned into dZ (the first s columns of
    ``dz``), the target's from the forward (``zy``); with a bias, the slab's dbias partials into ``dbp``."""
    T, H = h.shape
    s = Ws.shape[0]
    ptrs, strides, flags = gr.dz_args(0)
    (ha, wa), tma = _tma_args((h, [g.BM, g.BK]), (Ws, [g.BN, g.BK]))
    _launch(K._dz_gemm_kernel, _grid(T, s, g), g, ha, wa, _or(bs, dz), y, lse, zy, *ptrs, dz, _or(dbp, dz),
            T, s, H, v0, h.stride(0), h.stride(1), Ws.stride(0), Ws.stride(1), _s0(bs), y.stride(0), *strides,
            dz.stride(0), _s0(dbp), *o.row_args(V), HAS_BIAS=bs is not None, SOFTCAP=o.cap is not None,
            EVEN_K=H % g.BK == 0, PREC=PREC, TMA=tma, **flags)


def _lean_dw(dz, h, dw_slab, gr: _Grad, cfg: Config, cublas: bool) -> None:
    """One slab of dweight in one GEMM over all tokens, float32-accumulated (cuBLAS for bf16 on a GPU)."""
    if cublas:
        with _float32_reductions():
            torch.mm(dz.t(), h, out=dw_slab)
        return
    _dw(dz, h, None, dw_slab, gr, 2, cfg.ldw)


def _lean_dh(dz, Ws, acc, dh, gr: _Grad, cfg: Config, cublas: bool, first: bool, last: bool) -> None:
    """dhidden's share of one slab: added to the float32 ``acc`` (stored by the first share), which the last
    share casts into ``dh``; with no accumulator (one slab) straight into ``dh``. On cuBLAS the sum runs in
    the GEMM's own epilogue (addmm with a float32 output, beta 0 for the first share)."""
    if cublas:
        with _float32_reductions():
            if acc is None:
                torch.mm(dz, Ws, out=dh)
                return
            torch.addmm(acc, dz, Ws, out_dtype=acc.dtype, beta=0.0 if first else 1.0, out=acc)
        if last:
            dh.copy_(acc)
        return
    mode = 2 if acc is None else 0 if first else 3 if last else 1
    _dh(dz, Ws, acc, dh if mode >= 2 else None, gr, mode, cfg.ldh)


class FusedLinearXent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, o: _Opts,
                lean: bool, cfg: Config, return_lse: bool) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        T = hidden.shape[0]
        dev = hidden.device
        lse = torch.empty((T,), dtype=F32, device=dev)
        lt = torch.empty((T,), dtype=F32, device=dev)
        den = torch.empty((), dtype=F32, device=dev)
        loss = torch.empty((), dtype=F32, device=dev)
        ctx.pre = ctx.held = ctx.zy = None
        wants = any(ctx.needs_input_grad[:3])
        if wants and not lean and holds_logits(T, weight.shape[0], hidden.shape[1], hidden.dtype, cfg):
            ctx.held = _held_forward(hidden, weight, bias, targets, o, cfg, lse, lt)
        elif wants and not lean and o.reduction != "none" and not return_lse:
            # gradients now, with g folded out: the logits are formed once (6*N*H*V)
            dh32 = torch.empty(hidden.shape, dtype=F32, device=dev)
            unit = _Grad(loss, None, den, fold=True)  # g and D are read only by the backward's casts
            dw32, db32 = _chunks(hidden, weight, bias, targets, o, cfg, lse, lt, unit, dh32, 0)
            ctx.pre = (dh32, dw32, db32)
        else:
            # the lean backward takes the target logits as this GEMM formed them (_dz_gemm_kernel)
            ctx.zy = torch.empty((T,), dtype=F32, device=dev) if wants and lean else None
            _chunks(hidden, weight, bias, targets, o, cfg, lse, lt, zy=ctx.zy)
        _launch(K._loss_kernel, (1,), None, lt, targets, loss, den, T, targets.stride(0), o.ignore_index,
                float(o.normalizer or 0.0), MEAN=o.reduction == "mean", HAS_NORM=o.normalizer is not None,
                BLOCK=1024, num_warps=4)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, den)
        ctx.o, ctx.lean, ctx.cfg = o, lean, cfg
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        return (lt if o.reduction == "none" else loss), lse

    @staticmethod
    def backward(ctx, g_loss: Tensor | None, g_lse: Tensor | None):
        hidden, weight, bias, targets, lse, den = ctx.saved_tensors
        o = ctx.o
        if g_loss is None:
            g_loss = torch.zeros(lse.shape if o.reduction == "none" else (), dtype=F32, device=lse.device)
        gr = _Grad(g_loss, g_lse, den, fold=o.reduction != "none" and g_lse is None)
        if ctx.held is not None:
            held, ctx.held = ctx.held, None  # dZ overwrites the logits: a second backward recomputes them
            dh, dw, db = _held_backward(held, hidden, weight, bias, targets, lse, gr, o, ctx.cfg)
        elif ctx.pre is not None:
            dh32, dw32, db32 = ctx.pre
            ctx.pre = None
            dh = _cast(dh32, ctx.dtypes[0], gr)
            del dh32
            dw = _cast(dw32, ctx.dtypes[1], gr)
            del dw32
            db = _cast(db32, ctx.dtypes[2], gr) if db32 is not None else None
        elif ctx.lean:
            dh, dw, db = _lean_backward(hidden, weight, bias, targets, lse, ctx.zy, gr, o, ctx.cfg)
        else:
            dh = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
            lt = torch.empty_like(lse)
            lse2 = torch.empty_like(lse)
            dw32, db32 = _chunks(hidden, weight, bias, targets, o, ctx.cfg, lse2, lt, gr, dh, 2)
            dw = _cast(dw32, weight.dtype, gr)
            del dw32
            db = _cast(db32, bias.dtype, gr) if db32 is not None else None
        need = ctx.needs_input_grad
        return (dh if need[0] else None, dw if need[1] else None, db if need[2] else None,
                None, None, None, None, None)


def fused_linear_xent(hidden: Tensor, weight: Tensor, bias: Tensor | None = None,
                      targets: Tensor | None = None, *, ignore_index: int = -100, reduction: str = "mean",
                      label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                      normalizer: float | None = None, return_lse: bool = False, mode: str = "fast",
                      config: Config | None = None) -> dict[str, Tensor]:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` without materializing the [N, V] logits."""
    if targets is None:
        raise ValueError("fused_linear_xent: targets [N] (int64) is required")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(REDUCTIONS)}")
    if normalizer is not None and reduction != "mean":
        raise ValueError(f"normalizer={normalizer!r} only applies to reduction='mean', got {reduction!r}")
    if mode not in ("fast", "lean"):
        raise ValueError(f"mode={mode!r}: expected 'fast' (6NHV, float32 [V, H] buffer) or 'lean' (8NHV)")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [N, H] and weight [V, H], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    use_norm = normalizer is not None
    o = _Opts(int(ignore_index), reduction, float(label_smoothing), float(z_loss),
              float(softcap) if softcap else None, float(normalizer) if use_norm else None)
    cfg = config or default_config(hidden.device, hidden.dtype)
    loss, lse = FusedLinearXent.apply(hidden, weight, bias, targets, o, mode == "lean", cfg, return_lse)
    return {"loss": loss, "lse": lse} if return_lse else {"loss": loss}


def fused_linear_xent_fast(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                           **options) -> dict[str, Tensor]:
    return fused_linear_xent(hidden, weight, bias, targets, mode="fast", **options)


def fused_linear_xent_lean(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                           **options) -> dict[str, Tensor]:
    return fused_linear_xent(hidden, weight, bias, targets, mode="lean", **options)
