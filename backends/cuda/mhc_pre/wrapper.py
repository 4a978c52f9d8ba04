"""mhc_pre: the one-read cluster forward of mhc_pre.cu, then the Triton backend's backward.

The forward saves what the Triton backward reads (h_mix [T, MP], inv_rms, h_pre and the bf16 parts of
phi * gamma, which the cluster kernel reads too), so the pair is judged as one backend. A token row too
long for a cluster's shared memory (mhc_fwd answers UNSUPPORTED: n * D * itemsize beyond about 215 KB,
16 tokens a block over 16 blocks; n = 8, D = 7168 in float32) takes the Triton backend's two-read
forward; ``last_plan`` says which ran.
"""

from __future__ import annotations

import ctypes

import torch

# absolute: a bug-zoo mutant is a copy of this package outside harness.backends
from harness.backends.triton.mhc_pre import wrapper as triton_mhc

from . import loader

Tensor = torch.Tensor
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# the launch of the last forward: C (blocks per cluster), DS (features of a stream per block), tokens per
# block, threads, shared memory bytes; None where the Triton forward ran instead
last_plan: tuple[int, ...] | None = None


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def cluster_forward(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None, norm_eps: float,
                    hc_eps: float, post_mult: float) -> tuple[Tensor, ...] | None:
    """The cluster kernel's h_in, h_post, h_res, h_mix, inv_rms, h_pre, weight parts; None where the shape
    does not fit it."""
    global last_plan
    B, S, n, D, M, nD = triton_mhc.dims(x, phi)
    lib, code, plan = loader.lib(), loader.DTYPE_CODES[_DTYPES[x.dtype]], (ctypes.c_int64 * 5)()
    if lib.mhc_plan(code, n, D, B * S, plan) == loader.UNSUPPORTED:  # asked before anything is allocated
        last_plan = None
        return None
    MP, dev = triton_mhc.padded_rows(M), x.device
    wparts = triton_mhc.weight_parts(phi, gamma, M, MP)
    h_in, h_post, h_res, h_mix, inv, h_pre = triton_mhc.forward_outputs(x, MP)
    # W's fragments in the order the MMAs read them (a kernel of mhc_fwd writes them)
    wfrag = torch.empty((lib.mhc_wfrag_bytes(n, D),), dtype=torch.uint8, device=dev)
    with torch.cuda.device(dev):
        rc = lib.mhc_fwd(
            x.data_ptr(), code, B, S, n, D, *x.stride(), wparts.data_ptr(), MP, wfrag.data_ptr(),
            alpha.data_ptr(), bias.data_ptr(), norm_eps, hc_eps, post_mult, h_in.data_ptr(), h_post.data_ptr(),
            h_res.data_ptr(), h_mix.data_ptr(), inv.data_ptr(), h_pre.data_ptr(), plan, _stream(dev))
    loader.check(rc, "forward launch")
    last_plan = tuple(plan)
    return h_in, h_post, h_res, h_mix, inv, h_pre, wparts


def forward_saved(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
                  norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> tuple[dict, tuple]:
    if x.device.type != "cuda":
        raise ValueError(f"mhc_pre cuda: x must be on a CUDA device, got {x.device}")
    alpha, bias, gamma = triton_mhc.operands(phi, alpha, bias, gamma)
    opts = (float(norm_eps), float(hc_eps), float(post_mult))
    got = cluster_forward(x, phi, alpha, bias, gamma, *opts)
    if got is None:
        got = triton_mhc.mhc_pre_forward(x, phi, alpha, bias, gamma, *opts)
    h_in, h_post, h_res, h_mix, inv, h_pre, wparts = got
    saved = (x, phi, alpha, bias, gamma, h_mix, inv, h_pre, wparts, float(post_mult))
    return {"h_in": h_in, "h_post": h_post, "h_res": h_res}, saved


backward_saved = triton_mhc.backward_saved
