"""Deliberately wrong mhc_pre adapters (what a user's buggy kernel looks like to the harness)."""

from harness.backends.golden.mhc_pre import backward, forward

from harness import Backend, register_backend


def _wrong_backward(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    n = saved["n"]
    if g["gamma"] is not None:
        g["gamma"] = g["gamma"] * 0      # dgamma never written
    g["bias"] = g["bias"].clone()
    g["bias"][:n] = -g["bias"][:n]       # dbias.pre negated
    return g


def _wrong_shape_backward(saved, grad_outputs):
    g = backward(saved, grad_outputs)
    if g["gamma"] is not None:
        g["gamma"] = g["gamma"].view(saved["n"], saved["D"])   # the seed's [n, D] dgamma
    return g


register_backend(Backend(operator="mhc_pre", name="wrong-grads", impl=forward, backward=_wrong_backward,
                         devices=("cpu", "cuda"), sources=(__file__,)))
register_backend(Backend(operator="mhc_pre", name="wrong-shape", impl=forward, backward=_wrong_shape_backward,
                         devices=("cpu", "cuda"), sources=(__file__,)))
