"""Hints: a likely cause of a failing component, only where the figures in its cell back it.

Every hint is a claim with evidence, derived from the stored figures when a report is rendered:

- structural (a stride, later blocks' offsets, lost accumulation, a tail bound, slot 0): needs contrast
  along one axis (the bad slices at least CONTRAST times their bound, every other slice within it, no
  slice in between), enough slices (MIN_STRIDE_SLICES for a stride), block wording only on axes that
  have blocks, the tail rule before the offsets rule, and an error profile that the floor's own
  per-slice profile does not explain (normalized by the floor, the contrast must persist). Slices where
  the oracle is exactly zero are neither ok nor bad.
- scale: k ~ a*o with the rest at the floor names the factor; per-slice factors with the rest at the
  floor name the per-slice pattern.
- precision: the error follows the floor's profile; the reference computed in the case dtype is the
  yardstick of effective precision.
- non-finite: +-inf where the oracle is finite is an overflow; NaN is "never written" only in a buffer
  the harness poisoned.
- local: a failure of the local rule alone names its worst tile and no precision or scale claim (the
  component is within its global bounds, which such an error would break).
- otherwise "no structure found".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.records import ComponentFigures, SliceProfile
from .verdict import EPS_BY_NAME, Verdict

CONTRAST = 3.0  # bad slices at least this many times their bound, for a structural hint
MIN_STRIDE_SLICES = 3  # a stride hint needs at least this many slices with a non-zero oracle
FLOOR_SHAPE_SPREAD = 4.0  # per-slice error / floor within this factor: the error follows the floor
SCALE_TOLERANCE = 1e-3  # |a - 1| below this is no scale bug (nor below 4 eps of the dtype: rounding)
# a least-squares factor of one value explains it exactly: a factor is named from 4 values on, an exact
# sign flip (-1 within 4 eps, the rest at the floor) from 2
SCALE_MIN_NUMEL = 4
SIGN_MIN_NUMEL = 2
SCALE_MIN_SLICE = 4  # elements per slice for a per-slice factor
LOWP_CONSISTENT = 3.0  # error within this many times the case-dtype reference's: a precision matter
# an error shaped like the floor's is a precision matter only up to bf16-level: 2^16 times a float32 floor
# (eager bf16 math measured 1.2e4 - 5.8e4x); the zoo's formula bugs sit at 1e6x and more
PRECISION_MAX_OVER_FLOOR = 2.0**16
NAIVE_MATCH = 0.1  # the backend's relative error within 10% of the per-microbatch-mean mistake's

STRUCTURAL = frozenset({"stride", "later-block-offsets", "accumulation-lost", "tail", "slot0", "zeros"})


def ranges(idx: list[int], limit: int = 12) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'. Past ``limit`` runs the rest is counted, not listed: the
    rows of a wrong confident-row gradient were ~400 runs, a screenful in the terminal."""
    if not idx:
        return "none"
    out, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    if len(out) > limit:
        return ", ".join(out[:limit]) + f", ... ({len(idx)} in {len(out)} runs)"
    return ", ".join(out)



@dataclass(frozen=True)
class Hint:
    """One likely cause. ``cls`` is what the bug zoo checks (see STRUCTURAL and the module docstring)."""

    cls: str
    text: str
    axis: str = ""

    @property
    def structural(self) -> bool:
        return self.cls in STRUCTURAL


def slice_ratios(p: SliceProfile, v: Verdict) -> list[float]:
    """Each slice's error over the component's bound (the worse of max and, where it applies, rms)."""
    out = []
    for i in range(p.buckets):
        r = p.err_max[i] / v.tol_max if v.tol_max > 0 else (math.inf if p.err_max[i] > 0 else 0.0)
        if v.rms_applies and v.tol_rms > 0:
            r = max(r, p.err_rms[i] / v.tol_rms)
        out.append(r)
    return out


def bad_slices(p: SliceProfile, v: Verdict) -> list[int]:
    """Slices over the bound (or with non-finite values where the oracle differs): the "where" column."""
    return sorted({i for i, r in enumerate(slice_ratios(p, v)) if r > 1} | set(p.nonfinite))


def where(fig: ComponentFigures, v: Verdict) -> str:
    """'head: 1-3 bad of 4 (0 ok); first bad index [0, 1, 5]'."""
    parts = []
    for p in fig.slices:
        bad = bad_slices(p, v)
        if not bad or p.buckets == 1:
            continue
        unit = f" (blocks of {p.block * p.bucket})" if p.block * p.bucket > 1 else ""
        ok = sorted(set(range(p.buckets)) - set(bad))
        s = f"{p.axis}{unit}: {ranges(bad)} bad of {p.buckets}" + (f" ({ranges(ok)} ok)" if ok else " (all)")
        if p.zero:
            s += f", zeros in {ranges(p.zero)}"
        parts.append(s)
    if fig.first_bad:
        parts.append(f"first bad index {fig.first_bad}")
    if v.kind == "local" and fig.local is not None:
        parts.insert(0, f"worst tile: {fig.local.tile_text()}")
    return "; ".join(parts)


@dataclass
class _Axis:
    """One axis sorted into bad / ok / in-between slices, the oracle's zero slices set apart."""

    p: SliceProfile
    bad: list[int]
    ok: list[int]
    mid: list[int]
    live: list[int]  # slices whose oracle is not exactly zero

    @staticmethod
    def of(p: SliceProfile, v: Verdict) -> _Axis:
        ratios = slice_ratios(p, v)
        live = [i for i in range(p.buckets) if p.oracle_max[i] > 0 or i in p.nonfinite]
        bad = [i for i in live if ratios[i] >= CONTRAST or i in p.nonfinite]
        ok = [i for i in live if ratios[i] <= 1 and i not in p.nonfinite]
        mid = [i for i in live if i not in bad and i not in ok]
        return _Axis(p, bad, ok, mid, live)

    def contrast(self) -> bool:
        """Bad slices stand out, and not because the floor's own errors have that shape."""
        if not self.bad or not self.ok or self.mid:
            return False
        q = self._over_floor()
        worst_ok = max(q[i] for i in self.ok)
        best_bad = min(q[i] for i in self.bad)
        return best_bad >= CONTRAST * worst_ok

    def _over_floor(self) -> list[float]:
        p = self.p
        out = []
        for i in range(p.buckets):
            if i in p.nonfinite:
                out.append(math.inf)
            elif p.floor_rms[i] > 0:
                out.append(p.err_rms[i] / p.floor_rms[i])
            else:
                out.append(math.inf if p.err_rms[i] > 0 else 0.0)
        return out

    def follows_floor(self) -> float | None:
        """max/min of error over floor across live slices, when it stays within FLOOR_SHAPE_SPREAD."""
        q = [x for i, x in enumerate(self._over_floor()) if i in self.live]
        if len(q) < 2 or min(q) <= 0 or not all(map(math.isfinite, q)):
            return None
        spread = max(q) / min(q)
        return spread if spread <= FLOOR_SHAPE_SPREAD else None


def _structural(ax: _Axis) -> list[Hint]:
    p, live, bad = ax.p, ax.live, set(ax.bad)
    if p.bucket != 1 or len(live) < 2 or not ax.contrast():
        return []
    name, first, last = p.axis, live[0], live[-1]
    hints = []
    if p.zero and set(p.zero) == bad:
        hints.append(Hint("zeros", f"{name} {ranges(sorted(bad))} hold zeros where the oracle does not: never "
                                   "accumulated, or stored through another tensor's pointer", name))
    if p.has_blocks and bad == {last} and last == p.buckets - 1 and p.tail_is_partial():
        lo = (p.buckets - 1) * p.block
        hints.append(Hint("tail", f"only the last, partial {name} block ({name} {lo}-{p.extent - 1}) is wrong: "
                                  "a tail mask or bound", name))
    elif bad == set(live) - {first} and len(live) >= MIN_STRIDE_SLICES and first not in p.zero:
        # a first slice that is all zeros passes only by the oracle's smallness there: no evidence that it is
        # addressed right (eager torch's bf16 rmsnorm at one feature, R3-F1 on an H200 at seed 31: its dx
        # rounds to 0 in row 0 and is off elsewhere, a cancellation, not a stride)
        if p.has_blocks:
            hints.append(Hint("later-block-offsets", f"only the first {name} block is right: offsets of later "
                                                     f"{name} blocks are wrong", name))
        else:
            hints.append(Hint("stride", f"only {name} {first} is right: a {name} stride is wrong (e.g. one "
                                        f"tensor addressed with another tensor's {name} stride)", name))
    elif bad == set(live) - {last} and p.has_blocks and _last_block_is_full_enough(p):
        hints.append(Hint("accumulation-lost", f"only the last {name} block is right: accumulation across "
                                               f"{name} blocks lost (each block overwrites the previous one)", name))
    elif not p.has_blocks and bad == {last} and last == p.buckets - 1 and len(live) >= MIN_STRIDE_SLICES:
        hints.append(Hint("tail", f"only the last {name} ({last}) is wrong: an off-by-one at the end of the "
                                  f"{name} range (a mask or loop bound)", name))
    elif bad == {first} and len(live) > 2:
        hints.append(Hint("slot0", f"only {name} {first} is wrong: results of other {name}s accumulated into "
                                   f"slot {first}?", name))
    return hints


def _last_block_is_full_enough(p: SliceProfile) -> bool:
    """At least half a block: a short tail that happens to be right says little about accumulation."""
    tail = p.extent - (p.slices - 1) * p.block
    return 2 * tail >= p.block


def _scale_tolerance(fig: ComponentFigures, case_dtype: str) -> float:
    eps = max(EPS_BY_NAME.get(fig.dtype, 2.0**-23), EPS_BY_NAME.get(case_dtype, 2.0**-23))
    return max(SCALE_TOLERANCE, 4 * eps)


def _scale(fig: ComponentFigures, v: Verdict, case_dtype: str) -> list[Hint]:
    if fig.oracle_rms <= 0 or fig.numel < SIGN_MIN_NUMEL:
        return []
    tol = _scale_tolerance(fig, case_dtype)
    at_floor = fig.scaled_max <= v.tol_max and (not v.rms_applies or fig.scaled_rms <= v.tol_rms)
    if at_floor and abs(fig.scale + 1) <= tol:
        return [Hint("scale", f"sign flipped: {fig.name} = {fig.scale:.3f} x oracle")]
    if fig.numel < SCALE_MIN_NUMEL:
        return []
    if at_floor and abs(fig.scale - 1) > tol:
        return [Hint("scale", f"{fig.name} = {fig.scale:.3f} x oracle (the rest at the floor): a scale or "
                              "normalizer is off (mean vs sum, a microbatch count, a missing factor)")]
    for p in fig.slices:
        if p.bucket != 1 or p.buckets < 2:
            continue
        live = [i for i in range(p.buckets) if p.oracle_max[i] > 0]
        total = sum(p.count[i] for i in live)
        if len(live) < 2 or total == 0 or min(p.count[i] for i in live) < SCALE_MIN_SLICE:
            continue
        rest = math.sqrt(sum(p.count[i] * p.scaled_rms[i] ** 2 for i in live) / total)
        factors = [p.scale[i] for i in live]
        if rest <= v.tol_rms and max(p.scaled_rms[i] for i in live) <= v.tol_max and \
                max(factors) - min(factors) > 2 * tol * max(1.0, max(map(abs, factors))):
            return [Hint("per-slice-scale", f"each {p.axis} scaled by its own factor ({min(factors):.3g} .. "
                                            f"{max(factors):.3g}; the rest at the floor): a per-{p.axis} factor "
                                            f"ignored or wrong (the per-{p.axis} upstream gradient?)", p.axis)]
    return []


def _against_lowp(fig: ComponentFigures, dtype: str) -> list[Hint]:
    """Precision by the yardstick: the error is no larger than (a few times) that of the reference
    computed with its math in the case dtype."""
    if not fig.lowp_rms or not fig.lowp_max:
        return []
    r = max(fig.rms_excess / fig.lowp_rms, fig.max_excess / fig.lowp_max)
    if r > LOWP_CONSISTENT:
        return []
    over = f", {fig.rms_excess / fig.floor_rms:.2g}x the float32 floor's" if fig.floor_rms > 0 else ""
    kind = f"consistent with math in {dtype}" if r >= 0.3 else f"between float32 and {dtype} math"
    return [Hint("precision", f"precision: the error is {r:.2g}x that of the reference computed in {dtype}"
                              f"{over}: {kind}")]


def _follows_floor(fig: ComponentFigures, axes: list[_Axis]) -> list[Hint]:
    """Precision by the profile: per slice, the error is a steady multiple of the floor's."""
    followed = [a for a in axes if len(a.live) >= 3 and a.follows_floor() is not None]
    if fig.floor_rms <= 0 or not followed:
        return []
    x = fig.rms_excess / fig.floor_rms
    if x > PRECISION_MAX_OVER_FLOOR:
        return []
    return [Hint("precision", f"precision: the error follows the floor's per-{followed[0].p.axis} profile at "
                              f"{x:.2g}x the float32 floor: lower-precision arithmetic somewhere (16-bit or TF32 "
                              "intermediates?)")]


def _microbatch(fig: ComponentFigures) -> list[Hint]:
    """The error a per-microbatch mean would make, matched: the classic normalizer mistake."""
    n = fig.naive_rel_rms
    if not n or abs(fig.rel_rms - n) > NAIVE_MATCH * n:
        return []
    return [Hint("microbatch-mean", f"the error matches a per-microbatch mean's (rel. rms {fig.rel_rms:.3g} vs "
                                    f"{n:.3g}): each microbatch normalized by its own count, not the global one")]


def _nonfinite(fig: ComponentFigures) -> list[Hint]:
    hints = []
    if fig.mismatch_inf:
        hints.append(Hint("overflow", f"overflow: {fig.mismatch_inf} value(s) are +-inf where the oracle is "
                                      f"finite: an intermediate exceeds the range of its dtype"))
    if fig.mismatch_nan and fig.poisoned:
        hints.append(Hint("never-written", f"never written: {fig.mismatch_nan} NaN(s) left in a buffer the "
                                           "harness allocated NaN-poisoned"))
    elif fig.mismatch_nan:
        # every allocation made during the backend's call is NaN-filled, so NaN also comes from reading a
        # scratch buffer (torch.empty) that the kernel never wrote in part: the figures cannot tell which
        hints.append(Hint("nan", f"NaN where the oracle is finite ({fig.mismatch_nan}): read from memory never "
                                 "written (the harness fills each allocation made during the call with NaN, e.g. a "
                                 "torch.empty scratch buffer partly stored), a read past a mask, or produced by the "
                                 "computation (inf - inf or 0 * inf after an overflow, 0/0)"))
    if not hints:
        hints.append(Hint("nonfinite", "NaN/Inf positions differ from the oracle's (the oracle is not finite "
                                       "where the backend is)"))
    return hints


NO_STRUCTURE = Hint("none", "no structure found")


# under float32's eps: a value that small beside an O(1) term of the same sum rounds away with it
_UNRESOLVED = 2.0**-23


def _zeros(fig: ComponentFigures, dtype: str) -> Hint:
    """All zeros where the oracle is not: never written; or, where every oracle value is below float32's eps, as
    likely lost beside an O(1) term (log(1 + x) for log1p(x)); or, in float16, an intermediate flushed below its
    range. The figures cannot tell these apart, so the hint names each that they allow."""
    flushed = ("; or a float16 intermediate flushed to 0 below its range (smallest subnormal 6e-8)"
               if dtype == "float16" else "")
    if 0.0 < fig.oracle_max < _UNRESOLVED:
        return Hint("zeros", f"all zeros where the oracle is not, whose values are all below float32's eps "
                             f"(max |oracle| {fig.oracle_max:.2g}): rounded away beside an O(1) term (log(1 + x) "
                             f"where log1p(x) keeps it, exp(x) - 1 where expm1(x) does){flushed}; or never written")
    return Hint("zeros", "all zeros where the oracle is not: never written or never accumulated (a "
                         f"missing store, or a store through another tensor's pointer){flushed}")


def _local(fig: ComponentFigures, v: Verdict) -> Hint:
    """A failure of the local rule alone: the component is within its global bounds, one tile is not."""
    loc = fig.local
    assert loc is not None
    return Hint("local", f"local: {loc.tile_text()} is off by {loc.err:.2g} of its own largest value, "
                         f"{v.ratio_local:.3g}x the local bound, while the component is within its global "
                         f"bounds ({v.global_ratio:.2g}x): part of the grid computes differently (an index, an "
                         "offset or a rescale that only some rows, tiles or heads take)", axis=loc.axes[0])


def hints_for(fig: ComponentFigures, v: Verdict, case_dtype: str = "") -> list[Hint]:
    """The hints a failing component's figures support (NO_STRUCTURE when none). ``case_dtype``: the
    cell's dtype (the yardstick reference computes in it; a float32 loss of a bf16 cell is still bf16 math)."""
    if not v.failed:
        return []
    if v.kind == "missing":
        return [Hint("missing", "gradient never produced: the input is not connected to the outputs")]
    if v.kind == "shape":
        return [Hint("shape", "wrong shape or dtype")]
    if fig.legacy is not None:
        return [Hint("needs-rerun", "needs re-run: stored by an older harness, without the figures a "
                                    "diagnosis needs")]
    if v.kind == "nonfinite":
        return _nonfinite(fig)
    if v.kind == "all-zero":
        return [_zeros(fig, case_dtype or fig.dtype)]
    # strongest evidence first: contrast along an axis, then the case-dtype yardstick (so that rounding
    # is not read as a scale), then a fitted scale, then an error shaped like the floor's
    axes = [_Axis.of(p, v) for p in fig.slices]
    dtype = case_dtype or fig.dtype
    if v.kind == "local":  # within the global bounds: no precision, scale or floor-shaped claim holds
        return (_microbatch(fig) or [h for a in axes for h in _structural(a)]) + [_local(fig, v)]
    for rule in (lambda: _microbatch(fig), lambda: [h for a in axes for h in _structural(a)],
                 lambda: _against_lowp(fig, dtype),
                 lambda: _scale(fig, v, dtype), lambda: _follows_floor(fig, axes)):
        found = rule()
        if found:
            return found
    return [NO_STRUCTURE]
