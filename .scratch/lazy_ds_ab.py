"""Lazy attention (bf16, B=4, H=16, L=4096, Dh=128, W=512): the ds-storing dk/dv kernel + dq GEMM against
the dq + dk/dv kernels (DS_BUDGET_BYTES = 0), same run: fwd+bwd medians (do_bench), spills, gradients against each other; SDPA too."""
import os, sys, torch
sys.path.insert(0, os.getcwd())
from triton.testing import do_bench
import torch.nn.functional as F
import backends.triton.lazy_attention.wrapper as Wr
import backends.triton.lazy_attention.kernels as K
B, H, L, D, W = 4, 16, 4096, 128, 512
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, L, D, device="cuda").bfloat16().requires_grad_() for _ in range(3))
bias = (0.5 * torch.randn(H, W, device="cuda")).requires_grad_(); tau = (-0.1 - 0.8 * torch.rand(H, device="cuda")).requires_grad_()
g = torch.randn(B, H, L, D, device="cuda").bfloat16()
def spills(fn):
    out = []
    for dev, c in fn.device_caches.items():
        cache = c[0] if isinstance(c, tuple) else c
        for ck in cache.values():
            try: ck._init_handles()
            except Exception: pass
            out.append((getattr(ck, "n_regs", None), getattr(ck, "n_spills", None)))
    return out
def once():
    for t in (q, k, v, bias, tau): t.grad = None
    o = Wr.lazy_attention_triton(q, k, v, bias, tau)["o"]; o.backward(g)
    return [t.grad.clone() for t in (q, k, v, bias, tau)]
def fb(): Wr.lazy_attention_triton(q, k, v, bias, tau)["o"].backward(g)
def bench(label):
    t = do_bench(fb, rep=800, grad_to_none=[q, k, v, bias, tau], return_mode="median")
    print(f"{label:60s} fwd+bwd {t:.3f}", flush=True)
    return t
qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
def sd(): F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).backward(g)
ts = do_bench(sd, rep=800, grad_to_none=[qs, ks, vs], return_mode="median")
print(f"sdpa fwd+bwd {ts:.3f}", flush=True)
sys.path.insert(0, os.path.join(os.getcwd(), ".scratch"))
import lazy_main.wrapper as MAIN
def bench_main():
    t = do_bench(lambda: MAIN.lazy_attention_triton(q, k, v, bias, tau)["o"].backward(g), rep=800,
                 grad_to_none=[q, k, v, bias, tau], return_mode="median")
    print(f"{'main (070c399..2f75aaa kernels)':60s} fwd+bwd {t:.3f}", flush=True)
    return t
Wr.DS_BUDGET_BYTES = 0
ref = once()
print("dq", spills(K._lazy_bwd_dq_kernel), "dkdv", spills(K._lazy_bwd_dkdv_kernel))
t0 = bench("recompute path (this branch)")
bench_main()
Wr.DS_BUDGET_BYTES = 2 << 30
V = [None,
     {"dkdv_ds": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2)},
     {"dkdv_ds": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2), "dq_ds": dict(BLOCK_M=64, num_warps=4, num_stages=3)},
     {"dkdv_ds": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=1), "dq_ds": dict(BLOCK_M=64, num_warps=4, num_stages=3)},
     {"dkdv_ds": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=1), "dq_ds": dict(BLOCK_M=128, num_warps=8, num_stages=2)},
     ]
for cfg in V:
    Wr.OVERRIDES.clear()
    if cfg: Wr.OVERRIDES.update(cfg)
    try:
        n0 = len(spills(K._lazy_bwd_dkdv_ds_kernel))
        gr = once()
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(gr, ref)]
        t = bench(f"ds {cfg} {spills(K._lazy_bwd_dkdv_ds_kernel)[n0:]} relerr " + " ".join(f"{e:.1e}" for e in errs))
        print(f"   ratio vs sdpa {t / ts:.2f}x, vs split {t / t0:.3f}", flush=True)
    except Exception as e:
        print("ds", cfg, "FAILED", type(e).__name__, str(e)[:200], flush=True)
Wr.OVERRIDES.clear()
Wr.DS_BUDGET_BYTES = 0; bench("recompute path again"); bench_main()
Wr.DS_BUDGET_BYTES = 2 << 30; bench("ds default again")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3): fb()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
