"""Two fused_linear_xent backends from one Triton GEMM with TF32 inputs: the declared one and the undeclared one.

One small Triton kernel of our own, ``C = A @ B`` (any strides, float32 accumulation, ``tl.dot`` with
``input_precision`` a constexpr), does the three GEMMs of the operator inside one autograd Function:
``logits = hidden @ weight^T`` forward, ``dhidden = dlogits @ weight`` and ``dweight = dlogits^T @ hidden``
backward. The rest (bias, softcap, the cross-entropy with every option of the operator: ignore_index,
reduction, label smoothing, z-loss, normalizer, the LSE output) is the reference's float32 torch code,
so the only thing that differs from the floor reference is the GEMMs' input precision.

Both backends run the kernel with ``input_precision="tf32"``:

- ``tf32-declared`` declares ``matmul_precision="tf32"``, so the harness judges it against a floor whose
  matmul operands are reduced to TF32 (truncated, as the tensor core does: harness/measure/tf32.py);
- ``tf32-undeclared`` declares ``matmul_precision="ieee"`` (the default), so it is judged against the
  IEEE float32 floor, about 2^13 times stricter on the GEMM-bound components.

Expected on a GPU (float32 only; the pair is evidence only there: under ``TRITON_INTERPRET=1`` ``tl.dot``
computes in full float32 whatever ``input_precision`` says, which is why both are ``devices=("cuda",)``):

    harness run --kernel fused_linear_xent --sizes smoke --backend tf32-declared,tf32-undeclared \
        --dtype float32 --plugin tests/plugins/tf32_linear_xent.py --device cuda

gives ``tf32-declared`` PASS on every cell and ``tf32-undeclared`` FAIL on every cell, exit code 1.
Measured on an H100 (torch 2.11, triton 3.6): smoke, declared 3/3 PASS (worst ratio 0.50), undeclared
3/3 FAIL (1.1e3x to 3.1e3x its bound); sweep, declared 34/34 PASS (worst 0.54), undeclared 32/34 FAIL
(up to 8.6e3x; the two that pass are the all-ignored cases, whose gradients are exactly zero). Triton's
TF32 ``tl.dot`` truncates the operands on that GPU; against a floor that rounded them to nearest
instead, the declared backend failed all 3 smoke cells by up to 2.6x (harness/measure/oracle.py, TF32_ROUNDING).

Under the interpreter the autograd Function matches the reference: ``linear_xent`` on the CPU smoke
and sweep cases stays within 0.33 of the IEEE floor's bound on every component (tests/test_tf32.py
runs one smoke case that way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from harness.references.softmax_xent import xent_from_logits

from harness import Backend, register_backend

Tensor = torch.Tensor
BM, BN, BK = 32, 32, 32  # tl.dot needs each tile dimension >= 16


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rm64, rn64 = rm.to(tl.int64), rn.to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = (k0 + rk).to(tl.int64)
        a = tl.load(a_ptr + rm64[:, None] * s_am + kk[None, :] * s_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn64[None, :] * s_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
    tl.store(c_ptr + rm64[:, None] * s_cm + rn64[None, :] * s_cn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: Tensor, b: Tensor, precision: str) -> Tensor:
    """``a [M, K] @ b [K, N]`` in float32 (any strides, stride 0 included) by the Triton kernel."""
    assert a.dtype == b.dtype == torch.float32 and a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0]
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=torch.float32, device=a.device)
    if M and N:
        _matmul[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
            a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BM=BM, BN=BN, BK=BK, PREC=precision)
    return c


class TritonLinear(torch.autograd.Function):
    """``hidden @ weight^T`` and its two backward GEMMs, all by :func:`matmul`."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, precision: str) -> Tensor:
        ctx.save_for_backward(hidden, weight)
        ctx.precision = precision
        return matmul(hidden, weight.t(), precision)

    @staticmethod
    def backward(ctx, dz: Tensor):
        hidden, weight = ctx.saved_tensors
        dh = matmul(dz, weight, ctx.precision) if ctx.needs_input_grad[0] else None
        dw = matmul(dz.t(), hidden, ctx.precision) if ctx.needs_input_grad[1] else None
        return dh, dw, None


def linear_xent(hidden: Tensor, weight: Tensor, bias: Tensor | None = None, targets: Tensor | None = None, *,
                ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                z_loss: float = 0.0, softcap: float | None = None, normalizer: float | None = None,
                return_lse: bool = False, precision: str = "tf32") -> dict[str, Tensor]:
    """The operator with the GEMMs in Triton at ``precision``; everything else float32 torch."""
    if targets is None:
        raise ValueError("fused_linear_xent: targets [N] (int64) is required")
    z = TritonLinear.apply(hidden.float(), weight.float(), precision)
    if bias is not None:
        z = z + bias.float()
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    loss, lse = xent_from_logits(z, targets, ignore_index=ignore_index, reduction=reduction,
                                 label_smoothing=label_smoothing, z_loss=z_loss, normalizer=normalizer)
    return {"loss": loss, "lse": lse} if return_lse else {"loss": loss}


for _name, _declared in (("tf32-declared", "tf32"), ("tf32-undeclared", "ieee")):
    register_backend(Backend(
        operator="fused_linear_xent", name=_name, impl=linear_xent, options={"precision": "tf32"},
        devices=("cuda",), dtypes=("float32",), requires=("triton",), matmul_precision=_declared,
        blocks={"BLOCK_N": BM, "BLOCK_V": BN, "BLOCK_H": BK}, sources=(__file__,),
        description=f"test plugin: Triton tl.dot GEMMs with input_precision='tf32', declared "
                    f"matmul_precision={_declared!r}; loss in float32 torch"))
