"""A backend whose kernel makes an illegal memory access (GPU only): the cell must be CRASH and the
sweep must go on in a fresh worker, since the CUDA context of the faulting process is lost."""

import torch
import triton
import triton.language as tl
from harness.backends.golden.mhc_pre import backward, forward

from harness import Backend, register_backend


@triton.jit
def _store_far_away(ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    far = offs.to(tl.int64) + (1 << 40)  # a terabyte past the buffer
    tl.store(ptr + far, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


def _faulting_backward(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    _store_far_away[(1,)](g["phi"], g["phi"].numel(), BLOCK=128)
    torch.cuda.synchronize()
    return g


register_backend(Backend(operator="mhc_pre", name="illegal-access", impl=forward, backward=_faulting_backward,
                         devices=("cuda",), requires=("triton",), sources=(__file__,)))
