"""``softmax_xent`` in eager torch, as a user would write it, in the case dtype: ``F.cross_entropy``
plus a z-loss term from ``torch.logsumexp``; autograd does the backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness import Backend, ContractException, Gap, register_backend

Tensor = torch.Tensor


def xent_loss(logits: Tensor, targets: Tensor, *, ignore_index: int = -100, reduction: str = "mean",
              label_smoothing: float = 0.0, z_loss: float = 0.0, normalizer: float | None = None) -> Tensor:
    """The loss a training loop computes from materialized logits (shared with fused_linear_xent)."""
    global_mean = reduction == "mean" and normalizer is not None
    red = "sum" if global_mean else reduction
    loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=red,
                           label_smoothing=label_smoothing)
    if z_loss:
        valid = targets != ignore_index
        zl = z_loss * torch.logsumexp(logits, dim=-1).pow(2) * valid
        if red == "none":
            loss = loss + zl
        elif red == "sum":
            loss = loss + zl.sum()
        else:
            # clamp: with every token ignored the loss stays NaN (from cross_entropy), gradients 0
            loss = loss + zl.sum() / valid.sum().clamp_min(1)
    if global_mean:
        loss = loss / normalizer
    return loss.float()


def softmax_xent_torch(logits: Tensor, targets: Tensor, **options: object) -> dict[str, Tensor]:
    return {"loss": xent_loss(logits, targets, **options)}


_EAGER = "eager cross-entropy computes the loss and softmax in the case dtype"
# a confident row's loss is log1p(r), r ~ 1e-10 (cases/softmax_xent.py, CONFIDENT_MARGIN); the float32 floor keeps
# it (references/softmax_xent.py, careful_cross_entropy), F.cross_entropy's lse - z_y rounds 1 + r to 1
CONFIDENT_LOSS = Gap("eager F.cross_entropy forms a row's loss as logsumexp - z_y, which rounds a confident row's "
                     "loss log1p(r) ~ 1e-10 to 0 (no log1p)", components=("loss",), tags=("confident",),
                     ceiling=1e7, range_errors=True)

register_backend(Backend(
    operator="softmax_xent", name="torch", impl=softmax_xent_torch, devices=("cpu", "cuda"),
    # ceilings: the worst ratios of the committed H100/H200/CPU sweeps (at 350e7a5), with about 2x room
    expected_gaps=(
        CONFIDENT_LOSS,
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("loss",), ceiling=4e4, range_errors=True),
        # exp(z - lse) in 16 bits: a small probability is a few percent off (3-8 eps), which the local rule
        # (issue #44) sees where the global bounds, set by the target column, did not: up to 2.4x its local bound
        # on an H200 (seed 31, N4096-V32000-scale10 bfloat16)
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("dlogits",), ceiling=6.0),
        # dlogits of the label-smoothing cases: 1.3e5x (bf16, extreme logits with z-loss), 1.0e4x (fp16)
        Gap(_EAGER, dtypes=("bfloat16", "float16"), components=("dlogits",), tags=("smoothing",), ceiling=3e5,
            range_errors=True),
        # dlogits of the confident label-smoothing cases: max error 2.8x (N128-V1025) and 3.0x (N4096-V32000)
        # its bound on an H200, 5.7x on an H100, 6.2x (N16-V1025) on CPU, 18.9x (N16-V1025, CPU seed 9); the kernels
        # subtract the true-class term before any rounding and pass there
        Gap("eager autograd forms the true-class gradient as g_y - p_y * sum(g), which cancels at confident "
            "rows with label smoothing", dtypes=("float32",), components=("dlogits",),
            tags=("confident", "smoothing"), ceiling=40.0),
    ),
    # the dlogits row-sum invariant misses its budget on the extreme z-loss rows: the same rounding
    contract_exceptions=(ContractException("invariants", _EAGER, dtypes=("float16", "bfloat16")),),
    dtypes=("float32", "bfloat16", "float16"), deterministic=True, sources=(__file__,),
    description="F.cross_entropy (+ z-loss via logsumexp) in the case dtype, autograd backward"))
