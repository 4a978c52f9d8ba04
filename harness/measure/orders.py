"""Float32 reductions in a tiled kernel's order: the summation orders the floor's order draws sample.

The floor reference (harness/measure/oracle.py) sums in whatever order torch picks: a tree or many-accumulator
sum, blocked GEMMs. A careful float32 kernel often sums otherwise: a GEMM's K loop adds one tile's dot product
to a float32 accumulator per step, a reduction over tokens adds one block's partial per program. For a long
reduction that order rounds several times more than torch's, and a component that is one or a few such sums
(a scalar gradient such as mHC's dalpha, a bias gradient over 65,536 tokens) was judged against the luck of
torch's order alone: correct kernels failed it at up to 5.6x (issue #44).

:class:`TiledOrder` runs a float32 evaluation with every long reduction in that order: the reduced extent cut into
blocks in order, each block reduced by torch, the block partials added one at a time to a float32 running sum.
Matrix products (``mm``, ``bmm``, ``addmm``, ``baddbmm``) are cut along K into blocks of ``block`` (1: one K step
at a time, a plain GEMM's accumulator), widened so that no product takes more than ``MAX_K_STEPS`` steps; sums
and means along their reduced elements (flattened), in blocks of at least ``SUM_BLOCK_MIN``. Like :class:`harness.measure.tf32.TF32Matmuls` it is a
``TorchDispatchMode``, below autograd, so a backward's reductions (the sum that broadcasting's gradient is) are
taken in that order too; under both modes, the TF32 mode entered first, each block's product has its operands
reduced to TF32.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Tensor = torch.Tensor
aten = torch.ops.aten

# The blocks of the order draws. Measured on an H200 (float32 [4097, 16384] @ [16384, 24], mHC's h_mix GEMM at
# T=4097, D=4096; rms error against float64): cuBLAS at the whole shape 1.04e-6; at chunks of 512 rows, as the
# chunked floor runs it (harness/measure/chunking.py), 4.1e-7, cuBLAS picking another kernel there; this order
# with blocks of 32, 5.4e-7, and of 256, 2.7e-7. An order draw must round at least as much as a careful kernel
# at the whole shape. The error of a running sum grows as the root of its number of steps, and a float32 GEMM
# whose output tiles fill the GPU (no split-K) adds one product per K step: eager torch's dweight, cuBLAS over
# 1,000 and 4,096 tokens (fused_linear_xent N1000-H256-V128256, N4096-H256-V32000), rounded 2.6-2.9x the rms of
# a floor in blocks of 8 (sqrt(8) = 2.8) and failed its rms criterion at 1.04-1.46x on the H200 (seeds 7, 31).
# So the first draw takes GEMMs one K step at a time (its sums in blocks of SUM_BLOCK_MIN: a kernel reduces a
# block as a tree), the second in blocks of 64, the K tile of a typical tiled kernel.
ORDER_BLOCKS = (1, 64)
# Sums and means are cut in blocks of at least this: a kernel's reduction of a block is a tree, not a chain.
SUM_BLOCK_MIN = 8
# A product over a longer K takes blocks of ceil(K / MAX_K_STEPS): one step is two launches, and a K of 128,256
# (a vocabulary) one step at a time would take a minute per draw. Where K is that long the output is small and a
# library GEMM splits K (cuBLAS at K=16,384 above rounded as blocks of 8, 2,048 steps); 4,096 steps round more.
MAX_K_STEPS = 4096


def _running(parts: list[Tensor]) -> Tensor:
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


class TiledOrder(TorchDispatchMode):
    """Float32 reductions longer than ``block`` summed block by block, in order (module doc)."""

    def __init__(self, block: int):
        super().__init__()
        self.block = block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None and all(t.dtype == torch.float32 for t in args if isinstance(t, Tensor)):
            out = handler(self.block, *args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _mm(block: int, a: Tensor, b: Tensor) -> Tensor | None:
    k = a.shape[-1]
    step = max(block, -(-k // MAX_K_STEPS))
    if k <= step:
        return None
    acc = a[..., :step] @ b[..., :step, :]
    for k0 in range(step, k, step):  # one partial at a time: K of them would not fit in memory at once
        acc.add_(a[..., k0:k0 + step] @ b[..., k0:k0 + step, :])
    return acc


def _addmm(block: int, c: Tensor, a: Tensor, b: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor | None:
    ab = _mm(block, a, b)
    if ab is None:
        return None
    ab = ab if alpha == 1 else ab * alpha
    return ab + (c if beta == 1 else c * beta) if beta != 0 else ab


def _sum(block: int, x: Tensor, dim: list[int] | None = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> Tensor | None:
    if dtype not in (None, torch.float32) or x.dim() == 0:
        return None
    dims = sorted(d % x.dim() for d in (dim if dim else range(x.dim())))
    kept = [d for d in range(x.dim()) if d not in dims]
    flat = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
    n, block = flat.shape[-1], max(block, SUM_BLOCK_MIN)
    if n <= block:
        return None
    out = _running([flat[..., i:i + block].sum(-1) for i in range(0, n, block)])
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d)
    return out


def _mean(block: int, x: Tensor, dim: list[int] | None = None, keepdim: bool = False, *,
          dtype: torch.dtype | None = None) -> Tensor | None:
    s = _sum(block, x, dim, keepdim, dtype=dtype)
    if s is None:
        return None
    dims = dim if dim else range(x.dim())
    count = 1
    for d in dims:
        count *= x.shape[d]
    return s / count


_HANDLERS = {
    aten.mm.default: _mm,
    aten.bmm.default: _mm,
    aten.addmm.default: _addmm,
    aten.baddbmm.default: _addmm,
    aten.sum.default: lambda block, x, *, dtype=None: _sum(block, x, None, False, dtype=dtype),
    aten.sum.dim_IntList: _sum,
    aten.mean.dim: _mean,
    aten.mean.default: lambda block, x, *, dtype=None: _mean(block, x, None, False, dtype=dtype),
}
