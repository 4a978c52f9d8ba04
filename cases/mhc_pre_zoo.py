"""Bug-zoo mutants of the mhc_pre backends (docs/specs/bug-zoo.md): the Triton ones run on CPU too, the CUDA
cluster kernel's on a GPU only.

Edits apply to a copy of the backend's package. The Triton dx kernel's blocks are BLOCK_ND features of
one stream (64 under the interpreter, 128 on a GPU); with D a multiple of both they line up with the
harness's flattened nD blocks, so "all but the last block" reads the same on CPU and GPU. (At D = 192
the GPU's last block of stream 0 is a partial one, and the flattened block holding it is half bad:
mhc-last-block-only was MISSED on H100s at 9ce83aa, c8b8606 and c72af82 for that reason alone.)
"""

from __future__ import annotations

from harness.cases.mhc_pre import C

from harness import Expectation, register_mutant
from harness.model.spec import Mutant

# nD = 2 * 256 = 512: eight interpreter blocks of 64 and four GPU blocks of 128 (> 2 * BLOCK_ND either way),
# three token blocks of 16; alpha ~ U(0.5, 1.5) (realistic init) so the GEMM term of dx is far above rounding
CASE = C("zoo-n2-D256-T40", 1, 40, 2, 256, ("zoo",))
DPHI = ("dphi.pre", "dphi.post", "dphi.res")
DALPHA = ("dalpha.pre", "dalpha.post", "dalpha.res")
DBIAS = ("dbias.pre", "dbias.post", "dbias.res")
OUTS = ("h_in", "h_post", "h_res")
_DX_LINE = "dxv = mmg - cf[None, :] * xf + hp[None, :] * gi"
_DG_LINE = "dg = tl.sum(ph * P, axis=0)"

register_mutant(Mutant(
    id="mhc-last-block-only", operator="mhc_pre", backend="triton", seed="mhc log, issue 8.5",
    description="dvecX_mm keeps only the last BLOCK_ND block of nD: dx loses its GEMM term and "
                "dgamma (sum_t x * dvecX_mm) is zero in every earlier block",
    edits=(("kernels.py", _DX_LINE,
            "dxv = tl.where(tl.min(j, axis=0) + BLOCK_ND >= nD, mmg, 0.0) - cf[None, :] * xf + hp[None, :] * gi"),
           ("kernels.py", _DG_LINE, "dg = tl.where(j0 + BLOCK_ND >= nD, tl.sum(ph * P, axis=0), 0.0)")),
    # dgamma's edit is in the reduce kernel, whose blocks are red_nd = 64 features on CPU and GPU alike: on a
    # GPU (declared BLOCK_ND 128) the kept block is half of the last flattened block, so every dgamma slice
    # reads bad there (H100, 062f109); dx's blocks are the declared ones, and its localization is the check
    expect=(Expectation(CASE, "float32", fail=("dx", "dgamma"), passing=OUTS + DPHI + DALPHA + DBIAS,
                        hint="accumulation-lost", where={"dx": {"nD": "all-but-last"}}),),
))

register_mutant(Mutant(
    id="mhc-dx-missing-gemm", operator="mhc_pre", backend="triton", seed="mhc log, status table",
    description="dx omits dvecX_mm * gamma",
    edits=(("kernels.py", _DX_LINE, "dxv = - cf[None, :] * xf + hp[None, :] * gi"),),
    expect=(Expectation(CASE, "float32", fail=("dx",), passing=OUTS + DPHI + DALPHA + DBIAS + ("dgamma",), hint="none",
                        where={"dx": {"nD": "all", "token": "all"}}),),
))

register_mutant(Mutant(
    id="mhc-dphi-zeros", operator="mhc_pre", backend="triton", seed="mhc log",
    description="dphi never written (left as allocated: zeros)",
    edits=(("kernels.py", "tl.store(dphi_ptr + (m.to(tl.int64) * nD)[:, None] + j[None, :], P, mask=msk)",
            "pass"),),
    expect=(Expectation(CASE, "float32", fail=DPHI, zeros=DPHI, hint="zeros",
                        passing=OUTS + ("dx", "dgamma") + DALPHA + DBIAS),),
))

register_mutant(Mutant(
    id="mhc-dgamma-zeros", operator="mhc_pre", backend="triton", seed="mhc log",
    description="dgamma never written (left as allocated: zeros)",
    edits=(("kernels.py", "tl.store(dgamma_ptr + j, dg, mask=jm)", "pass"),),
    expect=(Expectation(CASE, "float32", fail=("dgamma",), zeros=("dgamma",), hint="zeros",
                        passing=OUTS + ("dx",) + DPHI + DALPHA + DBIAS),),
))

register_mutant(Mutant(
    id="mhc-store-into-input", operator="mhc_pre", backend="triton", seed="mhc log, issue 5",
    description="dx stored through x's pointer; the dx buffer stays as allocated (zeros, as in the seed)",
    # the pointer path's tile gets x's pointer where dx's belongs; on a Hopper GPU the kernel reads x through TMA
    # descriptors and has no x pointer to misuse, so the mutant turns that path off (else its GPU run tests
    # nothing: MISSED on an H100 at 9ce83aa and 37ca9b3, dx PASS)
    edits=(("kernels.py", "acc_phi = _nd_tile(xt, gi, cf, hp, cur, r2, dx_ptr,",
            "acc_phi = _nd_tile(xt, gi, cf, hp, cur, r2, x_ptr,"),
           ("wrapper.py", "dx = torch.empty(x.shape, dtype=x.dtype, device=dev)",
            "dx = torch.zeros(x.shape, dtype=x.dtype, device=dev)"),
           ("wrapper.py", "ND_TMA = True", "ND_TMA = False")),
    expect=(Expectation(CASE, "float32", fail=("dx",), contracts=("input-unchanged",), hint="zeros",
                        passing=OUTS + DPHI + DALPHA + DBIAS + ("dgamma",)),),
))

# The harness runs this backend through its (forward, backward) pair, as it runs golden: the wrong shape
# reaches the verdict, which marks dgamma SHAPE and still judges the other components. (Through the
# autograd wrapper, autograd itself rejects a gradient of shape [n, D] for an input of shape [n*D].)
register_mutant(Mutant(
    id="mhc-dgamma-shape", operator="mhc_pre", backend="triton", seed="mhc log, issue 6",
    description="dgamma returned as [n, D] instead of [n*D]",
    edits=(("wrapper.py", "return dx, dphi, dalpha, dbias, dgamma\n",
            "return dx, dphi, dalpha, dbias, dgamma.view(n, D) if dgamma is not None else None\n"),),
    expect=(Expectation(CASE, "float32", fail=("dgamma",), status="SHAPE", hint="shape",
                        passing=OUTS + ("dx",) + DPHI + DALPHA + DBIAS),),
))

register_mutant(Mutant(
    id="mhc-pre-section", operator="mhc_pre", backend="triton", seed="mhc log, 2025-02-25 part",
    description="the pre section's sigmoid derivative s * (1 - s) replaced by s",
    edits=(("kernels.py", "dz = tl.where(pre, dhp_m * sig * (1.0 - sig), 0.0)",
            "dz = tl.where(pre, dhp_m * sig, 0.0)"),),
    expect=(Expectation(CASE, "float32", fail=("dalpha.pre", "dbias.pre", "dphi.pre"), hint="none",
                        passing=OUTS + ("dalpha.post", "dalpha.res", "dbias.post", "dbias.res",
                                        "dphi.post", "dphi.res")),),
))


# The cluster kernel's planted defect needs a row split over several blocks: at n = 4, D = 4096 the plan
# takes a cluster of 8 (bf16, 16 tokens a block); at small D one block holds the row and no meeting happens.
CLUSTER_CASE = C("zoo-cluster-n4-D4096-T40", 1, 40, 4, 4096, ("zoo",))

register_mutant(Mutant(
    id="mhc-cluster-own-partial", operator="mhc_pre", backend="cuda", seed="thread-block clusters (issue 27)",
    description="each block of a cluster takes its own partial sums for the cluster's (the DSMEM meeting "
                "dropped): h_pre, inv_rms and h_mix come from one feature slice of the row",
    edits=(("mhc_pre.cu", "v[q] = q < C ? *cluster.map_shared_rank(p, q) : 0.f;", "v[q] = q == 0 ? *p : 0.f;"),),
    expect=(Expectation(CLUSTER_CASE, "bfloat16", fail=OUTS, where={"h_in": {"token": "all"}}),),
))
