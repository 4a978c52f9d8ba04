"""softmax_xent in Gluon: the autograd Functions over kernels.xent_rows_kernel.

The structure is the CUDA backend's (backends/cuda/softmax_xent/wrapper.py), so the two compare like for
like: with a gradient wanted under mean or sum, the forward writes dlogits for an upstream gradient of 1
(mode 1) and the backward returns it untouched when g is 1, checked on the device (mode 2 with
SKIP_IF_ONE); otherwise the backward recomputes dlogits from the saved per-row (max, log1p) for the
actual g. Reduction "none" and forwards without a gradient only compute the statistics (mode 0).

In place (``softmax_xent_gluon_inplace``): the forward writes dlogits for g = 1 over the logits for every
reduction, and the backward scales them by g where g is not 1 (mode 3). One backward per forward.

The valid-token count D (mean) and the loss sum are small torch reductions on the device: fixed order,
no host synchronisation.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
REDUCTIONS = ("none", "mean", "sum")

# Launch configuration per element size (bytes): BLOCK_V columns per ring slot (16 KB), STAGES slots,
# consumer warps per program (plus the producer warp), programs per SM, and how the ring is fed (1: a
# producer warp; kernels.py). Measured on an H200 at N = 8192, V = 128256, bf16 (the kernel's docs page):
# the producer warp's best of 22 configurations timed (1.617 ms; the best of the single-partition ring since
# dropped, 1.597 ms, is within 1.3%). float32 takes the same 16 KB slot, not tuned.
CONFIG = {
    2: {"BLOCK_V": 8192, "STAGES": 4, "warps": 16, "per_sm": 1, "ring": 1},
    4: {"BLOCK_V": 4096, "STAGES": 4, "warps": 16, "per_sm": 1, "ring": 1},
}


def tma_ready(t: Tensor) -> bool:
    """Whether TMA can describe the rows of ``t`` [N, V]: 16-byte aligned base and row stride, unit
    column stride."""
    size = t.element_size()
    return (t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * size) % 16 == 0
            and t.shape[0] > 0 and t.shape[1] > 0)


def _descriptor(t: Tensor, block_v: int):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    bits = t.element_size() * 8
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block_v], layout)


def launch(mode: int, src: Tensor, out: Tensor | None, targets: Tensor, ignore_index: int, stats: Tensor,
           row_loss: Tensor, inv: Tensor, g: Tensor, gs: int, eps: float, lam: float, skip_if_one: bool) -> None:
    """One launch of the rows kernel over ``src`` [N, V] (unit column stride)."""
    from .kernels import xent_rows_kernel

    N, V = src.shape
    if N == 0:
        return
    cfg = CONFIG[src.element_size()]
    block_v = max(16 // src.element_size() * 32 * cfg["warps"], min(cfg["BLOCK_V"], _pow2(V)))
    ring = cfg["ring"] if tma_ready(src) else 0
    desc = _descriptor(src, block_v) if ring else None
    sms = torch.cuda.get_device_properties(src.device).multi_processor_count
    grid = (min(N, sms * cfg["per_sm"]),)
    dst = out if out is not None else src
    with torch.cuda.device(src.device):
        xent_rows_kernel[grid](
            desc, src, src.stride(0), dst, dst.stride(0), targets, targets.stride(0), ignore_index, N, V,
            stats, row_loss, inv, g, gs, eps, lam,
            MODE=mode, SKIP_IF_ONE=skip_if_one, RING=ring, SMOOTH=eps != 0.0, BLOCK_V=block_v,
            STAGES=cfg["STAGES"], VEC=16 // src.element_size(), num_warps=cfg["warps"])


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _inverse_denominator(targets: Tensor, ignore_index: int, reduction: str, normalizer: float | None) -> Tensor:
    """1/D on the device: D the valid-token count (mean), the normalizer, or 1."""
    if reduction == "mean" and normalizer is None:
        return 1.0 / (targets != ignore_index).sum().to(torch.float32).reshape(1)
    d = normalizer if reduction == "mean" else 1.0
    return torch.full((1,), 1.0 / d, dtype=torch.float32, device=targets.device)


class SoftmaxXent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, eps: float,
                lam: float, normalizer: float | None, want_grad: bool, inplace: bool) -> Tensor:
        N, V = logits.shape
        dev = logits.device
        inv = _inverse_denominator(targets, ignore_index, reduction, normalizer)
        if inplace:
            dlog = logits if want_grad else None
        else:
            dlog = torch.empty((N, V), dtype=logits.dtype, device=dev) if want_grad and reduction != "none" else None
        stats = torch.empty((N, 2), dtype=torch.float32, device=dev)
        row_loss = torch.empty((N,), dtype=torch.float32, device=dev)
        launch(1 if dlog is not None else 0, logits, dlog, targets, ignore_index, stats, row_loss, inv, inv, 0,
               eps, lam, False)
        ctx.save_for_backward(logits, targets, stats, inv)
        ctx.dlog = dlog
        ctx.opts = (ignore_index, reduction, eps, lam)
        ctx.inplace = inplace
        if reduction == "none":
            return row_loss
        return (row_loss.sum() * inv).reshape(())

    @staticmethod
    def backward(ctx, g: Tensor):
        logits, targets, stats, inv = ctx.saved_tensors
        ignore_index, reduction, eps, lam = ctx.opts
        N, V = logits.shape
        g = g.detach().to(torch.float32)
        per_row = reduction == "none" and N > 0
        gs = g.stride(0) if per_row else 0
        dlog, ctx.dlog = ctx.dlog, None
        if ctx.inplace:
            if dlog is None:
                raise RuntimeError("softmax_xent gluon-inplace: one backward per forward (the forward wrote "
                                   "dlogits over the logits, so a second backward has nothing to recompute "
                                   "from); run the forward again, or use the `gluon` backend")
            launch(3, dlog, dlog, targets, ignore_index, stats, stats, inv, g, gs, eps, lam, not per_row)
            return dlog.detach(), None, None, None, None, None, None, None, None
        # the forward's g = 1 gradient is handed out once; a second backward recomputes into a new buffer
        skip = dlog is not None
        if dlog is None:
            dlog = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
        launch(2, logits, dlog, targets, ignore_index, stats, stats, inv, g, gs, eps, lam, skip)
        return dlog, None, None, None, None, None, None, None, None


def softmax_xent_gluon(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                       label_smoothing: float = 0.0, z_loss: float = 0.0,
                       normalizer: float | None = None) -> dict[str, Tensor]:
    """Cross-entropy of ``logits [N, V]`` (fp32/bf16/fp16, any row stride) against ``targets [N]``.

    Returns {"loss": float32 scalar, or [N] for reduction "none"}. All targets ignored under "mean"
    without a normalizer: loss NaN, gradient exactly 0.
    """
    return _softmax_xent(logits, targets, ignore_index, reduction, label_smoothing, z_loss, normalizer, False)


def softmax_xent_gluon_inplace(logits: Tensor, targets: Tensor, *, ignore_index: int = -100,
                               reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                               normalizer: float | None = None) -> dict[str, Tensor]:
    """softmax_xent_gluon, writing dlogits over ``logits`` in the forward when a gradient is wanted (the
    logits' values are gone afterwards; a layout with a column stride other than 1 is first copied, and
    that copy is written instead)."""
    return _softmax_xent(logits, targets, ignore_index, reduction, label_smoothing, z_loss, normalizer, True)


def _softmax_xent(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                  z_loss: float, normalizer: float | None, inplace: bool) -> dict[str, Tensor]:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(REDUCTIONS)}")
    if normalizer is not None and reduction != "mean":
        raise ValueError(f"normalizer={normalizer!r} only applies to reduction='mean', got {reduction!r}")
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"expected logits [N, V] and targets [N], got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    if logits.dtype not in _DTYPES:
        raise TypeError(f"logits dtype {logits.dtype} is not float32, bfloat16 or float16")
    if logits.device.type != "cuda" or targets.device != logits.device:
        raise ValueError(f"logits and targets must be on one CUDA device, got {logits.device} and "
                         f"{targets.device}")
    want_grad = torch.is_grad_enabled() and logits.requires_grad
    # the kernel reads rows with unit column stride (any row stride); other layouts are copied once
    z = logits if logits.stride(1) == 1 or logits.shape[1] <= 1 else logits.contiguous()
    t = targets if targets.dtype == torch.int64 else targets.to(torch.int64)
    norm = None if normalizer is None else float(normalizer)
    loss = SoftmaxXent.apply(z, t, int(ignore_index), reduction, float(label_smoothing), float(z_loss), norm,
                             want_grad, inplace)
    return {"loss": loss}
