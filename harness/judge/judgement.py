"""Judging stored cells: verdicts, declared gaps, contract exceptions, severity and hints, from figures.

The one place where a cell's figures (harness/model/records.py) become what a person reads: which status it
shows (XFAIL is a failing cell inside a declared gap), whether a failure is marginal or gross, and the
hints. Runs when a report is rendered, when a run ends and in pytest, always under today's rules and
the declarations of the backends registered now (so `harness report --plugin ...` re-judges).

Severity inside FAIL: marginal when every failing ratio is at most MARGINAL and no localized structure
was found; contract, SHAPE, non-finite, all-zero and beyond-gap failures are always gross. A marginal
FAIL still fails the run (the pinned verdict does not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..model import registry
from ..model.declarations import ContractException, Gap
from ..model.records import CellId, CellRecord, ComponentFigures, ContractResult
from ..model.twins import TWIN_CAUSES, TWINS, base_case
from .diagnose import Hint, hints_for, where
from .verdict import BOUNDS, K_MAX, K_RMS, Verdict, verdict_of

MARGINAL = 2.0
SHOWN = ("PASS", "XFAIL", "FAIL", "REGRESSION", "SHAPE", "ERROR", "CRASH", "TIMEOUT", "SKIP")


@dataclass
class ComponentJudgement:
    figures: ComponentFigures
    verdict: Verdict
    hints: list[Hint] = field(default_factory=list)
    where: str = ""
    gap: Gap | None = None  # the declaration that covers this failing component
    beyond: str = ""  # why a declared gap does not cover it

    @property
    def name(self) -> str:
        return self.figures.name

    @property
    def failed(self) -> bool:
        return self.verdict.failed

    @property
    def reason(self) -> str:
        return self.beyond or self.verdict.reason

    def hint_text(self) -> str:
        return "; ".join(h.text for h in self.hints)


@dataclass
class CellJudgement:
    """A cell as the report shows it."""

    record: CellRecord
    shown: str  # one of SHOWN
    components: list[ComponentJudgement] = field(default_factory=list)
    contracts: list[tuple[ContractResult, ContractException | None]] = field(default_factory=list)
    severity: str = ""  # "gross" | "marginal" for FAIL/SHAPE
    gap: Gap | None = None  # for XFAIL: the declaration
    worst_ratio: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failing(self) -> bool:
        """Fails the run: every failing status that no declaration covers."""
        return self.shown not in ("PASS", "XFAIL", "SKIP")

    @property
    def failed_components(self) -> list[ComponentJudgement]:
        return [c for c in self.components if c.failed]

    def declared_text(self) -> str:
        if self.gap is None:
            return ""
        return f"{self.gap.reason} (worst {self.worst_ratio:.3g}x, declared up to {self.gap.ceiling:g}x)"


@dataclass(frozen=True)
class Rules:
    """What judging a cell needs beyond its figures: the operator's bound factors and the backend's
    declarations as registered now, and the device class its report lives under."""

    k_max: float = K_MAX
    k_rms: float = K_RMS
    gaps: tuple[Gap, ...] = ()
    exceptions: tuple[ContractException, ...] = ()
    device_class: str = ""
    known: bool = True  # operator and backend registered here (else default bounds, no declarations)


def rules_for(operator: str, backend: str, device_class: str) -> Rules:
    """Today's rules for (operator, backend), from the registry (plugins included once loaded)."""
    return _rules(operator, backend, device_class)


# "operator/backend" of cells judged without their registration (a plugin not loaded, an extra not installed):
# `harness report` names them, since their declared gaps and exceptions were not applied
_UNREGISTERED: set[str] = set()


def unregistered() -> list[str]:
    return sorted(_UNREGISTERED)


@lru_cache(maxsize=512)
def _rules(operator: str, backend: str, device_class: str) -> Rules:

    ops = registry.operators()
    op = ops.get(operator)
    base = backend.split(":", 1)[1] if backend.startswith("mutant:") else None
    b = None
    if op is not None and base is None:
        b = next((x for x in registry.backends(operator) if x.name == backend), None)
    known = op is not None and (b is not None or base is not None)
    if not known:
        _UNREGISTERED.add(f"{operator}/{backend}")
    return Rules(k_max=op.k_max if op else K_MAX, k_rms=op.k_rms if op else K_RMS,
                 gaps=b.gaps if b else (), exceptions=tuple(b.contract_exceptions) if b else (),
                 device_class=device_class, known=known)


def judge_cell(rec: CellRecord, rules: Rules | None = None, device_class: str = "") -> CellJudgement:
    rules = rules or rules_for(rec.operator, rec.backend, device_class)
    if not rec.status.ran:
        return CellJudgement(rec, rec.status.value)
    comps = [ComponentJudgement(f, verdict_of(f, rules.k_max, rules.k_rms)) for f in rec.components]
    contracts = [(c, _excepted(c, rec.dtype, rules)) for c in rec.contracts]
    broken = [c for c, x in contracts if not c.ok and x is None]
    j = CellJudgement(rec, "PASS", comps, contracts, notes=list(rec.notes))
    if not rules.known:
        j.notes.append("operator or backend not registered here: default bounds, no declarations "
                       "(load its plugin with --plugin, or install the extra that registers it: '.[liger]')")
    failed = [c for c in comps if c.failed]
    if not failed and not broken:
        return j
    j.shown = "FAIL" if any(c.verdict.verdict == "FAIL" for c in failed) or broken else "SHAPE"
    j.worst_ratio = max((c.verdict.worst_ratio for c in failed), default=0.0)
    gap = _declared(j, failed, broken, rules)
    if gap is not None:
        j.shown, j.gap = "XFAIL", gap
        return j  # no hints, no heatmaps on a declared gap: its figures are shown as they are
    for c in failed:
        c.hints = hints_for(c.figures, c.verdict, rec.dtype)
        c.where = where(c.figures, c.verdict) if c.figures.legacy is None else ""
    j.severity = _severity(failed, broken)
    return j


def judge_cells(recs: list[CellRecord], device_class: str = "") -> list[CellJudgement]:
    """judge_cell of each record, then what only a set of cells shows: a layout twin that fails where its base
    case passes gets a layout hint (layout_hints)."""
    judged = [judge_cell(r, device_class=device_class) for r in recs]
    layout_hints(judged)
    return judged


def layout_hints(judged: list[CellJudgement]) -> None:
    """A failing layout twin (harness/model/twins.py) whose base cell (same backend, dtype and seed) passes is
    told so: the layout is the difference, so the hint names it and drops the claims a layout explains better
    (precision, a never-written buffer, NaN, a local error). Only a gross failure is laid to the layout: a
    marginal one (every ratio at most 2x) is another draw of the rounding, which a twin makes as much as its base
    (golden mhc_pre's ``~stride`` twin of n4-D100-T3 failed dphi.pre at 1.01x rms at CPU seed 2, its base
    passing), and the ``expand`` twin has values of its own (a constant gradient). Nor is an error confined to one
    tile (the local rule's alone): a stride or offset misread spoils the whole tensor, not one tile of it
    (Liger 0.8.5's RoPE on an H200 failed one tile of an ``expand`` twin, seq 95 dim 52, passing globally)."""
    shown = {j.record.id: j.shown for j in judged}
    for j in judged:
        which = j.record.case.params.get("twin")
        if which is None or j.shown != "FAIL" or j.severity != "gross":
            continue
        base = CellId.of(j.record.operator, j.record.backend, j.record.dtype, base_case(j.record.case),
                         j.record.seed)
        if shown.get(base) not in ("PASS", "XFAIL"):
            continue
        hint = Hint("layout", f"layout: passes as {base.case}, fails as its {which!r} twin ({TWINS[which]}): "
                              f"{TWIN_CAUSES[which]}?")
        for c in j.failed_components:
            if c.verdict.kind != "local":
                c.hints = [hint, *[h for h in c.hints if h.structural]]


def _excepted(c: ContractResult, dtype: str, rules: Rules) -> ContractException | None:
    return next((x for x in rules.exceptions if x.applies(c.name, dtype)), None) if not c.ok else None


def _declared(j: CellJudgement, failed: list[ComponentJudgement], broken: list[ContractResult],
              rules: Rules) -> Gap | None:
    """The gap that covers every failing component of the cell, or None; components a gap of the cell's
    scope does not cover get their reason ("beyond its declared gap: 3.1e5x > 10x")."""
    case = j.record.case
    in_scope = [g for g in rules.gaps if g.covers_cell(j.record.dtype, case.tags, rules.device_class)]
    if not in_scope:
        return None
    chosen: Gap | None = None
    covered = True
    for c in failed:
        mine = [g for g in in_scope if g.covers_component(c.name)]
        if not mine:
            c.beyond = f"outside its declared gap (which covers {', '.join(in_scope[0].components)}); " + \
                c.verdict.reason
            covered = False
            continue
        fit = [g for g in mine if (c.verdict.kind in BOUNDS and c.verdict.worst_ratio <= g.ceiling)
               or (c.verdict.kind in ("nonfinite", "all-zero") and g.range_errors)]
        if not fit:
            g = max(mine, key=lambda g: g.ceiling)
            c.beyond = (f"beyond its declared gap: {c.verdict.worst_ratio:.3g}x > {g.ceiling:g}x"
                        if c.verdict.kind in BOUNDS else
                        f"a declared precision gap does not cover this: {c.verdict.reason}")
            covered = False
            continue
        c.gap = fit[0]
        chosen = chosen or fit[0]
    return chosen if covered and not broken else None


def _severity(failed: list[ComponentJudgement], broken: list[ContractResult]) -> str:
    if broken:
        return "gross"
    for c in failed:
        v = c.verdict
        if v.kind not in BOUNDS or c.beyond or v.worst_ratio > MARGINAL or any(h.structural for h in c.hints):
            return "gross"
    return "marginal"


def counts(judged: list[CellJudgement]) -> dict[tuple[str, str], dict[str, int]]:
    """(backend, dtype) -> shown status -> cells; FAIL counted apart as "FAIL marginal"."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for j in judged:
        row = out.setdefault((j.record.backend, j.record.dtype), {s: 0 for s in (*SHOWN, "marginal")})
        row[j.shown] += 1
        if j.severity == "marginal":
            row["marginal"] += 1
    return dict(sorted(out.items()))
