"""The cell record: what one cell measured, as figures, never as prose.

A worker measures a cell (harness/measure/cell.py) and sends a :class:`CellRecord` through its pipe as JSON; the
JSONL reports store the same JSON. Everything a person reads about a cell (the verdict, the wording,
hints, severity, declared gaps, XFAIL) is derived from these figures when a report is rendered, by
harness/judge/judgement.py, so that `harness report` re-judges every stored cell under today's rules and
declarations. This module is the only wire format; it knows no operator and no rule.

Schema versions: 1 is the dict cells written before the record existed (verdicts, reasons and hints
stamped in at run time); :func:`CellRecord.from_json` reads both, and a cell of version 1 carries the
figures its verdict needs (recovered from its bounds) but no per-slice profiles, which the report then
names "needs re-run" where a diagnosis would need them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any

from .spec import Case

SCHEMA_VERSION = 2
# per-slice figures along one axis are kept for at most this many buckets (slices grouped evenly past it)
MAX_BUCKETS = 64
# Per-slice profiles are kept for components whose verdict ratio is above this: a diagnosis needs them on
# failing components, and a component at under half its bound fails under no rule of today or of a
# plausible tomorrow. Profiles of every component above 0.25 made the committed reports 13.3 MB, past the
# 12 MB the GPU machine leaves beside the TileLang bundle (tests/test_repo_size.py).
PROFILE_FROM_RATIO = 0.5
# significant digits of what a verdict reads (float32's precision: a ratio moves by 1e-7 at most) and of
# what only a person or a coarse rule reads (profiles, cosines, fitted scales)
VERDICT_DIGITS = 7
READ_DIGITS = 4


@dataclass(frozen=True, order=True)
class CellId:
    """Which cell a task, a record, a resumed run, a comparison or a repro bundle is about: one identity, one
    key. The device class is the report folder's (a folder holds one class's records), so it is not repeated.
    Two cases of one name with other parameters or microbatches are two cells, as are two seeds."""

    operator: str
    backend: str
    dtype: str
    case: str
    params: str  # the case's parameters as canonical JSON, as the report stores them
    microbatches: int
    seed: int

    @classmethod
    def of(cls, operator: str, backend: str, dtype: str, case: Case, seed: int) -> CellId:
        return cls(operator, backend, dtype, case.name, json.dumps(case.params, sort_keys=True, default=str),
                   case.microbatches or 0, seed)

    def under(self, backend: str) -> CellId:
        """The same cell of another backend (a mutant is compared with the backend it mutates)."""
        return replace(self, backend=backend)

    @property
    def planned(self) -> str:
        """The cell as a run's header lists its planned cells in the JSONL: backend, dtype and case name."""
        return f"{self.backend}|{self.dtype}|{self.case}"


class Status(str, Enum):
    """What happened to a cell when it ran. XFAIL is not a status: it is a judgement (a declared gap)."""

    # figures recorded: whether they PASS, FAIL or are SHAPE is the judge's (harness/judge/judgement.py), under
    # the operator's bounds and the backend's declarations as they are when the record is read
    MEASURED = "MEASURED"
    # PASS, FAIL and SHAPE as a status: records written before the judge alone decided (read back as figures)
    PASS = "PASS"
    FAIL = "FAIL"
    SHAPE = "SHAPE"
    ERROR = "ERROR"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    SKIP = "SKIP"
    # reserved for comparisons with an earlier run: numerics that got worse while still in the bound
    REGRESSION = "REGRESSION"

    @property
    def failing(self) -> bool:
        return self in _FAILING

    @property
    def ran(self) -> bool:
        """Produced figures (MEASURED; PASS, FAIL, SHAPE, REGRESSION in older records), as opposed to a cell
        without a result."""
        return self in (Status.MEASURED, Status.PASS, Status.FAIL, Status.SHAPE, Status.REGRESSION)


_FAILING = frozenset({Status.FAIL, Status.SHAPE, Status.ERROR, Status.CRASH, Status.TIMEOUT, Status.REGRESSION})


def _num(x: Any) -> float:
    """JSON floats back from their string forms ("inf", "nan")."""
    if isinstance(x, str):
        return float(x)
    return float(x) if x is not None else 0.0


def _out(x: float, digits: int = VERDICT_DIGITS) -> float | str:
    """A float for JSON: non-finite as a string, else rounded to ``digits`` significant digits."""
    if not math.isfinite(x):
        return str(x)
    return float(f"{x:.{digits}g}") if x != 0 else 0.0


@dataclass
class SliceProfile:
    """Per-slice figures of one component along one localization axis.

    Slices are blocks of ``block`` indices (1: single indices); when there are more than MAX_BUCKETS of
    them, ``bucket`` consecutive slices share one entry. Every list has one entry per bucket:
    ``err_max``/``err_rms``: the backend's excess error e (inf where non-finite positions differ);
    ``floor_max``/``floor_rms``: the floor reference's error; ``oracle_max``: max|oracle| (0 where the
    oracle is exactly zero: such slices are neither ok nor bad); ``count``: elements; ``scale``: the
    least-squares factor a with k ~ a*o in that slice, ``scaled_rms``: rms(k - a*o) there.
    ``zero``/``nonfinite``: buckets where k is 0 wherever o is not / where non-finite positions differ.
    """

    axis: str
    block: int
    extent: int
    slices: int
    bucket: int = 1
    err_max: list[float] = field(default_factory=list)
    err_rms: list[float] = field(default_factory=list)
    floor_max: list[float] = field(default_factory=list)
    floor_rms: list[float] = field(default_factory=list)
    oracle_max: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    scaled_rms: list[float] = field(default_factory=list)
    zero: list[int] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)

    @property
    def buckets(self) -> int:
        return len(self.err_max)

    @property
    def has_blocks(self) -> bool:
        return self.block > 1

    def tail_is_partial(self) -> bool:
        return self.extent % self.block != 0

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("err_max", "err_rms", "floor_max", "floor_rms", "oracle_max", "scale", "scaled_rms"):
            d[k] = [_out(float(v), READ_DIGITS) for v in d[k]]
        return d

    @staticmethod
    def from_json(d: dict) -> SliceProfile:
        p = SliceProfile(**{f.name: d[f.name] for f in fields(SliceProfile) if f.name in d})
        for k in ("err_max", "err_rms", "floor_max", "floor_rms", "oracle_max", "scale", "scaled_rms"):
            setattr(p, k, [_num(v) for v in getattr(p, k)])
        return p


@dataclass
class LocalFigures:
    """What the local rule reads of one component (harness/judge/verdict.py, "The local rule").

    The component is cut in tiles: blocks of ``block`` indices along each of ``axes`` (its two widest
    localization axes on different dimensions, or its one axis), grown until a tile holds at least
    LOCAL_MIN_NUMEL elements. Per tile, an error relative to the tile's own magnitude: (max excess - a) / max|o|
    for the backend, (max floor error - a) / max|o| for the floor, where ``a`` is the dtype's absolute
    resolution (verdict.absolute_floor); ``err`` and ``floor`` are their maxima over the tiles where the
    oracle is not zero throughout (inf: an error past ``a`` in a tile where it is). ``at``: the tile of
    ``err``'s maximum, by block index along ``axes`` (a partial last block belongs to the one before it);
    ``extent``: the component's length along each axis; ``tiles``: the tiles of the component."""

    axes: list[str]
    block: list[int]
    extent: list[int]
    tiles: int
    err: float
    floor: float
    at: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"axes": self.axes, "block": self.block, "extent": self.extent, "tiles": self.tiles,
                "err": _out(self.err), "floor": _out(self.floor), "at": self.at}

    @staticmethod
    def from_json(d: dict) -> LocalFigures:
        return LocalFigures(list(d["axes"]), [int(b) for b in d["block"]], [int(n) for n in d["extent"]],
                            int(d["tiles"]), _num(d["err"]), _num(d["floor"]), [int(i) for i in d.get("at", [])])

    def tile_text(self) -> str:
        """The tile of the worst error in words: "row 3, vocab 1024-2047"."""
        parts = []
        for axis, b, n, i in zip(self.axes, self.block, self.extent, self.at, strict=False):
            lo, hi = i * b, n - 1 if (i + 2) * b > n else (i + 1) * b - 1
            parts.append(f"{axis} {lo}" if lo == hi else f"{axis} {lo}-{hi}")
        return ", ".join(parts)


@dataclass
class ComponentFigures:
    """What the verdict of one component reads, and what a diagnosis may cite.

    ``kind``: "figures" (measured), "shape" (wrong shape or dtype: ``expected``/``got``), "missing" (no
    tensor returned). Errors: ``max_err``/``mean_err`` of |k - o|; ``max_excess``/``rms_excess`` of
    e = max(|k - o| - extra_bound, 0) over finite positions; ``floor_max``/``floor_rms``: the floor's
    error (worst of its samples); ``oracle_max``/``oracle_rms``: of |o|. ``lowp_max``/``lowp_rms``: the
    error of the reference computed with its math in the case dtype (a precision yardstick; None in
    float32). ``scale``: the least-squares a of k ~ a*o, ``scaled_max``/``scaled_rms``: of k - a*o.
    Non-finite: ``mismatch`` positions whose NaN/Inf status differs from the oracle's, of which
    ``mismatch_inf`` are +-inf in k where o is finite and ``mismatch_nan`` NaN where o is finite;
    ``poisoned``: k lives in a buffer the harness allocated and filled with NaN.
    """

    name: str
    kind: str = "figures"
    dtype: str = ""
    numel: int = 0
    max_err: float = 0.0
    mean_err: float = 0.0
    max_excess: float = 0.0
    rms_excess: float = 0.0
    floor_max: float = 0.0
    floor_rms: float = 0.0
    oracle_max: float = 0.0
    oracle_rms: float = 0.0
    extra_bound_max: float = 0.0
    rel_rms: float = 0.0
    cosine: float = 1.0
    zero_frac: float = 0.0
    all_zero: bool = False
    floor_all_zero: bool = False
    nonfinite: int = 0
    mismatch: int = 0
    mismatch_inf: int = 0
    mismatch_nan: int = 0
    mismatch_first: list[int] = field(default_factory=list)
    poisoned: bool = False
    scale: float = 1.0
    scaled_max: float = 0.0
    scaled_rms: float = 0.0
    lowp_max: float | None = None
    lowp_rms: float | None = None
    # microbatch cells: rms(naive - o) / rms(o) of the per-microbatch-mean mistake, for comparison
    naive_rel_rms: float | None = None
    first_bad: list[int] = field(default_factory=list)
    worst: list[int] = field(default_factory=list)
    slices: list[SliceProfile] = field(default_factory=list)
    # the local rule's figures (None: a record from before it, or a component without axes)
    local: LocalFigures | None = None
    # a heatmap's data: max e over blocks of the two widest axes (only kept for failing components)
    grid: dict[str, Any] | None = None
    expected: str = ""
    got: str = ""
    # max |run1 - run2| of this component over the determinism re-run (None: not re-run): a comparison with
    # an earlier run counts only changes beyond this spread (harness/across/compare.py)
    spread: float | None = None
    # version-1 cells only: the verdict's bounds as stored, and why figures are missing
    legacy: dict[str, Any] | None = None

    _ROUNDED = ("mean_err", "rel_rms", "cosine", "zero_frac", "scale", "scaled_max", "scaled_rms",
                "lowp_max", "lowp_rms", "extra_bound_max", "naive_rel_rms")

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("name", "slices", "local") or v is None or v == f.default or v == [] or v is False:
                continue
            if isinstance(v, float):
                v = _out(v, READ_DIGITS if f.name in self._ROUNDED else VERDICT_DIGITS)
            d[f.name] = v
        if self.kind != "figures":
            d["kind"] = self.kind
        if self.local is not None:
            d["local"] = self.local.to_json()
        if self.slices:
            d["slices"] = [s.to_json() for s in self.slices]
        return d

    @staticmethod
    def from_json(d: dict) -> ComponentFigures:
        c = ComponentFigures(name=d["name"])
        for f in fields(ComponentFigures):
            if f.name in d and f.name not in ("name", "slices", "local"):
                v = d[f.name]
                setattr(c, f.name, _num(v) if isinstance(getattr(c, f.name), float) or
                        f.name in ("lowp_max", "lowp_rms", "naive_rel_rms", "spread") and v is not None else v)
        c.slices = [SliceProfile.from_json(s) for s in d.get("slices", [])]
        c.local = LocalFigures.from_json(d["local"]) if d.get("local") else None
        return c


@dataclass
class ContractResult:
    """One contract of the battery (inputs unchanged, guard bands, determinism, invariants), its outcome
    and the figures behind it."""

    name: str
    ok: bool
    detail: str = ""
    figures: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "ok": self.ok}
        if self.detail:
            d["detail"] = self.detail
        if self.figures:
            d["figures"] = self.figures
        return d

    @staticmethod
    def from_json(d: dict) -> ContractResult:
        figs = dict(d.get("figures", {}))
        if "allocations" in d:  # version 1 kept it beside the detail
            figs["allocations"] = d["allocations"]
        return ContractResult(d["name"], bool(d["ok"]), d.get("detail", ""), figs)


@dataclass
class CellRecord:
    """One (operator, backend, case, dtype) run: its status, figures and provenance."""

    operator: str
    backend: str
    dtype: str
    case: Case
    device: str
    seed: int = 0
    status: Status = Status.MEASURED
    components: list[ComponentFigures] = field(default_factory=list)
    contracts: list[ContractResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    traceback: str = ""
    skip_kind: str = ""
    matmul_precision: str = "ieee"
    # the block sizes the backend declared where it ran (interpreted Triton backends use smaller ones)
    blocks: dict[str, int] = field(default_factory=dict)
    kink_marked: int | None = None
    microbatch: dict[str, Any] | None = None
    impl_file: dict[str, Any] | None = None
    # how the backend returned its outputs where that differs from the case's outputs ("expected", in the
    # operator's order), and a backward's gradients where a key names no differentiable input:
    # {"outputs": {"type": "dict", "keys": [...], "expected": [...]} or {"type": "tuple", "count": n, ...},
    #  "grads": {"type": "dict", "keys": [...]}}; None when both are as expected
    returned: dict[str, Any] | None = None
    inputs_sha256: str | None = None
    inputs_bytes: int | None = None
    # the oracle's and floor's code (the reference's module, the operator's case module, harness/measure/oracle.py):
    # cells compare across runs only where it and the inputs are the same (harness/across/compare.py)
    oracle_code: str | None = None
    reference_s: float | None = None
    backend_s: float | None = None
    backend_again_s: float | None = None
    duration_s: float | None = None
    peak_mem_mb: float | None = None
    # on a GPU, what the backend's first call held at most (its inputs, outputs, gradients and workspace, MB
    # allocated): the harness's own share of peak_mem_mb is the rest (issue #26: at most 6 GB)
    backend_peak_mb: float | None = None
    peak_alloc_mb: float | None = None  # the cell's peak on backend_peak_mb's basis (allocated, not reserved)
    worker: Any = None
    # where the cell ran when that is not the run's own machine (harness/run/ray_executor.py): executor, node,
    # worker, host, the harness worker's pid, device class and package versions there
    ran_on: dict[str, Any] | None = None
    run_id: str | None = None
    schema: int = SCHEMA_VERSION

    def component(self, name: str) -> ComponentFigures | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def id(self) -> CellId:
        return CellId.of(self.operator, self.backend, self.dtype, self.case, self.seed)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"schema": self.schema, "operator": self.operator, "backend": self.backend,
                             "dtype": self.dtype, "case": self.case.to_json(), "device": self.device,
                             "seed": self.seed, "status": self.status.value}
        if self.components:
            d["components"] = [c.to_json() for c in self.components]
        if self.contracts:
            d["contracts"] = [c.to_json() for c in self.contracts]
        for f in fields(self):
            if f.name in d or f.name in ("components", "contracts"):
                continue
            v = getattr(self, f.name)
            if v is None or v == "" or v == [] or v == {} or (f.name == "matmul_precision" and v == "ieee"):
                continue
            d[f.name] = v
        return d

    @staticmethod
    def from_json(d: dict) -> CellRecord:
        if int(d.get("schema", 1)) < 2:
            return _from_v1(d)
        rec = CellRecord(operator=d["operator"], backend=d["backend"], dtype=d["dtype"],
                         case=Case.from_json(d["case"]), device=d.get("device", ""))
        for f in fields(CellRecord):
            if f.name in d and f.name not in ("operator", "backend", "dtype", "case", "device"):
                setattr(rec, f.name, d[f.name])
        rec.status = Status(d.get("status", "PASS"))
        rec.components = [ComponentFigures.from_json(c) for c in d.get("components", [])]
        rec.contracts = [ContractResult.from_json(c) for c in d.get("contracts", [])]
        return rec


# -- version 1 ---------------------------------------------------------------------------------------

_V1_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52}


def _from_v1(d: dict) -> CellRecord:
    """A cell written before the record existed. Its verdict figures are recovered from its bounds:
    tol_rms = K_RMS * floor_rms + eps/2 * rms(oracle) gives rms(oracle) (K_RMS was 2 for every operator
    then), ratio * bound gives the excess errors. No per-slice floor profile, scale fit or precision
    yardstick was measured: those cells render "needs re-run" where a diagnosis would need them."""
    status = d.get("status", "PASS")
    rec = CellRecord(operator=d["operator"], backend=d["backend"], dtype=d["dtype"],
                     case=Case.from_json(d["case"]), device=d.get("device", ""), seed=d.get("seed", 0),
                     status=Status(status))  # written back as version 2, its components marked legacy
    for name in ("error", "traceback", "skip_kind", "kink_marked", "microbatch", "impl_file", "inputs_sha256",
                 "inputs_bytes", "reference_s", "backend_s", "backend_again_s", "duration_s", "peak_mem_mb",
                 "worker", "run_id"):
        if d.get(name) is not None:
            setattr(rec, name, d[name])
    rec.notes = list(d.get("notes", []))
    rec.contracts = [ContractResult.from_json(c) for c in d.get("contracts", [])]
    rec.components = [_component_v1(r) for r in d.get("components", [])]
    return rec


def _component_v1(r: dict) -> ComponentFigures:
    c = ComponentFigures(name=r["name"], dtype=r.get("dtype", ""), numel=int(r.get("numel", 0)))
    reason = r.get("reason", "")
    if r.get("verdict") == "SHAPE":
        c.kind = "shape"
        exp, _, got = reason.partition(", got ")
        c.expected, c.got = exp.replace("expected ", ""), got
        return c
    if reason.startswith("not computed"):
        c.kind = "missing"
        return c
    for f in ("max_err", "mean_err", "rel_rms", "cosine", "zero_frac", "extra_bound_max"):
        setattr(c, f, _num(r.get(f, getattr(c, f))))
    c.nonfinite = int(r.get("nonfinite", 0) or 0)
    c.floor_max, c.floor_rms = _num(r.get("ref_max")), _num(r.get("ref_rms"))
    c.oracle_max = _num(r.get("max_abs_oracle"))
    tol_max, tol_rms = _num(r.get("tol_max")), _num(r.get("tol_rms"))
    eps = _V1_EPS.get(c.dtype, 2.0**-23)
    c.oracle_rms = max(0.0, (tol_rms - 2.0 * c.floor_rms) / (0.5 * eps)) if tol_rms else 0.0
    c.max_excess = _num(r.get("ratio_max")) * tol_max
    c.rms_excess = _num(r.get("rms_err"))
    if reason.startswith("non-finite"):
        c.mismatch = max(1, c.nonfinite)
    if reason.startswith("all zeros"):
        c.all_zero = True
    loc = r.get("localization") or {}
    c.first_bad = list(loc.get("first_bad", []))
    c.worst = list(loc.get("worst", []))
    c.legacy = {"verdict": r.get("verdict"), "tol_max": tol_max, "tol_rms": tol_rms,
                "ratio_max": _num(r.get("ratio_max")), "ratio_rms": _num(r.get("ratio_rms")),
                "where": loc.get("text", "")}
    return c
