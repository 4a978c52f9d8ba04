"""The verdict rule of docs/design.md: the figures it reads (measured in the worker) and the verdict
computed from them (anywhere, any time: `harness report` re-judges stored figures).

For each component, with backend k, oracle o (float64) and floor reference r (float32 math,
rounded to the contract dtype):

    SHAPE  if shape or dtype differs from the contract
    FAIL   if the NaN/Inf positions of k differ from o's (matching NaN agrees)
    FAIL   if k == 0 everywhere while o is not
    e    = max(|k - o| - extra_bound, 0)
    u    = eps(dtype) * max|o|
    PASS iff max(e) <= K_MAX * max|r - o| + 2u  and  rms(e) <= K_RMS * rms(r - o) + 0.5 * eps * rms(o)

One recorded change to the pinned rule: the rms criterion applies to components of at least
RMS_MIN_NUMEL elements. Over a handful of values (a scalar dalpha, a loss, dtau of 4 heads) an rms
is one sample of the floor's luck, not a statistic: a correct fp32 reduction in another summation
order failed it at 1.8x (dalpha.pre, paper init) while its max error was 0.64x of the max bound.
Such components are judged by the max criterion alone, whose 2u term covers reordering.

The local rule, in addition (docs/design.md, "The local rule"): both criteria above are global, so an error
confined to one row, head or tile whose values are small against the component's largest hides under them (a
softmax gradient's max|o| is a target column's, and one row is 1/N of the rms). The component is cut in tiles
(records.LocalFigures) and each tile's error is taken relative to the tile's own magnitude:

    q_k(t) = (max_t e - a) / max_t |o|        q_r(t) = (max_t |r - o| - a) / max_t |o|
    PASS iff max_t q_k(t) <= K_MAX * max_t q_r(t) + 2 * eps

that is, the max criterion applied to the error measured in units of each tile's magnitude, the backend's
worst tile against the floor's worst tile. ``a`` (absolute_floor) is the dtype's absolute resolution: what
flushing a subnormal or rounding to a 16-bit subnormal costs, which is no error relative to anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..model.records import ComponentFigures

Tensor = torch.Tensor

EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23, torch.float64: 2.0**-52}
K_MAX = 3.0
K_RMS = 2.0
RMS_MIN_NUMEL = 16
# the verdict kinds that are a ratio to a bound: the global criteria's and the local rule's
BOUNDS = ("bound", "local")
# a tile of the local rule holds at least this many elements: its maximum is then one of several draws, not one
LOCAL_MIN_NUMEL = 16
# float32's smallest normal: below it a flushed subnormal is an absolute error, not a relative one
_FP32_TINY = 2.0**-126
_TINY = {torch.bfloat16: 2.0**-126, torch.float16: 2.0**-14, torch.float32: 2.0**-126, torch.float64: 2.0**-1022}


def eps_of(dtype: torch.dtype) -> float:
    return EPS.get(dtype, 2.0**-23)


def absolute_floor(dtype: torch.dtype) -> float:
    """The local rule's absolute allowance ``a`` for a component of this dtype: twice the larger of float32's
    smallest normal (an intermediate flushed to zero) and the dtype's subnormal spacing (a 16-bit result
    rounded among subnormals)."""
    return 2 * max(_FP32_TINY, _TINY.get(dtype, _FP32_TINY) * eps_of(dtype))


@dataclass(frozen=True)
class FloorSummary:
    """One floor-reference error sample reduced to what the verdict reads of it: its max and rms over
    the positions where the oracle is finite. Kept instead of the sample (a float64 tensor as large as
    the component) so that the memory of a cell does not grow with the number of draws."""

    max: float
    rms: float

    @staticmethod
    def of(err: Tensor, oracle: Tensor) -> FloorSummary:
        x = torch.where(torch.isfinite(err), err, torch.zeros_like(err))[torch.isfinite(oracle)]
        return FloorSummary(_f(x.max()) if x.numel() else 0.0, _f(_rms(x)))


def _f(x: Tensor) -> float:
    return float(x.item()) if x.numel() else 0.0


def _rms(x: Tensor) -> Tensor:
    return x.pow(2).mean().sqrt() if x.numel() else torch.zeros((), dtype=torch.float64)




def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


EPS_BY_NAME = {_dt(k): v for k, v in EPS.items()}
DTYPE_BY_NAME = {_dt(k): k for k in EPS}


def transposed(fig: ComponentFigures) -> str:
    """The words a SHAPE component's reason adds where it came back with the expected shape reversed (a
    gradient returned as ``d.t()``), else ""."""
    def dims(text: str) -> list[str] | None:
        text = text.strip()
        if not text.startswith("[") or "]" not in text:
            return None
        return [d.strip() for d in text[1:text.index("]")].split(",") if d.strip()]

    want, have = dims(fig.expected or ""), dims(fig.got or "")
    if want is None or have is None or len(want) < 2 or have == want or have != want[::-1]:
        return ""
    if "transpose" in (fig.got or ""):
        return ""  # autograd's refusal, read back by the oracle, says so already
    return " (transposed: the expected shape reversed)"


@dataclass
class Verdict:
    """The pinned rule applied to one component's figures. ``kind`` says which clause decided it:
    "bound" (a global criterion), "local" (the local rule alone: within the global bounds, one tile is not),
    "nonfinite", "all-zero", "shape", "missing" ("" for a pass). ``ratio_local``: the worst tile's error over the
    local bound (0 where the record has no local figures)."""

    verdict: str  # PASS | FAIL | SHAPE
    reason: str = ""
    kind: str = ""
    tol_max: float = 0.0
    tol_rms: float = 0.0
    ratio_max: float = 0.0
    ratio_rms: float = 0.0
    ratio_local: float = 0.0
    rms_applies: bool = True
    figures: ComponentFigures | None = None

    @property
    def failed(self) -> bool:
        return self.verdict != "PASS"

    @property
    def global_ratio(self) -> float:
        """The worst ratio of the two global criteria (what decides whether profiles are kept)."""
        return max(self.ratio_max, self.ratio_rms if self.rms_applies else 0.0)

    @property
    def worst_ratio(self) -> float:
        return max(self.global_ratio, self.ratio_local)

    @property
    def cosine(self) -> float:
        return self.figures.cosine if self.figures else 1.0


def bounds(fig: ComponentFigures, k_max: float = K_MAX, k_rms: float = K_RMS) -> tuple[float, float]:
    """(tol_max, tol_rms) of a component: what a careful float32 kernel achieves, with room."""
    eps = EPS_BY_NAME.get(fig.dtype, 2.0**-23)
    return k_max * fig.floor_max + 2 * eps * fig.oracle_max, k_rms * fig.floor_rms + 0.5 * eps * fig.oracle_rms


def local_ratio(fig: ComponentFigures, k_max: float = K_MAX) -> float:
    """The local rule's ratio (module docstring): the backend's worst tile-relative error over its bound; 0
    where the record has no local figures, or where the floor itself errs in a tile whose oracle is zero
    throughout (no yardstick there)."""
    loc = fig.local
    if loc is None or loc.tiles < 2 or not math.isfinite(loc.floor):
        return 0.0  # one tile is the whole component: the global max criterion judges it, with every floor draw
    return _ratio(loc.err, k_max * local_floor(fig) + 2 * EPS_BY_NAME.get(fig.dtype, 2.0**-23))


def local_floor(fig: ComponentFigures) -> float:
    """The floor's worst tile-relative error: the worst tile of the floor draw kept per tile, or the worst
    draw's largest error relative to the component's largest |o| where that is more (it is never less
    than its own tile's relative error, so this only counts the draws that are kept as figures)."""
    assert fig.local is not None
    a = absolute_floor(DTYPE_BY_NAME.get(fig.dtype, torch.float32))
    whole = max(fig.floor_max - a, 0.0) / fig.oracle_max if fig.oracle_max > 0 else 0.0
    return max(fig.local.floor, whole)


def local_reason(fig: ComponentFigures, ratio: float, k_max: float = K_MAX) -> str:
    loc = fig.local
    assert loc is not None
    tile = loc.tile_text()
    if not math.isfinite(loc.err):
        return f"error local to {tile}, where the oracle is zero throughout"
    return (f"error local to {tile}: {loc.err:.3g} of the tile's largest |oracle|, {ratio:.3g}x the local bound "
            f"({k_max:g}x the floor's worst tile, {local_floor(fig):.3g}, + 2 eps)")


def _ratio(x: float, tol: float) -> float:
    return x / tol if tol > 0 else (0.0 if x == 0 else math.inf)


def verdict_of(fig: ComponentFigures, k_max: float = K_MAX, k_rms: float = K_RMS) -> Verdict:
    """PASS / FAIL / SHAPE of one component from its figures (see the module docstring)."""
    if fig.kind == "missing":
        return Verdict("FAIL", "not computed: the backend returned no tensor (None)", "missing", figures=fig)
    if fig.kind == "shape":
        return Verdict("SHAPE", f"expected {fig.expected}, got {fig.got}{transposed(fig)}", "shape", figures=fig)
    tol_max, tol_rms = bounds(fig, k_max, k_rms)
    v = Verdict("PASS", tol_max=tol_max, tol_rms=tol_rms, ratio_max=_ratio(fig.max_excess, tol_max),
                ratio_rms=_ratio(fig.rms_excess, tol_rms), rms_applies=fig.numel >= RMS_MIN_NUMEL, figures=fig)
    if not v.rms_applies:
        v.ratio_rms = 0.0  # not a statistic at this size (see the module docstring)
    v.ratio_local = local_ratio(fig, k_max)
    if fig.mismatch:
        v.verdict, v.kind = "FAIL", "nonfinite"
        v.reason = (f"non-finite at {fig.mismatch} position(s) where the oracle differs"
                    + (f"; first at {fig.mismatch_first}" if fig.mismatch_first else ""))
    elif fig.all_zero and not fig.floor_all_zero:
        v.verdict, v.kind, v.reason = "FAIL", "all-zero", "all zeros while the oracle is not"
    elif v.ratio_max > 1 or v.ratio_rms > 1:
        which = [(w, r) for w, r in (("max", v.ratio_max), ("rms", v.ratio_rms)) if r > 1]
        v.verdict, v.kind = "FAIL", "bound"
        v.reason = " and ".join(f"{w} error {r:.3g}x its bound" for w, r in which)
    elif v.ratio_local > 1:
        v.verdict, v.kind, v.reason = "FAIL", "local", local_reason(fig, v.ratio_local, k_max)
    return v
