"""What each addition to the dk/dv kernel costs (H100, bench shape): the ds-storing kernel timed alone with
constexpr switches for the ds store (and its layout), the dbias diagonal chunks and the dtau sums."""
import os, sys, re, importlib, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), ".scratch"))
from triton.testing import do_bench
import triton
import backends.triton.lazy_attention.wrapper as Wr
src = open("backends/triton/lazy_attention/kernels.py").read()
src = src.replace("import triton.language as tl", "import triton.language as tl\nSTORE = tl.constexpr(int(__import__('os').environ.get('K_STORE', '1')))\nDIAG = tl.constexpr(int(__import__('os').environ.get('K_DIAG', '1')))\nDTAU = tl.constexpr(int(__import__('os').environ.get('K_DTAU', '1')))")
src = src.replace("        tl.store(ds_strip + (offs_m - n0)[None, :] * BLOCK_N + (offs_n - n0)[:, None], dsT16,\n                 mask=(offs_m < L)[None, :])",
  "        if STORE == 1:\n            tl.store(ds_strip + (offs_m - n0)[None, :] * BLOCK_N + (offs_n - n0)[:, None], dsT16, mask=(offs_m < L)[None, :])\n        if STORE == 2:\n            tl.store(ds_strip + (offs_n - n0)[:, None] * L + (offs_m - n0)[None, :], dsT16, mask=(offs_m < L)[None, :])")
src = src.replace("        inv = tl.div_rn(", "        if DTAU:\n          inv = tl.div_rn(")
src = src.replace("        dts += tl.sum(tl.sum(dpT", "          dts += tl.sum(tl.sum(dpT")
src = src.replace("        if BIAS:\n            # chunk i of this tile", "        if BIAS and DIAG:\n            # chunk i of this tile")
open(".scratch/lazy_diag_k.py", "w").write(src)
B, H, L, D, W = 4, 16, 4096, 128, 512
torch.manual_seed(0)
q, k, v, g = (torch.randn(B, H, L, D, device="cuda").bfloat16() for _ in range(4))
bias = 0.5 * torch.randn(H, W, device="cuda"); tau = -0.1 - 0.8 * torch.rand(H, device="cuda")
scale = D ** -0.5
o, lse = Wr.lazy_forward(q, k, v, bias, tau, scale)
delta = torch.empty((B, H, L), device="cuda"); Wr.launch_delta(q, k, v, bias, tau, lse, g, scale, delta)
dq, dk, dv = (torch.empty_like(q) for _ in range(3))
t = do_bench(lambda: Wr.launch_dkdv(q, k, v, bias, tau, lse, g, scale, delta, dk, dv), rep=300, return_mode="median")
print(f"old dkdv kernel {t:.3f} ms", flush=True)
t = do_bench(lambda: Wr.launch_dq(q, k, v, bias, tau, lse, g, scale, delta, dq), rep=300, return_mode="median")
print(f"old dq kernel {t:.3f} ms", flush=True)
n_n = L // 128
part = torch.zeros((B * n_n, H, W + 1), device="cuda")
ds = torch.empty((Wr.ds_bytes(q) // 2 + 2 * B * H * L * 128,), dtype=q.dtype, device="cuda")
for cfg in sys.argv[1:]:
    st, di, dt, bm, bn, nw, ns = (int(x) for x in cfg.split(","))
    os.environ.update(K_STORE=str(st), K_DIAG=str(di), K_DTAU=str(dt))
    import lazy_diag_k; importlib.reload(lazy_diag_k)
    kern = lazy_diag_k._lazy_bwd_dkdv_ds_kernel
    def run():
        kern[(triton.cdiv(L, bn), H, B)](q, k, v, g, bias, tau, lse, delta, dk, dv, ds, part, *q.stride(), *k.stride(), *v.stride(),
            *g.stride(), *dk.stride(), *dv.stride(), bias.stride(0), bias.stride(1), tau.stride(0), H, L, W,
            scale * Wr.LOG2E, scale, DH=D, BLOCK_M=bm, BLOCK_N=bn, PREC="tf32", num_warps=nw, num_stages=ns)
    try:
        t = do_bench(run, rep=300, return_mode="median")
        sp = [(c.n_regs, c.n_spills) for c in (list(kern.device_caches.values())[0][0].values())]
        print(f"store={st} diag={di} dtau={dt} {bm}x{bn} w{nw} s{ns}: {t:.3f} ms {sp}", flush=True)
    except Exception as e:
        print(cfg, "FAILED", str(e)[:200], flush=True)
