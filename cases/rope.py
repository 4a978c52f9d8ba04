"""``rope``: rotary position embedding of x [batch, seq, heads, head_dim] (docs/specs/rope.md).

Case params: B, S, H, D; the options ``base``, ``interleaved`` (pairs (2p, 2p+1); else half-split (p, p + D/2),
GPT-NeoX) and ``offset`` (the first position); ``layout`` of x (``perm:0,2,1,3``: x viewed from a [B, H, S, D]
tensor, as q is after a head transpose), ``grad_layout`` of the upstream gradient; ``dtypes`` restricts a case
to those dtypes.

Sizes are set against the Triton backend's tiles (backends/triton/rope/wrapper.py): BLOCK_T positions x BLOCK_H
heads, 4 x 2 under the interpreter and 16 x 4 on a GPU; the head dimension is always whole.
"""

from __future__ import annotations

import torch
from harness.references.rope import rope
from hypothesis import strategies as st

from harness import Case, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator, tensor
from harness.model.twins import adversarial, twin, with_twins

# the Triton backend's tiles per device (a test checks them against its adapter's declared blocks)
BLOCKS = {"cpu": {"BLOCK_T": 4, "BLOCK_H": 2}, "cuda": {"BLOCK_T": 16, "BLOCK_H": 4}}
# a long context's later chunk: positions 4095 ... (angles of thousands of radians: their float32 rounding is the
# floor's largest error); both presets use the same values, so that smoke has each (tests/test_coverage.py)
OFFSET = 4095


def C(name: str, B: int, S: int, H: int, D: int, tags: tuple[str, ...] = (), *, interleaved: bool = False,
      offset: int = 0, base: float = 10000.0, **kw) -> Case:
    return Case(name, {"B": B, "S": S, "H": H, "D": D, "interleaved": interleaved, "offset": offset, "base": base,
                       **kw}, tags)


def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
    p = case.params
    x = tensor((p["B"], p["S"], p["H"], p["D"]), gen, dtype, device, layout=p.get("layout", "contiguous"))
    return Inputs({"x": x}, {"base": float(p["base"]), "interleaved": bool(p["interleaved"]),
                             "offset": int(p["offset"])})


def _tag(interleaved: bool, offset: int) -> str:
    return ("-il" if interleaved else "-half") + (f"-off{offset}" if offset else "")


def smoke(device: str) -> list[Case]:
    """Every feature of the sweep: positions and heads below, at and past one tile, both pair layouts, both
    offsets, x transposed, permuted, padded and strided, the gradient with strides of its own."""
    b = BLOCKS["cpu" if device == "cpu" else "cuda"]
    bt, bh = b["BLOCK_T"], b["BLOCK_H"]
    mixed = C(f"B2-S{bt + 1}-H{bh + 1}-D16", 2, bt + 1, bh + 1, 16, ("twin",), interleaved=True, offset=OFFSET)
    return [
        C(f"B1-S{bt - 1}-H1-D8-half", 1, bt - 1, 1, 8, ("size",)),
        C(f"B2-S{bt}-H{bh}-D30-il-off{OFFSET}-xT-gradpad", 2, bt, bh, 30, ("non-contiguous",), interleaved=True,
          offset=OFFSET, layout="transposed", grad_layout="pad"),
        C(f"B2-S{bt + 1}-H{bh + 1}-D16-half-off{OFFSET}-xpad-gradT", 2, bt + 1, bh + 1, 16, ("non-contiguous",),
          offset=OFFSET, layout="pad:3", grad_layout="transposed"),
        C(f"B1-S{bt + 1}-H{bh + 1}-D16-il-xperm", 1, bt + 1, bh + 1, 16, ("non-contiguous",), interleaved=True,
          layout="perm:0,2,1,3"),
        twin(mixed, "mixed"), *adversarial(mixed),
    ]


def sweep(device: str) -> list[Case]:
    b = BLOCKS["cpu" if device == "cpu" else "cuda"]
    bt, bh = b["BLOCK_T"], b["BLOCK_H"]
    if device == "cpu":
        grid = [(1, 1, 1, 2), (1, 3, 1, 8), (2, bt, bh, 16), (1, bt + 1, bh + 1, 30), (2, 2 * bt + 1, 5, 64),
                (1, 4 * bt, 2 * bh, 32)]
        B, S, H, D = 2, 9, 3, 32
    else:
        grid = [(1, 1, 1, 2), (1, 3, 1, 64), (2, bt, bh, 128), (1, bt + 1, bh + 1, 128), (2, 1000, 5, 64),
                (4, 2048, 32, 128), (1, 4096, 7, 80)]
        B, S, H, D = 2, 300, 9, 128
    cases = []
    for il in (False, True):
        for off in (0, OFFSET):
            cases += [C(f"B{b_}-S{s}-H{h}-D{d}{_tag(il, off)}", b_, s, h, d, ("size",), interleaved=il, offset=off)
                      for b_, s, h, d in grid]
    cases.append(C(f"B{B}-S{S}-H{H}-D{D}-half-base5e5", B, S, H, D, ("base",), base=500000.0))
    for il in (False, True):
        lay = [("xT", "transposed", "contiguous"), ("xperm", "perm:0,2,1,3", "contiguous"),
               ("xpad", "pad:3", "contiguous"), ("xstride", "stride:2", "contiguous"),
               ("gradT", "contiguous", "transposed"), ("gradpad", "contiguous", "pad:7"),
               ("gradstride", "contiguous", "stride:3"), ("xpad-gradT", "pad:3", "transposed")]
        cases += [C(f"B{B}-S{S}-H{H}-D{D}{_tag(il, OFFSET)}-{n}", B, S, H, D, ("non-contiguous",), interleaved=il,
                    offset=OFFSET, layout=lo, grad_layout=g) for n, lo, g in lay]
    twins = [C(f"B{B}-S{S}-H{H}-D{D}{_tag(il, OFFSET)}-twins", B, S, H, D, ("twin",), interleaved=il, offset=OFFSET)
             for il in (False, True)]
    return cases + with_twins(twins)


def full(device: str) -> list[Case]:
    cases = sweep(device)
    if device == "cpu":
        return cases
    for il in (False, True):
        cases += [C(f"full-B{b_}-S{s}-H{h}-D{d}{_tag(il, OFFSET)}", b_, s, h, d, ("full",), interleaved=il,
                    offset=OFFSET) for b_, s, h, d in ((8, 4096, 32, 128), (1, 32768, 8, 128), (2, 8192, 64, 64))]
    # the last element sits past 2^31: B * S * H * D = 2 * 131072 * 64 * 128 (bf16, 4.3 GB; the oracle runs batch
    # by batch and position chunk by chunk)
    cases.append(C("B2-S131072-H64-D128-int64", 2, 131072, 64, 128, ("64-bit-offsets",), dtypes=["bfloat16"]))
    return cases


BENCH = "bench-B8-S4096-H32-D128"


def bench_cases(device: str) -> list[Case]:
    # q of a Llama-sized layer over 8 x 4096 tokens, both pair layouts, at a later chunk's offset
    return [C(BENCH + _tag(il, OFFSET), 8, 4096, 32, 128, interleaved=il, offset=OFFSET) for il in (False, True)]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # the floor: read x once, write out once (the backward the same with dout and dx)
    n = p["B"] * p["S"] * p["H"] * p["D"]
    es = torch.empty((), dtype=dtype).element_size()
    return {"fwd_bytes": 2 * n * es, "bwd_bytes": 2 * n * es, "floor_bytes": 4 * n * es,
            "fwd_flops": 3 * n, "bwd_flops": 3 * n}


def strategy(device: str):
    b = BLOCKS["cpu" if device == "cpu" else "cuda"]
    bt, bh = b["BLOCK_T"], b["BLOCK_H"]
    S = st.one_of(st.sampled_from([1, bt - 1, bt, bt + 1, 2 * bt + 1]), st.integers(1, 6 * bt))
    H = st.one_of(st.sampled_from([1, bh, bh + 1, 2 * bh + 1]), st.integers(1, 4 * bh))
    D = st.sampled_from([2, 8, 30, 64, 128] if device == "cpu" else [64, 80, 128, 256])
    layouts = ["contiguous", "transposed", "perm:0,2,1,3", "pad", "stride:2"]

    def build(B: int, S: int, H: int, D: int, il: bool, off: int, layout: str, grad_layout: str) -> Case:
        name = (f"hyp-B{B}-S{S}-H{H}-D{D}{_tag(il, off)}-{layout.replace(':', '').replace(',', '')}"
                f"-g{grad_layout.replace(':', '')}")
        return C(name, B, S, H, D, ("hypothesis",), interleaved=il, offset=off, layout=layout,
                 grad_layout=grad_layout)

    return st.builds(build, st.integers(1, 3), S, H, D, st.booleans(), st.sampled_from([0, OFFSET]),
                     st.sampled_from(layouts), st.sampled_from(["contiguous", "transposed", "pad"]))


SPEC = register_operator(OperatorSpec(
    name="rope",
    inputs=("x",),
    differentiable=("x",),
    outputs=("out",),
    graded_outputs=("out",),
    reference=rope,
    make_inputs=make_inputs,
    presets={"smoke": smoke, "sweep": sweep, "full": full},
    dtype_input="x",
    dims={"x": ("batch", "seq", "head", "dim"), "out": ("batch", "seq", "head", "dim")},
    dim_blocks={"seq": "BLOCK_T", "head": "BLOCK_H"},
    # batches and heads are independent: the oracle of a large case batch by batch and head block by head block
    separable=Separable((SplitAxis("batch", {"x": 0, "out": 0}), SplitAxis("head", {"x": 2, "out": 2}))),
    strategy=strategy,
    cost_model=cost_model,
    bench_cases=bench_cases,
    # issue 47: forward + backward no slower than torch.compile of the eager backend
    perf_targets=(PerfTarget("triton", "fwd_bwd_ms", 1.0, versus="torch-compile", label="fwd+bwd / torch.compile"),),
    doc="rotary position embedding of x [B, S, H, D], interleaved or half-split pairs (specs/rope.md)",
))
