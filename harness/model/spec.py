"""Operator specs: what an operator takes, returns, and which gradient components are judged.

An operator is described once, in ``cases/<operator>.py``, by an :class:`OperatorSpec`. The engine
never names an operator; it only walks these descriptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class Axis:
    """One localization axis of a component view: dimension ``dim`` of the viewed tensor.

    ``block`` names a key of the backend's ``blocks`` metadata; indices along the axis are then
    grouped in blocks of that size (``default_block`` when the backend does not declare it).
    """

    name: str
    dim: int
    block: str | None = None
    default_block: int = 1
    # group indices by a case parameter instead (e.g. the stream axis of a flattened nD is D wide)
    group_param: str | None = None


@dataclass(frozen=True)
class Component:
    """A judged quantity: a named view of an output (``out:NAME``) or of a gradient (``grad:NAME``)."""

    name: str
    source: str
    view: Callable[[Tensor, dict], Tensor] | None = None
    axes: tuple[Axis, ...] = ()

    @property
    def kind(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def tensor_name(self) -> str:
        return self.source.split(":", 1)[1]

    def select(self, t: Tensor, params: dict) -> Tensor:
        return self.view(t, params) if self.view is not None else t


@dataclass(frozen=True)
class Case:
    """A named point of the input space: sizes, layouts and options, all JSON-able."""

    name: str
    params: dict[str, Any]
    tags: tuple[str, ...] = ()
    # K > 1 turns the cell into the microbatch property: the backend is called on K unequal parts.
    microbatches: int = 0

    def to_json(self) -> dict:
        return {"name": self.name, "params": self.params, "tags": list(self.tags), "microbatches": self.microbatches}

    @staticmethod
    def from_json(d: dict) -> Case:
        return Case(d["name"], d["params"], tuple(d.get("tags", ())), d.get("microbatches", 0))


@dataclass
class Inputs:
    """What a generator produces for one cell: tensors at their declared dtypes, plus options."""

    tensors: dict[str, Tensor]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SplitAxis:
    """One axis of :class:`Separable`: the dimension of each named input or output that runs along it,
    e.g. ``SplitAxis("row", {"logits": 0, "targets": 0, "loss": 0})``."""

    name: str
    dims: dict[str, int]


@dataclass(frozen=True)
class Separable:
    """Axes along which an operator's math is independent, so that the harness evaluates its float64
    oracle and float32 floor chunk by chunk (harness/measure/chunking.py) instead of on the whole case at once.

    A chunk is a range of one axis (outer axes one index at a time, as in ``axes``' order); every input
    is sliced along the axes it has, and so is the upstream gradient of an output that has them. The
    reference on a chunk must give that chunk's part of every output and gradient whose tensor has every
    axis, and a partial sum of every other one: the gradient of an input that lacks an axis (a shared
    weight), or an output named on an axis that lacks that dimension in a case (a loss reduced to a
    scalar). The harness adds the partial sums up over the chunks: in float64 for the oracle, in float32
    by a pairwise tree for the floor. ``options(inputs)`` gives options that every chunk gets so that this
    holds (the whole case's count of a mean). ``slice_bytes(inputs)`` is what the float64 reference holds
    per index of the axes (attention: its [L, L] intermediates per head), to size the chunks; by default
    a multiple of the sliced inputs' own size.
    """

    axes: tuple[SplitAxis, ...]
    options: Callable[[Inputs], dict[str, Any]] | None = None
    slice_bytes: Callable[[Inputs], int] | None = None


@dataclass(frozen=True)
class PerfTarget:
    """A speed or memory target of one backend on the operator's GPU bench cases, which `harness bench`
    checks and the bench report and reports/STATUS.md show as met or missed.

    The measured value is the bench row's ``metric`` ("fwd_bwd_ms", "peak_extra_gb", "fwd_bw_frac",
    "speedup_fwd_bwd", ...) or, with ``versus``, its ratio to that backend's same metric on the same case
    and dtype in the same run. ``kind`` "max": met when measured <= bound; "min": measured >= bound.
    """

    backend: str
    metric: str
    bound: float
    kind: str = "max"
    versus: str | None = None
    case: str | None = None  # one bench case by name; default every bench case
    dtype: str = "bfloat16"
    label: str = ""  # how the report names the target, e.g. "fwd+bwd / torch"

    def __post_init__(self) -> None:
        if self.kind not in ("max", "min"):
            raise ValueError(f"PerfTarget kind must be 'max' or 'min', got {self.kind!r}")
        if not math.isfinite(self.bound):
            raise ValueError(f"PerfTarget bound must be a finite number, got {self.bound!r}")

    def describe(self) -> str:
        name = self.label or (f"{self.metric} / {self.versus}" if self.versus else self.metric)
        return f"{name} {'<=' if self.kind == 'max' else '>='} {self.bound:g}"

    def judge(self, value: float) -> bool:
        return value <= self.bound if self.kind == "max" else value >= self.bound


@dataclass(frozen=True)
class MicrobatchSpec:
    """How a batch splits, for the microbatch-consistency property.

    ``split(inputs, k, gen)`` returns k per-microbatch :class:`Inputs` (each with the global
    normalizer set in its options); ``combine[name]`` says how a gradient is rebuilt from the
    microbatches' gradients: "sum" (shared parameters) or "cat0" (per-token tensors).
    ``naive_options`` turns a microbatch's options into the classic mistake (a local mean), so the
    report can show the error that mistake would make.
    """

    split: Callable[[Inputs, int, torch.Generator], list[Inputs]]
    combine: dict[str, str]
    naive_options: Callable[[dict], dict]


@dataclass
class OperatorSpec:
    """Everything the engine needs to know about one operator.

    Defaults for operators written outside the repository (``harness run --plugin my_op.py``):

    - ``output_dtypes`` None: every output takes the dtype of the input named by ``dtype_input`` (when
      that is empty, the first differentiable input).
    - ``components`` empty: one component per output (named like it, ``out:NAME``) and one per
      differentiable input's gradient (``dNAME``, ``grad:NAME``), each localized along the dimensions
      that ``dims`` names for its tensor: ``dims={"x": ("row", "feature"), "w": ("feature",),
      "y": ("row", "feature")}`` gives ``dx`` the axes ``row`` (dim 0) and ``feature`` (dim 1).
      ``dim_blocks`` maps a dimension name to the key of the backend's ``blocks`` that tiles it
      (``{"feature": "BLOCK"}``: errors along ``feature`` are grouped in blocks of ``Backend.blocks["BLOCK"]``).
      A tensor that ``dims`` does not name is judged whole, without localization.
    """

    name: str
    inputs: tuple[str, ...]
    differentiable: tuple[str, ...]
    outputs: tuple[str, ...]
    # outputs that receive an upstream gradient (others are compared but get none)
    graded_outputs: tuple[str, ...]
    reference: Callable[..., dict[str, Tensor]]
    make_inputs: Callable[[Case, torch.dtype, torch.Generator, str], Inputs]
    # keyword-only so that it may default (empty: derived from outputs, differentiable and dims)
    components: tuple[Component, ...] = field(default=(), kw_only=True)
    presets: dict[str, Callable[[str], list[Case]]]
    aliases: tuple[str, ...] = ()
    # which input carries "the case dtype" (x, q, logits, hidden); reported in tables
    dtype_input: str = ""
    dtypes: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"cpu": ("float32", "float16"), "cuda": ("float32", "bfloat16", "float16")}
    )
    # contract dtype of each output, from the (rounded) inputs; gradients take their input's dtype.
    # None: each output takes the dtype of the dtype tensor (see dtype_tensor)
    output_dtypes: Callable[[dict[str, Tensor]], dict[str, torch.dtype]] | None = None
    # named dimensions of each input and output, for the default components' localization axes
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # dimension name -> the key of Backend.blocks whose size tiles that dimension
    dim_blocks: dict[str, str] = field(default_factory=dict)
    # upstream gradients; default: randn in each graded output's dtype, layout from params["grad_layout"]
    make_grad_outputs: Callable[[dict[str, Tensor], Case, torch.Generator, str], dict[str, Tensor]] | None = None
    # elementwise allowance per component for inputs on a non-differentiable point
    extra_bound: Callable[[dict, dict, Case], dict[str, Tensor]] | None = None
    microbatch: MicrobatchSpec | None = None
    # axes along which the oracle and the floor may be evaluated chunk by chunk (memory-lean oracle)
    separable: Separable | None = None
    # invariants beyond the reference: fn(outputs, grads, inputs, case) -> list of failure strings
    invariants: Callable[[dict, dict, Inputs, Case], list[str]] | None = None
    k_max: float = 3.0
    k_rms: float = 2.0
    k_reason: str = ""
    # hypothesis strategy of Case objects (property-based runs)
    strategy: Callable[[str], Any] | None = None
    # FLOPs / bytes models for `harness bench`: fn(params, dtype) -> dict
    cost_model: Callable[[dict, torch.dtype], dict] | None = None
    bench_cases: Callable[[str], list[Case]] | None = None
    # speed / memory targets checked on the GPU bench cases (bench reports, STATUS.md)
    perf_targets: tuple[PerfTarget, ...] = ()
    baseline: str = "torch"
    doc: str = ""

    def __post_init__(self) -> None:
        self._check_separable()
        if self.components:
            # (components equal to the derived ones: a dataclasses.replace() of a spec that had them derived)
            if (self.dims or self.dim_blocks) and self.components != default_components(self):
                raise ValueError(f"operator {self.name!r}: dims/dim_blocks derive the default components only; "
                                 "with components given, put the axes in them (Axis(name, dim, block=...))")
            return
        self.components = default_components(self)

    def _check_separable(self) -> None:
        """A separable axis names inputs and outputs of this operator, each once per axis."""
        if self.separable is None:
            return
        names = set(self.inputs) | set(self.outputs)
        for ax in self.separable.axes:
            unknown = sorted(set(ax.dims) - names)
            if unknown:
                raise ValueError(f"operator {self.name!r}: separable axis {ax.name!r} names {', '.join(unknown)}, "
                                 f"which are neither inputs ({', '.join(self.inputs)}) nor outputs "
                                 f"({', '.join(self.outputs)})")
            if any(not isinstance(d, int) or d < 0 for d in ax.dims.values()):
                raise ValueError(f"operator {self.name!r}: separable axis {ax.name!r}: dims must be "
                                 f"non-negative ints, got {ax.dims!r}")
        both = sorted(set(self.inputs) & set(self.outputs))
        if both:
            raise ValueError(f"operator {self.name!r}: {', '.join(both)} is both an input and an output; a "
                             "separable axis could not tell their chunks apart")

    @property
    def dtype_tensor(self) -> str:
        """The input whose dtype is the case dtype: ``dtype_input``, else the first differentiable input."""
        return self.dtype_input or (self.differentiable[0] if self.differentiable else "")

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(
            f"operator {self.name!r} has no component {name!r}; "
            f"components: {', '.join(c.name for c in self.components)}"
        )

    def cases(self, preset: str, device: str) -> list[Case]:
        if preset not in self.presets:
            raise KeyError(f"operator {self.name!r} has no preset {preset!r}; presets: {', '.join(self.presets)}")
        return self.presets[preset](device)


def default_components(op: OperatorSpec) -> tuple[Component, ...]:
    """Each output and each differentiable input's gradient, with axes from ``op.dims`` and
    ``op.dim_blocks`` (see OperatorSpec); a misspelled tensor or dimension name is an error."""
    where = f"operator {op.name!r}"
    for t, names in op.dims.items():
        if t not in op.inputs and t not in op.outputs:
            raise ValueError(f"{where}: dims names {t!r}, which is neither an input ({', '.join(op.inputs)}) "
                             f"nor an output ({', '.join(op.outputs)})")
        if isinstance(names, str) or len(set(names)) != len(names):
            raise ValueError(f"{where}: dims[{t!r}] = {names!r}: expected a tuple of distinct dimension names, "
                             "one per dimension of the tensor")
    known = {d for names in op.dims.values() for d in names}
    for d in op.dim_blocks:
        if d not in known:
            raise ValueError(f"{where}: dim_blocks names dimension {d!r}, which no tensor in dims has "
                             f"({', '.join(sorted(known)) or 'dims is empty'})")

    def axes(t: str) -> tuple[Axis, ...]:
        return tuple(Axis(d, i, block=op.dim_blocks.get(d)) for i, d in enumerate(op.dims.get(t, ())))

    comps = [Component(o, "out:" + o, None, axes(o)) for o in op.outputs]
    comps += [Component("d" + x, "grad:" + x, None, axes(x)) for x in op.differentiable]
    names = [c.name for c in comps]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"{where}: the default components would share the name(s) {', '.join(clash)} (an output "
                         "named like an input's gradient); give components=(...) explicitly")
    return tuple(comps)


def named_cases(*params: dict[str, Any], tags: tuple[str, ...] = ()) -> list[Case]:
    """Cases named after their parameters, for presets written as lists of dicts:
    ``{"rows": 7, "features": 100, "layout": "stride:2"}`` -> ``rows7-features100-layout=stride2``."""

    def part(k: str, v: Any) -> str:
        if isinstance(v, str):
            return k + "=" + "".join(ch for ch in v if ch.isalnum() or ch in "._")
        if isinstance(v, bool):
            return k if v else "no-" + k
        return f"{k}{v}"

    out = [Case("-".join(part(k, v) for k, v in p.items()), dict(p), tuple(tags)) for p in params]
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"named_cases: the same parameters twice ({', '.join(twice)}); each case needs its own")
    return out


def dtype_of(name: str) -> torch.dtype:
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float64": torch.float64,
        "fp64": torch.float64,
    }
    if name not in table:
        raise ValueError(f"dtype {name!r} is not one of float32/fp32, bfloat16/bf16, float16/fp16")
    return table[name]


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def short_dtype(dt: torch.dtype | str) -> str:
    name = dt if isinstance(dt, str) else dtype_name(dt)
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}.get(name, name)


def as_list(x: Sequence[str] | str | None) -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [s for s in x.split(",") if s]
    return list(x)


@dataclass(frozen=True)
class Expectation:
    """What one case must show for a mutant to count as caught.

    ``fail``: components that must FAIL (or be SHAPE); ``passing``: components that must still pass;
    ``status``: a required cell status instead ("CRASH|ERROR", "FAIL", ...); ``contracts``: contract
    names that must be violated (e.g. "input-unchanged"); ``where``: component -> {axis: pattern}
    with pattern one of "all", "all-but-last", "all-but-first", "first", "last", "none", or a list of
    indices / an "a-b" range of the bad slices along that axis.
    """

    case: Case
    dtype: str = "float32"
    fail: tuple[str, ...] = ()
    passing: tuple[str, ...] = ()
    status: str | None = None
    contracts: tuple[str, ...] = ()
    where: dict[str, dict[str, Any]] = field(default_factory=dict)
    zeros: tuple[str, ...] = ()
    # the hint class (harness/judge/diagnose.py: stride, later-block-offsets, accumulation-lost, tail, slot0, zeros,
    # scale, per-slice-scale, precision, overflow, never-written, nan, none, ...) one failing component must get;
    # "a|b": either (a case whose structure a GPU's larger blocks hide: "tail|none")
    hint: str | None = None


@dataclass(frozen=True)
class Mutant:
    """A real backend with one planted defect, made by source edits applied at load time.

    ``edits`` are (file relative to the backend's package directory, old text, new text); each old
    text must occur exactly once or the zoo reports ERROR for this mutant.
    """

    id: str
    operator: str
    backend: str
    edits: tuple[tuple[str, str, str], ...]
    expect: tuple[Expectation, ...]
    seed: str = ""
    description: str = ""
    # a defect inside the verdict's bound, caught only by comparing with the backend's earlier run
    # (harness/across/compare.py): the zoo lists it apart instead of counting it as missed
    compare_only: bool = False
    # an error local to some rows, tiles or heads that the global criteria alone pass: caught by the local rule
    # (harness/judge/verdict.py); tests/test_local_rule.py shows that the global criteria pass it
    local_only: bool = False
