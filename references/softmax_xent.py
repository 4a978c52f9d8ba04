"""Golden reference of ``softmax_xent``: the common cross-entropy loss of specs/xent.md.

Dtype-generic: all math runs in the dtype of ``logits`` (float64 for the oracle, float32 for the
floor reference); the harness rounds the loss to its float32 contract dtype afterwards. The loss's value is
computed as a careful float32 kernel computes it, with log1p (careful_cross_entropy): the float32 floor is
then what such a kernel achieves on confident rows, not what a naive one does.

All tokens ignored under ``mean`` with no normalizer: the loss is NaN and every gradient is exactly 0,
as with torch's ``F.cross_entropy``. Dividing by D = 0 inside the graph would give g/0 = inf in the
backward and inf * 0 = NaN gradients, so the per-token weights mu_i / D are built outside the graph
(0 for every ignored token, hence all 0 here) and the NaN is added as a constant that carries no
gradient.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

REDUCTIONS = ("mean", "sum", "none")


def xent_from_logits(z: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                     label_smoothing: float = 0.0, z_loss: float = 0.0,
                     normalizer: float | None = None) -> tuple[Tensor, Tensor]:
    """(loss, lse) from logits ``z [N, V]``; shared by both cross-entropy references."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(REDUCTIONS)}")
    if normalizer is not None and reduction != "mean":
        raise ValueError(f"normalizer={normalizer!r} only applies to reduction='mean', got {reduction!r}")
    if z.dim() != 2 or targets.shape != z.shape[:1]:
        raise ValueError(f"expected logits [N, V] and targets [N], got {tuple(z.shape)} and "
                         f"{tuple(targets.shape)}")
    V = z.shape[1]
    eps, lam = float(label_smoothing), float(z_loss)
    valid = targets != ignore_index
    # an ignored target is never used as an index (it may be negative or >= V)
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    lse = torch.logsumexp(z, dim=1)
    z_y = z.gather(1, safe[:, None]).squeeze(1)
    loss_i = lse - (1.0 - eps) * z_y
    if eps != 0.0:
        loss_i = loss_i - (eps / V) * z.sum(dim=1)
    # the value a careful kernel gives, the gradient of the plain graph (see careful_cross_entropy)
    loss_i = loss_i + (careful_cross_entropy(z.detach(), z_y.detach(), eps) - loss_i).detach()
    if lam != 0.0:
        loss_i = loss_i + lam * lse * lse
    mu = valid.to(z.dtype)
    if reduction == "none":
        return loss_i * mu, lse
    if reduction == "sum":
        return (loss_i * mu).sum(), lse
    D = float(valid.sum()) if normalizer is None else float(normalizer)
    if D == 0.0:
        # 0/0: a NaN loss whose gradient is exactly zero (see the module docstring)
        return (loss_i * torch.zeros_like(mu)).sum() + float("nan"), lse
    return (loss_i * (mu / D)).sum(), lse


def careful_cross_entropy(z: Tensor, z_y: Tensor, eps: float) -> Tensor:
    """Each row's cross-entropy LSE - (1-eps) z_y - (eps/V) sum(z), as a careful float32 kernel computes it:
    (1-eps) ((m - z_y) + log1p(r)) + eps ((m - mean z) + log1p(r)), m the row max and r the sum of
    exp(z - m) over every entry but one max.

    A confident row (r ~ 1e-10) keeps its loss log1p(r) ~ r to float32's relative precision, where
    m + log(1 + r) - z_y rounds 1 + r to 1 and the loss to 0 (issue #44: with that floor, a kernel taking
    log instead of log1p passed). The gradients stay those of the plain graph: the target's p - 1
    cancels the same way in every kernel that forms softmax - onehot, the CUDA one's expm1 aside."""
    with torch.no_grad():
        m, top = z.max(dim=1)
        e = torch.exp(z - m[:, None])
        e.scatter_(1, top[:, None], 0.0)
        log_s = torch.log1p(e.sum(dim=1))
        del e
        ce = (1.0 - eps) * ((m - z_y) + log_s)
        if eps != 0.0:
            ce = ce + eps * ((m - z.mean(dim=1)) + log_s)
    return ce


def softmax_xent(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, z_loss: float = 0.0,
                 normalizer: float | None = None) -> dict[str, Tensor]:
    loss, _ = xent_from_logits(logits, targets, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing, z_loss=z_loss, normalizer=normalizer)
    return {"loss": loss}
