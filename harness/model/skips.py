"""Which planned cells are skipped, and why: the skip rules as data.

Every cell of a request (backend x case x dtype on a device) is planned, those that cannot run included, so
that a report lists them with their reason instead of leaving them out silently. A cell is skipped by the
first rule of :data:`RULES` that gives a reason for it; the order matters only in which reason is shown
(a backend that cannot run here is "unavailable", whatever else is also true of the cell).

Two kinds, which readers of the records tell apart (``CellRecord.skip_kind``):

- ``unavailable``: the backend cannot run on this machine at all (its devices, a package it requires, no
  GPU). Another machine would run the cell: sweep features still count it (harness/tools/features.py).
- ``unsupported``: this cell, not the backend, is out of reach: a dtype the backend does not declare, bf16
  under the Triton interpreter, or a case the backend's own ``skip`` callable refuses. No machine runs it.

The backend's ``skip`` callable (``Backend.skip(case, dtype, device_class)``, the way plugins refuse cells)
is one of the rules, so it is asked exactly where it always was: after the harness-wide rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .registry import Backend
from .spec import Case

SkipKind = Literal["unavailable", "unsupported"]
UNAVAILABLE: SkipKind = "unavailable"
UNSUPPORTED: SkipKind = "unsupported"

INTERPRETER_BF16 = "bf16 tl.dot is wrong in the Triton interpreter; bf16 is judged on the GPU"


@dataclass(frozen=True)
class Candidate:
    """A cell as the rules see it, before it is a task. ``here``: the cells run on this machine; without it
    (an executor on a cluster) only what does not depend on the machine is judged here (Backend.unavailable)."""

    backend: Backend
    case: Case
    dtype: str
    device: str  # as requested: cpu, cuda, cuda:1
    here: bool = True

    @property
    def device_class(self) -> str:
        """cpu or cuda: what backends declare and their ``skip`` callables are given."""
        return self.device.split(":")[0]


@dataclass(frozen=True)
class SkipRule:
    """One reason a planned cell does not run. ``reason`` is the predicate: the text shown for the skipped
    cell, or None where the rule lets the cell run (a rule's text may depend on the cell, as the devices a
    backend declares do)."""

    name: str
    kind: SkipKind
    reason: Callable[[Candidate], str | None]

    @classmethod
    def when(cls, name: str, kind: SkipKind, applies: Callable[[Candidate], bool], text: str) -> SkipRule:
        """A rule whose reason is the same text for every cell it skips."""
        return cls(name, kind, lambda c: text if applies(c) else None)


def _undeclared_dtype(c: Candidate) -> str | None:
    if c.dtype in c.backend.dtypes:
        return None
    return f"backend declares dtypes {', '.join(c.backend.dtypes)} only"


def _interpreted_bf16(c: Candidate) -> bool:
    # measured: triton 3.9's interpreter computes bf16 tl.dot wrongly on CPU
    return c.backend.interpret and c.device_class == "cpu" and c.dtype == "bfloat16"


def _backends_own(c: Candidate) -> str | None:
    # a falsy answer ("" included) runs the cell, as it always did
    return (c.backend.skip(c.case, c.dtype, c.device_class) or None) if c.backend.skip is not None else None


# The harness-wide rules, first match wins; the backend's own callable last, so that its text never hides a
# reason the harness gives for every backend alike.
RULES: tuple[SkipRule, ...] = (
    SkipRule("backend unavailable here", UNAVAILABLE, lambda c: c.backend.unavailable(c.device, c.here)),
    SkipRule("dtype not declared by the backend", UNSUPPORTED, _undeclared_dtype),
    SkipRule.when("bf16 under the Triton interpreter", UNSUPPORTED, _interpreted_bf16, INTERPRETER_BF16),
    SkipRule("the backend's own skip callable", UNSUPPORTED, _backends_own),
)


def skip_for(c: Candidate, rules: tuple[SkipRule, ...] = RULES) -> tuple[str, SkipKind] | None:
    """(reason, kind) of the first rule that skips the cell, or None: it runs."""
    for rule in rules:
        why = rule.reason(c)
        if why:
            return why, rule.kind
    return None
