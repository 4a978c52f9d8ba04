"""softmax_xent on raw CUDA: one autograd.Function over the launchers of softmax_xent.cu.

Mean/sum with a gradient wanted: the forward writes dlogits for an upstream gradient of 1 from a
second read of the row (read logits twice, write dlogits once). The backward launches the gradient
kernel with ``skip_if_one``: on the device it returns at once when g == 1 (loss.backward()), and
otherwise recomputes dlogits from the saved (max, log sum) for the actual g (one more read of the
logits and write of dlogits), so there is no host synchronisation and a single rounding either way.
Reduction "none" (a per-row g) and forwards without a gradient only compute the row statistics.

In place (``softmax_xent_cuda_inplace``): the forward writes dlogits for g = 1 over the logits buffer
itself, for every reduction, and the backward scales it by g where g is not 1 (on the device: no host
synchronisation). The caller's logits are gone after the forward; a second backward of the same forward
raises. Extra memory: the per-row statistics only. A g other than 1 costs a second rounding of dlogits.
"""

from __future__ import annotations

import torch

from . import loader

Tensor = torch.Tensor
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


class SoftmaxXent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, eps: float,
                lam: float, normalizer: float | None, want_grad: bool, inplace: bool) -> Tensor:
        N, V = logits.shape
        dev = logits.device
        if inplace:
            dlog = logits if want_grad else None
        else:
            fused = want_grad and reduction != "none"
            dlog = torch.empty((N, V), dtype=logits.dtype, device=dev) if fused else None
        stats = torch.empty((N, 2), dtype=torch.float32, device=dev)
        row_loss = torch.empty((N,), dtype=torch.float32, device=dev)
        denom = torch.empty((1,), dtype=torch.float32, device=dev)
        loss = torch.empty((), dtype=torch.float32, device=dev)
        with torch.cuda.device(dev):
            rc = loader.lib().xent_forward(
                logits.data_ptr(), loader.DTYPE_CODES[_DTYPES[logits.dtype]], N, V, logits.stride(0),
                targets.data_ptr(), targets.stride(0), ignore_index, loader.REDUCTIONS[reduction],
                int(normalizer is not None), float(normalizer or 0.0), eps, lam,
                dlog.data_ptr() if dlog is not None else None, dlog.stride(0) if dlog is not None else V,
                stats.data_ptr(), row_loss.data_ptr(),
                denom.data_ptr(), loss.data_ptr(), _stream(dev))
        loader.check(rc, "forward launch")
        ctx.save_for_backward(logits, targets, stats, denom)
        ctx.dlog = dlog
        ctx.opts = (ignore_index, reduction, eps, lam)
        ctx.inplace = inplace
        return row_loss if reduction == "none" else loss

    @staticmethod
    def backward(ctx, g: Tensor):
        logits, targets, stats, denom = ctx.saved_tensors
        ignore_index, reduction, eps, lam = ctx.opts
        N, V = logits.shape
        g = g.detach().to(torch.float32)
        gs = g.stride(0) if reduction == "none" and N > 0 else 0
        if ctx.inplace:
            return SoftmaxXent.scale_in_place(ctx, logits, g, gs)
        # the forward's g = 1 gradient is handed out once; a second backward recomputes into a new buffer
        dlog, ctx.dlog = ctx.dlog, None
        skip = int(dlog is not None)
        if dlog is None:
            dlog = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
        with torch.cuda.device(logits.device):
            rc = loader.lib().xent_backward(
                logits.data_ptr(), loader.DTYPE_CODES[_DTYPES[logits.dtype]], N, V, logits.stride(0),
                targets.data_ptr(), targets.stride(0), ignore_index, eps, lam, stats.data_ptr(),
                denom.data_ptr(), g.data_ptr(), gs, skip, dlog.data_ptr(), V, _stream(logits.device))
        loader.check(rc, "backward launch")
        return dlog, None, None, None, None, None, None, None, None

    @staticmethod
    def scale_in_place(ctx, logits: Tensor, g: Tensor, gs: int):
        """The in-place backward: the logits buffer holds dlogits for g = 1; scale it by g."""
        dlog, ctx.dlog = ctx.dlog, None
        if dlog is None:
            raise RuntimeError("softmax_xent cuda-inplace: one backward per forward (the forward wrote dlogits "
                               "over the logits, so a second backward has nothing to recompute from); run the "
                               "forward again, or use the `cuda` backend")
        with torch.cuda.device(logits.device):
            rc = loader.lib().xent_scale(dlog.data_ptr(), loader.DTYPE_CODES[_DTYPES[logits.dtype]], logits.shape[0],
                                         logits.shape[1], dlog.stride(0), g.data_ptr(), gs, _stream(logits.device))
        loader.check(rc, "in-place backward launch")
        return dlog.detach(), None, None, None, None, None, None, None, None


def softmax_xent_cuda(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                      label_smoothing: float = 0.0, z_loss: float = 0.0,
                      normalizer: float | None = None) -> dict[str, Tensor]:
    """Cross-entropy of ``logits [N, V]`` (fp32/bf16/fp16, any row stride) against ``targets [N]``.

    Returns {"loss": float32 scalar, or [N] for reduction "none"}. All targets ignored under "mean"
    without a normalizer: loss NaN, gradient exactly 0.
    """
    return _softmax_xent(logits, targets, ignore_index, reduction, label_smoothing, z_loss, normalizer, False)


def softmax_xent_cuda_inplace(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                              label_smoothing: float = 0.0, z_loss: float = 0.0,
                              normalizer: float | None = None) -> dict[str, Tensor]:
    """softmax_xent_cuda, writing dlogits over ``logits`` in the forward when a gradient is wanted (the
    logits' values are gone afterwards; a layout with a column stride other than 1 is first copied, and
    that copy is written instead)."""
    return _softmax_xent(logits, targets, ignore_index, reduction, label_smoothing, z_loss, normalizer, True)


def _softmax_xent(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, label_smoothing: float,
                  z_loss: float, normalizer: float | None, inplace: bool) -> dict[str, Tensor]:
    if reduction not in loader.REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(loader.REDUCTIONS)}")
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
    # the kernels read rows with unit column stride (any row stride); other layouts are copied once
    z = logits if logits.stride(1) == 1 or logits.shape[1] <= 1 else logits.contiguous()
    t = targets if targets.dtype == torch.int64 else targets.to(torch.int64)
    norm = None if normalizer is None else float(normalizer)
    loss = SoftmaxXent.apply(z, t, int(ignore_index), reduction, float(label_smoothing), float(z_loss), norm,
                             want_grad, inplace)
    return {"loss": loss}
