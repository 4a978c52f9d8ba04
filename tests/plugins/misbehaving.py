"""Backends that break the harness's isolation and contracts in every way a kernel can."""

import os
import time

import torch
from harness.backends.golden.mhc_pre import backward, forward

from harness import Backend, register_backend


def _raises(**kw):
    raise RuntimeError("kernel launch failed: invalid configuration argument")


def _nans(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    g["phi"] = torch.full_like(g["phi"], float("nan"))
    return g


def _writes_input(x, phi, alpha, bias, gamma=None, **kw):
    outs, saved = forward(x, phi, alpha, bias, gamma, **kw)
    with torch.no_grad():
        x.mul_(1.0001)                    # the seed's dx stored through x's pointer
    return outs, saved


def _sleeps(**kw):
    time.sleep(3600)


def _dies(**kw):
    os._exit(7)                         # a segfault-like death of the process


def _segfaults(**kw):
    import ctypes

    ctypes.string_at(0)                 # a real SIGSEGV


def _unwritten(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    out = torch.empty_like(g["phi"])     # poisoned by the harness
    out[:, :-3] = g["phi"][:, :-3]       # the last 3 columns never written
    g["phi"] = out
    return g


def _overruns(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    out = torch.empty(g["bias"].numel(), dtype=g["bias"].dtype, device=g["bias"].device)
    out.copy_(g["bias"])
    out.as_strided((2,), (1,), out.storage_offset() + out.numel()).fill_(0.0)   # writes 2 past the end
    g["bias"] = out
    return g


_ND = {"fn": 0}


def _nondeterministic(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    _ND["fn"] += 1
    g["phi"] = g["phi"] * (1 + 1e-7 * (_ND["fn"] % 2))
    return g


for name, impl, bwd in [("raises", _raises, None), ("nans", forward, _nans), ("writes-input", _writes_input, backward),
                        ("sleeps", _sleeps, None), ("dies", _dies, None), ("segfaults", _segfaults, None),
                        ("unwritten", forward, _unwritten),
                        ("overruns", forward, _overruns), ("nondeterministic", forward, _nondeterministic)]:
    register_backend(Backend(operator="mhc_pre", name=name, impl=impl, backward=bwd, devices=("cpu", "cuda"),
                             sources=(__file__,)))
