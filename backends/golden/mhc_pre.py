"""`golden` mhc_pre: the spec's hand-written backward in eager torch (the seed's mhc_backward_manual).

Not autograd: the forward saves what the backward formulas of docs/specs/mhc_pre.md need, and the backward
evaluates them in float32 whatever x's dtype, returning dx in x's dtype.
"""

from __future__ import annotations

import torch

from harness import Backend, register_backend

Tensor = torch.Tensor


def forward(x: Tensor, phi: Tensor, alpha: Tensor, bias: Tensor, gamma: Tensor | None = None, *,
            norm_eps: float = 1e-6, hc_eps: float = 1e-6, post_mult: float = 2.0) -> tuple[dict, dict]:
    B, S, n, D = x.shape
    # a strided x (the layout twins) reshapes to a strided view, and eager torch's products over it round more:
    # dphi.pre failed its rms bound at 1.01x on fp32 n4-D100-T3~stride, CPU seed 2 (rms error 1.9e-6 against
    # 5.9e-7 contiguous); from a contiguous copy the twins' worst ratio over seeds 0-9 is 0.57
    X = x.reshape(B * S, n * D).float().contiguous()
    g = gamma.float() if gamma is not None else torch.ones(n * D, device=x.device)
    Xg = X * g
    h_mix = Xg @ phi.T
    inv_rms = torch.rsqrt(X.pow(2).mean(dim=1) + norm_eps)
    t = h_mix * inv_rms[:, None]
    s_pre = torch.sigmoid(alpha[0] * t[:, :n] + bias[:n])
    h_pre = s_pre + hc_eps
    h_post = post_mult * torch.sigmoid(alpha[1] * t[:, n:2 * n] + bias[n:2 * n])
    h_res = alpha[2] * t[:, 2 * n:] + bias[2 * n:]
    h_in = torch.einsum("tk,tkd->td", h_pre, X.view(-1, n, D))
    outs = {"h_in": h_in.view(B, S, D).to(x.dtype), "h_post": h_post.view(B, S, n),
            "h_res": h_res.view(B, S, n, n)}
    saved = dict(x=x, X=X, Xg=Xg, g=g, phi=phi, alpha=alpha, h_mix=h_mix, inv_rms=inv_rms, t=t, s_pre=s_pre,
                 h_pre=h_pre, h_post=h_post, n=n, D=D, post_mult=post_mult, has_gamma=gamma is not None)
    return outs, saved


def backward(s: dict, grad_outputs: dict[str, Tensor]) -> dict[str, Tensor | None]:
    n, D, X, t = s["n"], s["D"], s["X"], s["t"]
    T = X.shape[0]
    g_in = grad_outputs["h_in"].reshape(T, D).float()
    g_post = grad_outputs["h_post"].reshape(T, n).float()
    g_res = grad_outputs["h_res"].reshape(T, n * n).float()
    sp, h_post, alpha = s["s_pre"], s["h_post"], s["alpha"]
    dh_pre = torch.einsum("td,tkd->tk", g_in, X.view(T, n, D))
    dh_pre2 = dh_pre * sp * (1 - sp)
    dh_post2 = g_post * h_post * (1 - h_post / s["post_mult"])
    dt = torch.cat([alpha[0] * dh_pre2, alpha[1] * dh_post2, alpha[2] * g_res], dim=1)
    dh_mix = dt * s["inv_rms"][:, None]
    dvecX_mm = dh_mix @ s["phi"]
    dphi = dh_mix.T @ s["Xg"]
    dgamma = (X * dvecX_mm).sum(0)
    dinv_rms = (dt * s["h_mix"]).sum(1)
    dalpha = torch.stack([(dh_pre2 * t[:, :n]).sum(), (dh_post2 * t[:, n:2 * n]).sum(), (g_res * t[:, 2 * n:]).sum()])
    dbias = torch.cat([dh_pre2, dh_post2, g_res], dim=1).sum(0)
    inv = s["inv_rms"]
    dx = (dvecX_mm * s["g"] - (dinv_rms * inv ** 3 / (n * D))[:, None] * X
          + (s["h_pre"][:, :, None] * g_in[:, None, :]).reshape(T, n * D))
    return {"x": dx.view(s["x"].shape).to(s["x"].dtype), "phi": dphi, "alpha": dalpha, "bias": dbias,
            "gamma": dgamma if s["has_gamma"] else None}


register_backend(Backend(
    operator="mhc_pre", name="golden", impl=forward, backward=backward, package=__name__,
    devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"), sources=(__file__,),
    description="spec formulas, hand-written backward in eager torch (float32 math)"))
