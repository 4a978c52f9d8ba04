"""Sweep-level causes: the case features that separate a component's failing cells from its passing ones.

A reduction bug (a weight gradient summed over one row tile, a per-head scalar over one batch) leaves no
pattern inside a cell, but across a sweep it fails exactly where B > 1, or where L > W, or with label
smoothing. For each (backend, component) with at least MIN_CELLS failing and MIN_CELLS passing cells,
every feature that all failing cells have and no passing cell has (or the reverse) is listed.

Features come from each cell's case (tags, options, layouts, sizes) and dtype; sizes are compared only
with 1, 1024, 2^31 and the backend's declared block sizes, and with one another (L > W).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..model import registry
from ..model.spec import Case
from .judgement import CellJudgement

MIN_CELLS = 3
SIZE_MARKS = (1, 1024, 2**31)
MAX_LISTED = 4


@dataclass(frozen=True)
class Feature:
    """A yes/no property of a cell; ``text`` reads as the condition, ``negated`` as its complement."""

    text: str
    negated: str
    rank: int  # listing order: options and tags before sizes, sizes before size pairs


@dataclass
class Cause:
    operator: str
    backend: str
    components: list[str]
    features: list[str]
    failing: int
    passing: int

    def text(self) -> str:
        return (f"{self.backend}: {', '.join(self.components)} fail exactly where {' and where '.join(self.features)} "
                f"({self.failing}/{self.failing} cells) and pass elsewhere ({self.passing}/{self.passing})")


def _flat(params: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (bool, int, float, str)) or v is None:
            out[prefix + k] = v
    return out


def cell_features(case: Case, dtype: str, marks: tuple[int, ...], pairs: list[tuple[str, str]],
                  blocks: tuple[int, ...] = ()) -> dict[Feature, bool]:
    """Every feature's value for one cell (``marks``: the size thresholds; ``blocks``: the backend's block
    sizes among them; ``pairs``: size pairs)."""
    out: dict[Feature, bool] = {}
    p = _flat(case.params)
    for t in case.tags:
        out[Feature(f"the case is tagged {t}", f"the case is not tagged {t}", 0)] = True
    out[Feature(f"dtype = {dtype}", f"dtype != {dtype}", 1)] = True
    out[Feature("microbatches > 1", "microbatches <= 1", 0)] = case.microbatches > 1
    for k, v in p.items():
        if isinstance(v, bool) or v is None:
            out[Feature(f"{k}", f"not {k}", 0)] = bool(v)
        elif isinstance(v, str):
            out[Feature(f"{k} = {v}", f"{k} != {v}", 0)] = True
        elif isinstance(v, float):  # an option's strength (smoothing, z-loss): on or off
            out[Feature(f"{k} > 0", f"{k} = 0", 0)] = v > 0
        else:
            for m in marks:
                out[Feature(f"{k} > {m}", f"{k} <= {m}", 2)] = v > m
                if m in blocks and m > 1 and isinstance(v, int):  # a tail: not a multiple of a block
                    out[Feature(f"{k} is not a multiple of {m}", f"{k} is a multiple of {m}", 2)] = v % m != 0
    for a, b in pairs:
        va, vb = p.get(a), p.get(b)
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            out[Feature(f"{a} > {b}", f"{a} <= {b}", 3)] = va > vb
    return out


def _numeric(cases: list[Case]) -> list[str]:
    keys: dict[str, None] = {}
    for c in cases:
        for k, v in _flat(c.params).items():
            if isinstance(v, int) and not isinstance(v, bool):  # sizes: pairs such as L > W
                keys[k] = None
    return list(keys)


def causes(judged: list[CellJudgement], blocks: dict[str, dict[str, int]] | None = None) -> list[Cause]:
    """Separating features per (operator, backend, component) of a run's judged cells (XFAIL cells and
    cells without figures take no part). ``blocks``: backend name -> its declared block sizes."""
    groups: dict[tuple[str, str], list[CellJudgement]] = {}
    for j in judged:
        if j.shown in ("PASS", "FAIL", "SHAPE", "REGRESSION"):
            groups.setdefault((j.record.operator, j.record.backend), []).append(j)
    out = []
    for (op, backend), cells in groups.items():
        recorded = {v for j in cells for v in j.record.blocks.values()}  # as the cells ran
        declared = blocks.get(backend, {}) if blocks is not None else _blocks(op, backend)
        own = tuple(sorted(recorded or set(declared.values())))
        marks = tuple(sorted(set(SIZE_MARKS) | set(own)))
        names = _numeric([j.record.case for j in cells])
        pairs = list(itertools.permutations(names, 2))
        feats = [cell_features(j.record.case, j.record.dtype, marks, pairs, own) for j in cells]
        by_sets: dict[tuple, list[str]] = {}
        for comp in dict.fromkeys(c.name for j in cells for c in j.components):
            fail = [i for i, j in enumerate(cells) if any(c.name == comp and c.failed for c in j.components)]
            ok = [i for i, j in enumerate(cells) if any(c.name == comp and not c.failed for c in j.components)]
            if len(fail) >= MIN_CELLS and len(ok) >= MIN_CELLS:
                by_sets.setdefault((tuple(fail), tuple(ok)), []).append(comp)
        for (fail, ok), comps in by_sets.items():
            found = _separating(feats, list(fail), list(ok))
            if found:
                out.append(Cause(op, backend, comps, found[:MAX_LISTED], len(fail), len(ok)))
    return out


def _blocks(operator: str, backend: str) -> dict[str, int]:
    """The block sizes a registered backend declares (a mutant: its base backend's)."""

    if backend.startswith("mutant:"):
        m = next((x for x in registry.mutants() if x.id == backend.split(":", 1)[1]), None)
        backend = m.backend if m else backend
    b = next((x for x in registry.backends(operator) if x.name == backend), None)
    return dict(b.blocks) if b else {}


def _separating(feats: list[dict[Feature, bool]], fail: list[int], ok: list[int]) -> list[str]:
    every = {f for i in fail + ok for f in feats[i]}
    found: list[tuple[int, str]] = []
    for f in every:
        in_fail = [feats[i].get(f, False) for i in fail]
        in_ok = [feats[i].get(f, False) for i in ok]
        if all(in_fail) and not any(in_ok):
            found.append((f.rank, f.text))
        elif not any(in_fail) and all(in_ok):
            found.append((f.rank, f.negated))
    return [t for _, t in sorted(found)]
