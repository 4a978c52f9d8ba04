"""``swiglu``: out = silu(gate) * up (docs/specs/swiglu.md); the case machinery shared with cases/geglu.py.

Case params: R (rows), F (features); ``layout`` of gate and up (both; ``fused``: the two halves of one
[R, 2F] tensor, as a fused gate-and-up projection gives them), ``grad_layout`` of the upstream
gradient; ``scale`` of the gate (8: sigmoid saturated at both ends, gelu's tails); ``approximate`` (geglu
only: "none" or "tanh"); ``dtypes`` restricts a case to those dtypes (the 64-bit-offset case is bf16 only).

Sizes are set against the Triton backend's tiles (backends/triton/gated_mlp/wrapper.py): BLOCK_R rows x
BLOCK_F features, 4 x 32 under the interpreter and 4 x 1024 on a GPU. Each preset has one row tile and one
feature block exact, one more than it, several with a partial last one, a single row and a single feature.
"""

from __future__ import annotations

import torch
from harness.references.gated_mlp import swiglu
from hypothesis import strategies as st

from harness import Case, Inputs, OperatorSpec, PerfTarget, Separable, SplitAxis, register_operator, tensor
from harness.model.twins import adversarial, twin, with_twins

# the Triton backend's tiles per device (a test checks them against its adapter's declared blocks)
BLOCKS = {"cpu": {"BLOCK_R": 4, "BLOCK_F": 32}, "cuda": {"BLOCK_R": 4, "BLOCK_F": 1024}}

DIMS = {"gate": ("row", "feature"), "up": ("row", "feature"), "out": ("row", "feature")}
DIM_BLOCKS = {"row": "BLOCK_R", "feature": "BLOCK_F"}


def C(name: str, R: int, F: int, tags: tuple[str, ...] = (), **kw) -> Case:
    return Case(name, {"R": R, "F": F, **kw}, tags)


def make_inputs_for(with_approximate: bool):
    def make_inputs(case: Case, dtype: torch.dtype, gen: torch.Generator, device: str) -> Inputs:
        p = case.params
        layout = p.get("layout", "contiguous")
        fused = layout == "fused"
        lay = "contiguous" if fused else layout
        gate = tensor((p["R"], p["F"]), gen, dtype, device, layout=lay, scale=p.get("scale", 1.0))
        up = tensor((p["R"], p["F"]), gen, dtype, device, layout=lay)
        if fused:
            # one [R, 2F] tensor (the fused gate-and-up projection's output), gate and up its two halves
            x = torch.cat((gate, up), dim=1)
            gate, up = x[:, : p["F"]], x[:, p["F"]:]
        opts = {"approximate": p.get("approximate", "none")} if with_approximate else {}
        return Inputs({"gate": gate, "up": up}, opts)
    return make_inputs


def _dev(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda"


def smoke_cases(device: str, opts: list[dict]) -> list[Case]:
    """Every feature of the sweep (tests/test_coverage.py): rows and features below, at and past one tile,
    gate/up transposed, padded and strided, the upstream gradient with strides of its own, every option."""
    b = BLOCKS[_dev(device)]
    br, bf = b["BLOCK_R"], b["BLOCK_F"]
    o = [opts[i % len(opts)] for i in range(4)]
    mixed = C(f"R{br + 1}-F{bf + 8}", br + 1, bf + 8, ("twin",), **o[3])
    return [
        C(f"R{br - 1}-F{bf - 1}", br - 1, bf - 1, ("size",), **o[0]),
        C(f"R{br}-F{bf}-transposed-gradpad", br, bf, ("non-contiguous",), layout="transposed", grad_layout="pad",
          **o[1]),
        C(f"R{br + 1}-F{bf + 1}-pad-gradT", br + 1, bf + 1, ("non-contiguous",), layout="pad:3",
          grad_layout="transposed", scale=8.0, **o[2]),
        twin(mixed, "mixed"), *adversarial(mixed),
    ]


def sweep_cases(device: str, opts: list[dict]) -> list[Case]:
    """Sizes past every tile, every layout twin, the wide gate, and each option at every size."""
    b = BLOCKS[_dev(device)]
    br, bf = b["BLOCK_R"], b["BLOCK_F"]
    if device == "cpu":
        grid = [(1, 1), (1, bf), (3, 31), (br, bf), (br + 1, bf + 1), (7, 100), (2 * br + 1, 4 * bf + 2),
                (4 * br, 2 * bf)]
        R, F = 7, 100
    else:
        grid = [(1, 1), (1, bf), (3, bf - 1), (br, bf), (br + 1, bf + 1), (127, 3000), (1000, 4 * bf + 2),
                (4096, 2 * bf)]
        R, F = 129, 2500
    cases = []
    for o in opts:
        sfx = "".join(f"-{v}" for v in o.values())
        cases += [C(f"R{r}-F{f}{sfx}", r, f, ("size",), **o) for r, f in grid]
        cases.append(C(f"R{R}-F{F}-scale8{sfx}", R, F, ("scale",), scale=8.0, **o))
    o = opts[0]
    lay = [C(f"R{R}-F{F}-{n}", R, F, ("non-contiguous",), layout=lo, grad_layout=g, **o)
           for n, lo, g in (("transposed", "transposed", "contiguous"), ("pad", "pad:3", "contiguous"),
                            ("stride", "stride:2", "contiguous"), ("gradT", "contiguous", "transposed"),
                            ("gradpad", "contiguous", "pad:7"), ("gradstride", "contiguous", "stride:3"),
                            ("pad-gradT", "pad:3", "transposed"), ("fused", "fused", "contiguous"))]
    base = C(f"R{R}-F{F}-twins", R, F, ("twin",), **opts[-1])
    return cases + lay + with_twins([base])


def full_cases(device: str, opts: list[dict]) -> list[Case]:
    cases = sweep_cases(device, opts)
    if device == "cpu":
        return cases
    for o in opts:
        sfx = "".join(f"-{v}" for v in o.values())
        cases += [C(f"full-R{r}-F{f}{sfx}", r, f, ("full",), **o) for r, f in ((8192, 14336), (4096, 11008),
                                                                                 (16384, 8192))]
    # the last row starts at 65536 * 32768 = 2^31 elements: a 32-bit offset overflows there (bf16: 4.3 GB a tensor;
    # the oracle runs row chunk by row chunk)
    cases.append(C("R65537-F32768-int64", 65537, 32768, ("64-bit-offsets",), dtypes=["bfloat16"], **opts[0]))
    return cases


BENCH = "bench-R8192-F14336"


def bench_cases(device: str, opts: list[dict]) -> list[Case]:
    # an MLP's intermediate activations: 8192 tokens of a Llama-3-8B-sized FFN (14336 features)
    return [C(BENCH + "".join(f"-{v}" for v in o.values()), 8192, 14336, **o) for o in opts]


def cost_model(p: dict, dtype: torch.dtype) -> dict:
    # the floor: forward reads gate and up and writes out; backward reads gate, up, dout, writes dgate, dup
    n = p["R"] * p["F"]
    es = torch.empty((), dtype=dtype).element_size()
    return {"fwd_bytes": 3 * n * es, "bwd_bytes": 5 * n * es, "floor_bytes": 8 * n * es,
            "fwd_flops": 8 * n, "bwd_flops": 16 * n}


def strategy_for(opts: list[dict]):
    def strategy(device: str):
        b = BLOCKS[_dev(device)]
        bf = b["BLOCK_F"]
        F = st.one_of(st.sampled_from([1, bf - 1, bf, bf + 1, 2 * bf, 2 * bf + 1, 3 * bf - 1]),
                      st.integers(1, 4 * bf))
        R = st.integers(1, 13 if device == "cpu" else 600)
        layouts = ["contiguous", "transposed", "pad", "stride:2"]

        def build(R: int, F: int, layout: str, grad_layout: str, scale: float, o: dict) -> Case:
            sfx = "".join(f"-{v}" for v in o.values())
            name = f"hyp-R{R}-F{F}-{layout.replace(':', '')}-g{grad_layout.replace(':', '')}-s{scale:g}{sfx}"
            return C(name, R, F, ("hypothesis",), layout=layout, grad_layout=grad_layout, scale=scale, **o)

        return st.builds(build, R, F, st.sampled_from(layouts), st.sampled_from(layouts),
                         st.sampled_from([1.0, 8.0]), st.sampled_from(opts))
    return strategy


def make_spec(name: str, reference, opts: list[dict], doc: str) -> OperatorSpec:
    return OperatorSpec(
        name=name,
        # the family: `--kernel glu` runs swiglu and geglu
        aliases=("glu",),
        inputs=("gate", "up"),
        differentiable=("gate", "up"),
        outputs=("out",),
        graded_outputs=("out",),
        reference=reference,
        make_inputs=make_inputs_for(bool(opts[0])),
        presets={"smoke": lambda d: smoke_cases(d, opts), "sweep": lambda d: sweep_cases(d, opts),
                 "full": lambda d: full_cases(d, opts)},
        dtype_input="gate",
        dims=DIMS,
        dim_blocks=DIM_BLOCKS,
        # rows are independent: the oracle of a large case row chunk by row chunk
        separable=Separable((SplitAxis("row", {"gate": 0, "up": 0, "out": 0}),)),
        strategy=strategy_for(opts),
        cost_model=cost_model,
        bench_cases=lambda d: bench_cases(d, opts),
        # issue 47: forward + backward no slower than torch.compile of the eager backend (one fused kernel a pass)
        perf_targets=(PerfTarget("triton", "fwd_bwd_ms", 1.0, versus="torch-compile",
                                 label="fwd+bwd / torch.compile"),),
        doc=doc,
    )


SPEC = register_operator(make_spec("swiglu", swiglu, [{}], "gated MLP activation silu(gate) * up (specs/swiglu.md)"))
