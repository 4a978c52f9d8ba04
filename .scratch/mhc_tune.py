"""mHC pre (bf16, T=16384, n=4, D=4096/7168) launch-shape variants: fwd and fwd+bwd medians (do_bench) and the
nd kernel alone, outputs checked against the production config's."""
import os, sys, torch
sys.path.insert(0, os.getcwd())
from triton.testing import do_bench
import backends.triton.mhc_pre.wrapper as Wr
BASE = dict(Wr.CONFIG)
def inputs(D, T=16384, n=4):
    torch.manual_seed(0)
    M = n * n + 2 * n
    x = torch.randn(1, T, n, D, device="cuda").bfloat16().requires_grad_()
    phi = (torch.randn(M, n * D, device="cuda") / (n * D) ** 0.5).requires_grad_()
    alpha = (0.5 + torch.rand(3, device="cuda")).requires_grad_()
    bias = (0.5 * torch.randn(M, device="cuda")).requires_grad_()
    gamma = (1 + 0.1 * torch.randn(n * D, device="cuda")).requires_grad_()
    gs = (torch.randn(1, T, D, device="cuda").bfloat16(), torch.randn(1, T, n, device="cuda"), torch.randn(1, T, n, n, device="cuda"))
    return (x, phi, alpha, bias, gamma), gs
def run(ins, gs):
    out = Wr.mhc_pre_triton(*ins)
    torch.autograd.backward([out["h_in"], out["h_post"], out["h_res"]], list(gs))
def grads(ins, gs):
    for t in ins: t.grad = None
    out = Wr.mhc_pre_triton(*ins)
    torch.autograd.backward([out["h_in"], out["h_post"], out["h_res"]], list(gs))
    return [out["h_in"].detach().float()] + [t.grad.float().clone() for t in ins]
V = [{}] + [dict(nd_programs=16)] + [dict(BLOCK_ND=128, nd_warps=w, nd_programs=p, nd_stages=st) for w in (4, 8) for p in (4, 8, 16) for st in (2, 3)] + [dict(BLOCK_ND=32, nd_programs=16), dict(BLOCK_ND=64, BLOCK_T=16, nd_programs=16)]
for D in (4096, 7168):
    ins, gs = inputs(D)
    ref = grads(ins, gs)
    for v in V + [{}]:
        Wr.CONFIG.clear(); Wr.CONFIG.update(BASE); Wr.CONFIG.update(v)
        try:
            got = grads(ins, gs)
            err = max(((a - b).norm() / max(b.norm(), 1e-30)).item() for a, b in zip(got, ref))
            f = do_bench(lambda: Wr.mhc_pre_triton(*ins), rep=200, return_mode="median")
            t = do_bench(lambda: run(ins, gs), rep=400, grad_to_none=list(ins), return_mode="median")
            print(f"D={D} {str(v):45s} fwd {f:.3f} fwd+bwd {t:.3f} bwd {t - f:.3f} relerr {err:.1e}", flush=True)
        except Exception as e:
            print(D, v, "FAILED", type(e).__name__, str(e)[:200], flush=True)
    Wr.CONFIG.clear(); Wr.CONFIG.update(BASE)
