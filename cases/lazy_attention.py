"""``lazy_attention``: inputs, components, presets, strategies and the kink rule (specs/lazy_attention.md).

Case params: B, H, L, Dh, W; ``layout`` for q, k and v (``layout_q``/``layout_k``/``layout_v``
override one of them, so each may carry its own strides); ``grad_layout`` for dO (applied by the
engine's default upstream-gradient generator); ``tau`` one of "neg" (U(-0.9,-0.1) per head, the
paper's regime), "pos" (U(0.1,0.5): the causal mask must then be applied to e as well) or "mixed"
(even heads negative, odd heads positive); ``scale`` (default 1/sqrt(Dh)); ``quiet_head`` (v of the last head
scaled by it: a dormant head, whose o, dq, dk, dbias and dtau are that much smaller than the others').
"""

from __future__ import annotations

import math

import torch
from harness.references.lazy_attention import lazy_attention, lazy_attention_parts
from hypothesis import strategies as st

from harness import Axis, Case, Component, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator
from harness.model.inputs import place, randn, uniform
from harness.model.twins import adversarial, twin, with_twins

Tensor = torch.Tensor
QKV_T = "perm:0,2,1,3"          # [B,H,L,Dh] views of a [B,L,H,Dh] buffer: head stride = Dh


def _tau(kind: str, H: int, gen: torch.Generator) -> Tensor:
    neg = uniform((H,), gen, -0.9, -0.1)
    pos = uniform((H,), gen, 0.1, 0.5)
    if kind == "neg":
        return neg
    if kind == "pos":
        return pos
    if kind == "mixed":
        return torch.where(torch.arange(H) % 2 == 0, neg, pos)
    raise ValueError(f"tau={kind!r}: expected 'neg', 'pos' or 'mixed'")


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    B, H, L, Dh, W = p["B"], p["H"], p["L"], p["Dh"], p["W"]
    tensors = {}
    for name in ("q", "k", "v"):
        layout = p.get(f"layout_{name}", p.get("layout", "contiguous"))
        t = randn((B, H, L, Dh), gen, dtype)
        if name == "v" and p.get("quiet_head"):
            t[:, -1] *= p["quiet_head"]
        tensors[name] = place(t, layout, device)
    tensors["bias"] = randn((H, W), gen, scale=0.5).to(device)
    # never exactly -1: row 0 would then sit on the kink (p[0,0] = 1)
    tensors["tau"] = _tau(p.get("tau", "neg"), H, gen).to(device)
    return Inputs(tensors, {"scale": p.get("scale")})


def output_dtypes(t: dict) -> dict:
    return {"o": t["q"].dtype}


def _pos(block: str) -> Axis:
    return Axis("position", 2, block=block, default_block=64)


BATCH, HEAD = Axis("batch", 0), Axis("head", 1)
COMPONENTS = (
    Component("o", "out:o", None, (BATCH, HEAD, _pos("BLOCK_M"))),
    Component("dq", "grad:q", None, (BATCH, HEAD, _pos("BLOCK_M"))),
    Component("dk", "grad:k", None, (BATCH, HEAD, _pos("BLOCK_N"))),
    Component("dv", "grad:v", None, (BATCH, HEAD, _pos("BLOCK_N"))),
    Component("dbias", "grad:bias", None, (Axis("head", 0), Axis("distance", 1))),
    Component("dtau", "grad:tau", None, (Axis("head", 0),)),
)


# --- the kink rule -------------------------------------------------------------------------------

EPS_COMPUTE = {"ieee": 2.0 ** -23, "tf32": 2.0 ** -10}
_CHUNK_ELEMS = 1 << 24          # L*L*heads per chunk: ~10 such float64 tensors live at once
# Under TF32 matmuls the allowance of an element is capped at KINK_CAP_FLOORS floors (the largest error
# the floor reference itself shows on that component, its worst of 8 draws: harness/measure/oracle.py) plus
# what flipping ONE marked element can change there (_single_flip). The verdict's max bound on a marked
# element is then (K_MAX + KINK_CAP_FLOORS) floors + one flip + 2u, whatever the number of marked
# elements; never more than the uncapped allowance.
# Why a cap: with eps = 2^-10 the mark |z| <= 8 eps (|p| + |c|) takes every element within ~1.6% of the
# kink, and the allowance bounds flipping all of them at once, in the same direction, so it grows with
# the number of marked elements while the floor does not. Measured on an H100 (float32, the in-tree
# Triton lazy_attention kernels with tl.dot in TF32, GPU sweep, TF32 floor), dtau allowance uncapped ->
# capped: L4096-W512-D128-H2 (123,913 marked) 432 -> 3.66 (floor 0.815, |dtau| <= 1.69);
# L1024-W100-D64-B3-H2 (35,928) 234 -> 5.77 (floor 1.02); L513-W512-D128-H4-qkvT (5,048) 50.6 -> 3.42
# (floor 0.553). In issue #24 a dtau 5000x off the IEEE floor (0.045) passed at ratio 0 under the
# uncapped allowance. With few marked elements the allowance is about one flip and the cap changes
# little: CPU, seed 0, smoke L17-qkvT-dOcontig-B2 (7 marked) dtau 1.82 -> 1.07 (floor 7.3e-3), dq 0.658
# either way (floor 4.0e-3).
# Why one flip on top: a single flip is a jump of the gradient that a correct kernel makes whenever its
# rounding puts a marked z on the other side of 0, and one jump is far above the floor at small L (one
# flip moved dq by 0.25 where the floor's worst error was 6.8e-3: L17-W1-B2-H3-own-strides, seed 0). Where
# flips are common the floor's own draws flip too and the floor is large; where they are rare, a kernel
# makes one where the draws made none. Simulated correct TF32 kernels (the reference with operands
# truncated or rounded to nearest, and a variant with q pre-scaled and a base-2 softmax, each way),
# CPU smoke x 10 seeds + CPU sweep x 3 seeds, 66 cells each: no FAIL with this cap (worst ratio 0.60,
# as uncapped); capped at 3 floors without the flip, 3 FAILs (3.2x, 3.2x, 11x), each one flip that no
# floor draw made. On the H100 the TF32 kernels passed all 20 GPU sweep cells (worst ratio 0.50).
# Under IEEE float32 the allowance stays uncapped (the rule above was measured for TF32 only; the
# committed GPU records show IEEE allowances up to 5e4x the floor, e.g. dq of L1024-W512-D32-B2-H2-kT).
KINK_CAP_FLOORS = {"tf32": 3.0}


def _single_flip(p: Tensor, G: Tensor, Mf: Tensor, delta: Tensor, qb: Tensor, kb: Tensor, vb: Tensor,
                 gb: Tensor, scale: float, inv: Tensor, dist: Tensor, W: int) -> dict[str, Tensor]:
    """Bounds on what flipping any ONE marked element (i, j) of these heads changes, per component
    element (heads first; o/dq/dk/dv [h, L, Dh], dbias [h, min(W, L)], dtau [h]).

    The flip moves dp[i,j] by G[i,j] and Delta_i by p[i,j] G[i,j] <= a_i (the row's largest marked
    p G), so |d ds[i,k]| <= p[i,k] a_i + [k = j] p[i,j] G[i,j], in row i only; e[i,j] moves by at
    most delta[i,j]; c_i's gradient by G[i,j]."""
    Wm = Mf * p * G                                                    # p[i,j] G[i,j] where marked
    a = Wm.amax(-1, keepdim=True)                                      # a_i
    D = p * a + Wm                                                     # bound on |d ds[i,k]|, one flip
    md = Mf * delta
    one = {"dq": scale * a * (kb.abs().amax(-2, keepdim=True) + p @ kb.abs()),
           "dk": scale * D.amax(-2)[..., None] * qb.abs().amax(-2, keepdim=True),
           "dv": md.amax(-2)[..., None] * gb.abs().amax(-2, keepdim=True),
           "o": md.amax(-1, keepdim=True) * vb.abs().amax(-2, keepdim=True),
           "dtau": (inv[:, None] * Mf * G).amax(dim=(-1, -2))}
    diag = torch.zeros(D.shape[0], D.shape[-1], dtype=D.dtype, device=D.device)
    diag.scatter_reduce_(1, dist.expand(D.shape[0], -1), D.reshape(D.shape[0], -1), "amax")
    one["dbias"] = diag[:, :W]
    return one


def kink_bound(inputs: dict[str, Tensor], grad_outputs: dict[str, Tensor], case: Case, *,
               matmul_precision: str | None = None,
               floor_max: dict[str, float] | None = None) -> dict[str, Tensor | int]:
    """Elementwise allowance for elements within rounding of the ReLU kink (spec: "The kink rule").

    ``inputs``/``grad_outputs`` are the oracle's float64 tensors. An element (i, j <= i) is marked
    when |z| <= delta = 8 eps (|p| + |c|), eps of the backend's compute (float32; tf32 matmuls when
    ``matmul_precision`` or case param ``matmul_precision`` says "tf32"). Returns one tensor per
    component, shaped like it, bounding what flipping any subset of the marked masks can change,
    plus ``"_marked"``: the number of marked elements (0 -> all allowances are zero).

    ``floor_max`` (component -> the floor reference's largest error on it, given by the harness):
    under TF32 each allowance is capped at ``KINK_CAP_FLOORS["tf32"]`` times it plus the most that
    flipping one marked element can change there (see above); ``"_capped"`` counts the elements
    whose allowance the cap lowered.
    """
    precision = matmul_precision or case.params.get("matmul_precision", "ieee")
    eps = EPS_COMPUTE.get(precision, EPS_COMPUTE["ieee"])
    cap = KINK_CAP_FLOORS.get(precision) if floor_max is not None else None
    q, k, v, bias, tau = (inputs[n].detach().to(torch.float64) for n in ("q", "k", "v", "bias", "tau"))
    g = grad_outputs["o"].detach().to(torch.float64)
    B, H, L, Dh = q.shape
    W = bias.shape[1]
    scale = case.params.get("scale") or 1.0 / math.sqrt(Dh)
    out = {"o": torch.zeros_like(q), "dq": torch.zeros_like(q), "dk": torch.zeros_like(q),
           "dv": torch.zeros_like(q), "dbias": torch.zeros_like(bias), "dtau": torch.zeros_like(tau)}
    one = {n: torch.zeros_like(t) for n, t in out.items()} if cap is not None else {}
    pos = torch.arange(L, device=q.device)
    causal = pos[None, :] <= pos[:, None]
    dist = (pos[:, None] - pos[None, :]).clamp_min(0).flatten()      # above the diagonal dd = 0
    inv = 1.0 / (pos + 1).to(torch.float64)
    step = max(1, _CHUNK_ELEMS // (L * L))
    marked = 0
    with torch.no_grad():
        for b in range(B):
            for h0 in range(0, H, step):
                hs = slice(h0, min(H, h0 + step))
                qb, kb, vb, gb = q[b, hs], k[b, hs], v[b, hs], g[b, hs]
                P = lazy_attention_parts(qb[None], kb[None], vb[None], bias[hs], tau[hs], scale=scale)
                p, c, z = P["p"][0], P["c"][0], P["z"][0]
                delta = 8 * eps * (p.abs() + c.abs())
                M = (z.abs() <= delta) & causal
                n = int(M.sum())
                if n == 0:
                    continue
                marked += n
                Mf = M.to(torch.float64)
                G = (gb @ vb.transpose(-1, -2)).abs()                 # |g_i . v_j|
                A = (Mf * p * G).sum(-1, keepdim=True)                # bound on the change of Delta_i
                dd = p * (G * Mf + A)                                 # bound on |d ds[i,k]|
                out["dq"][b, hs] += scale * (dd @ kb.abs())
                out["dk"][b, hs] += scale * (dd.transpose(-1, -2) @ qb.abs())
                diag = torch.zeros(dd.shape[0], L, dtype=torch.float64, device=q.device)
                diag.scatter_add_(1, dist.expand(dd.shape[0], -1), dd.reshape(dd.shape[0], -1))
                out["dbias"][hs, : min(W, L)] += diag[:, :W]
                out["dtau"][hs] += (inv[:, None] * Mf * G).sum(dim=(-1, -2))
                md = Mf * delta                                       # |e| <= delta where flipped
                out["dv"][b, hs] += md.transpose(-1, -2) @ gb.abs()
                out["o"][b, hs] += md @ vb.abs()
                if cap is not None:
                    f1 = _single_flip(p, G, Mf, delta, qb, kb, vb, gb, scale, inv, dist, W)
                    for name in ("o", "dq", "dk", "dv"):
                        one[name][b, hs] = f1[name]
                    one["dbias"][hs, : min(W, L)] = torch.maximum(one["dbias"][hs, : min(W, L)], f1["dbias"])
                    one["dtau"][hs] = torch.maximum(one["dtau"][hs], f1["dtau"])
    out["_marked"] = marked
    if cap is not None and marked:
        capped = 0
        for name, limit in one.items():
            limit = limit + cap * float(floor_max.get(name, 0.0))
            over = out[name] > limit
            capped += int(over.sum())
            out[name] = torch.where(over, limit, out[name])
        out["_capped"] = capped
    return out


# --- cases ---------------------------------------------------------------------------------------

def C(name: str, B: int, H: int, L: int, Dh: int, W: int, tags: tuple[str, ...] = (), **kw) -> Case:
    return Case(name, {"B": B, "H": H, "L": L, "Dh": Dh, "W": W, **kw}, tags)


def smoke(device: str) -> list[Case]:
    first = C("L5-W7-H2", 1, 2, 5, 16, 7, ("W>L",))
    return [
        first,
        C("L17-qkvT-dOcontig-B2", 2, 2, 17, 16, 100, ("non-contiguous", "W>L"), layout=QKV_T),
        C("L17-H3-dOT-pos-tau", 1, 3, 17, 16, 7, ("positive-tau", "non-contiguous-grad"),
          tau="pos", grad_layout=QKV_T),
        # what the sweep has besides (tests/test_coverage.py): L = BLOCK (16 interpreted), q, k, v and dO each
        # with its own strides (v and dO padded), and a layout twin
        C("L16-W7-own-strides", 1, 2, 16, 16, 7, ("BLOCK", "own-strides"),
          layout_q=QKV_T, layout_k="contiguous", layout_v="pad", grad_layout="pad"),
        twin(first, "mixed"), *adversarial(first),
    ]


def _sweep_cpu() -> list[Case]:
    # interpreted Triton runs BLOCK = 16: L in {15, 16, 17, 33, 65} straddles one to four blocks
    return [
        C("L1-W1", 1, 2, 1, 16, 1, ("L=1",)),
        C("L2-W7-B2-H1", 2, 1, 2, 16, 7, ("W>L",)),
        C("L15-W16-H3-qkvT", 1, 3, 15, 16, 16, ("BLOCK-1", "non-contiguous"), layout=QKV_T),
        C("L16-W7-D32-dOT", 1, 2, 16, 32, 7, ("BLOCK", "non-contiguous-grad"), grad_layout=QKV_T),
        C("L17-W100-B3-qkvT", 3, 2, 17, 16, 100, ("BLOCK+1", "W>L", "non-contiguous"), layout=QKV_T),
        C("L33-W16-H4", 1, 4, 33, 16, 16, ("2BLOCK+1", "W=BLOCK")),
        C("L33-W7-B2-H2-dOpad", 2, 2, 33, 16, 7, ("non-contiguous-grad",), grad_layout="pad"),
        C("L17-W7-pos", 1, 2, 17, 16, 7, ("positive-tau",), tau="pos"),
        C("L33-W100-D32-pos-qkvT-dOT", 1, 3, 33, 32, 100, ("positive-tau", "non-contiguous"),
          tau="pos", layout=QKV_T, grad_layout=QKV_T),
        C("L17-W1-B2-H3-own-strides", 2, 3, 17, 16, 1, ("non-contiguous", "own-strides"),
          layout_q=QKV_T, layout_k="contiguous", layout_v="pad", grad_layout="pad"),
        C("L65-W64-H2", 1, 2, 65, 16, 64, ("4BLOCK+1", "W>BLOCK")),
        C("L16-W16-B3-mixed-qkvT", 3, 2, 16, 16, 16, ("mixed-tau", "non-contiguous"),
          tau="mixed", layout=QKV_T),
        # a dormant head (its v 1e-3 of the others'): the local rule judges its tiles against their own magnitude
        C("L33-W16-H4-quiet", 1, 4, 33, 16, 16, ("dormant-head",), quiet_head=1e-3),
    ]


def _sweep_gpu() -> list[Case]:
    # a covering selection of the spec's lists (every value of H, L, Dh, W, B appears), not the product
    return [
        C("L1-W1-D16", 1, 1, 1, 16, 1, ("L=1",)),
        C("L2-W7-D32-B2", 2, 2, 2, 32, 7, ("W>L",)),
        C("L17-W16-D64-B3-H4-qkvT", 3, 4, 17, 64, 16, ("non-contiguous",), layout=QKV_T),
        C("L17-W100-D128", 1, 2, 17, 128, 100, ("W>L",)),
        C("L64-W64-D128-H8", 1, 8, 64, 128, 64, ("BLOCK",)),
        C("L64-W512-D16-B3-H1", 3, 1, 64, 16, 512, ("W>L",)),
        C("L100-W100-D64-B2-H4-dOT", 2, 4, 100, 64, 100, ("non-contiguous-grad",), grad_layout=QKV_T),
        C("L100-W7-D128-H4-dOT", 1, 4, 100, 128, 7, ("non-contiguous-grad",), grad_layout=QKV_T),
        C("L127-W512-D128-H2-qkvT", 1, 2, 127, 128, 512, ("W>L", "non-contiguous"), layout=QKV_T),
        C("L127-W64-D64-H8-pos", 1, 8, 127, 64, 64, ("positive-tau",), tau="pos"),
        C("L128-W16-D64-H4", 1, 4, 128, 64, 16, ("BLOCK",)),
        C("L128-W100-D128-B2-H8-mixed-dOpad", 2, 8, 128, 128, 100, ("mixed-tau", "non-contiguous"),
          tau="mixed", layout=QKV_T, grad_layout="pad"),
        C("L129-W7-D32-B2-H8-dOpad", 2, 8, 129, 32, 7, ("BLOCK+1", "non-contiguous-grad"), grad_layout="pad"),
        C("L129-W1-D16-B2-H4-pos", 2, 4, 129, 16, 1, ("positive-tau",), tau="pos"),
        C("L513-W512-D128-H4-qkvT", 1, 4, 513, 128, 512, ("non-contiguous",), layout=QKV_T),
        C("L513-W16-D32-H1-own-strides", 1, 1, 513, 32, 16, ("own-strides",),
          layout_q="contiguous", layout_k=QKV_T, layout_v="pad", grad_layout=QKV_T),
        C("L1024-W100-D64-B3-H2", 3, 2, 1024, 64, 100, ("long",)),
        C("L1024-W64-D128-H8-pos-qkvT-dOT", 1, 8, 1024, 128, 64, ("positive-tau", "non-contiguous"),
          tau="pos", layout=QKV_T, grad_layout=QKV_T),
        C("L1024-W512-D32-B2-H2-kT", 2, 2, 1024, 32, 512, ("own-strides",), layout_k=QKV_T),
        C("L4096-W512-D128-H2", 1, 2, 4096, 128, 512, ("long", "kink-heavy")),
        C("L256-W64-D64-H8-quiet", 1, 8, 256, 64, 64, ("dormant-head",), quiet_head=1e-3),
    ]


def sweep(device: str) -> list[Case]:
    # layout twins (harness/model/twins.py) of a few cases: H > 1 and B > 1, each tau regime
    if device == "cpu":
        return with_twins(_sweep_cpu(), only=("L15-W16-H3-qkvT", "L16-W16-B3-mixed-qkvT", "L17-W7-pos"))
    return with_twins(_sweep_gpu(), only=("L17-W16-D64-B3-H4-qkvT", "L129-W7-D32-B2-H8-dOpad",
                                          "L127-W64-D64-H8-pos"))


def full(device: str) -> list[Case]:
    # GPU only by design; on CPU (Triton interpreter) it is the CPU sweep.
    cases = sweep(device)
    if device == "cpu":
        return cases
    Hs, Ws, Bs = (1, 2, 4, 8), (1, 7, 16, 64, 100, 512), (1, 2, 3)
    layouts = [{}, {"layout": QKV_T}, {"grad_layout": QKV_T}, {"layout": QKV_T, "grad_layout": "pad"}]
    taus = ("neg", "pos", "mixed")
    n = 0
    for L in (1, 2, 17, 64, 100, 127, 128, 129, 255, 257, 513, 1024, 2048, 4096):
        for Dh in (16, 32, 64, 128):
            H, W, B = Hs[n % 4], Ws[n % 6], Bs[n % 3]
            if L >= 2048:
                B = 1
            lay, tau = layouts[n % 4], taus[n % 3]
            name = f"full-L{L}-W{W}-D{Dh}-B{B}-H{H}-{tau}" + "".join(f"-{k}" for k in lay)
            cases.append(C(name, B, H, L, Dh, W, ("full",), tau=tau, **lay))
            n += 1
    return cases


def bench_cases(device: str) -> list[Case]:
    return [C("bench-B4-H16-L4096-D128-W512", 4, 16, 4096, 128, 512)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    """Causal matmul FLOPs. ``fwd_flops``/``bwd_flops`` are the figures SDPA is quoted with
    (fwd 2 causal matmuls, bwd 2.5x fwd); ``*_executed`` count this operator's passes:
    forward QK^T twice (LSE, then output) plus PV; backward QK^T in each of its three passes,
    m V for Delta, dO V^T twice, dS K, P^T dO and dS^T Q."""
    B, H, L, Dh = p["B"], p["H"], p["L"], p["Dh"]
    es = torch.empty((), dtype=dtype).element_size()
    mm = 2.0 * B * H * (L * L / 2) * Dh                # one causal [L,L]x[L,Dh] matmul, as SDPA is quoted
    tensor = B * H * L * Dh * es
    return {"fwd_flops": 2 * mm, "bwd_flops": 5 * mm, "fwd_flops_executed": 3 * mm,
            "bwd_flops_executed": 9 * mm, "fwd_bytes": 4 * tensor, "bwd_bytes": 8 * tensor}


def strategy(device: str):
    blocks = (16, 32) if device == "cpu" else (16, 32, 64, 128)
    boundary = sorted({n for b in blocks for n in (b - 1, b, b + 1, 2 * b + 1)})
    Ls = st.one_of(st.sampled_from(boundary), st.integers(1, 40))
    Dhs = st.sampled_from((16, 32) if device == "cpu" else (16, 32, 64, 128))
    layouts = st.sampled_from(["contiguous", QKV_T, "pad"])

    def build(B: int, H: int, L: int, Dh: int, W: int, layout: str, grad_layout: str, tau: str) -> Case:
        lay, glay = layout.replace(":", ""), grad_layout.replace(":", "")
        name = f"hyp-B{B}-H{H}-L{L}-D{Dh}-W{W}-{tau}-{lay}-dO{glay}"
        return C(name, B, H, L, Dh, W, ("hypothesis",), layout=layout, grad_layout=grad_layout, tau=tau)

    return st.builds(build, st.integers(1, 3), st.sampled_from([2, 3, 4, 1]), Ls, Dhs,
                     st.sampled_from([1, 7, 16, 17, 33, 100]), layouts, layouts,
                     st.sampled_from(["neg", "pos", "mixed"]))


SPEC = register_operator(OperatorSpec(
    name="lazy_attention",
    aliases=("lazy",),
    inputs=("q", "k", "v", "bias", "tau"),
    differentiable=("q", "k", "v", "bias", "tau"),
    outputs=("o",),
    graded_outputs=("o",),
    reference=lazy_attention,
    make_inputs=make_inputs,
    output_dtypes=output_dtypes,
    components=COMPONENTS,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="q",
    extra_bound=kink_bound,
    # (batch, head) pairs are independent (dbias and dtau: sums over the batch); per pair the float64
    # reference holds about a dozen [L, L] tensors (s, p, z, e, masks, their gradients)
    separable=Separable((SplitAxis("batch", {"q": 0, "k": 0, "v": 0, "o": 0}),
                         SplitAxis("head", {"q": 1, "k": 1, "v": 1, "o": 1, "bias": 0, "tau": 0})),
                        slice_bytes=lambda i: 24 * 8 * i.tensors["q"].shape[2] ** 2),
    invariants=None,
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    # issue 30: bf16, B=4, H=16, L=4096, Dh=128, W=512, against SDPA (causal) on the same shapes. Its 2.5x for
    # a backward without L*L memory is what this backend is now (one backend since the ds path went)
    perf_targets=(PerfTarget("triton", "fwd_bwd_ms", 2.0, versus="sdpa", label="fwd+bwd / SDPA"),),
    doc="causal attention with Elastic-Softmax: relu(softmax(qk^T*scale + bias) + tau/(i+1)) v, "
        "per-head relative bias [H,W] and offset tau [H] (specs/lazy_attention.md)",
))
