"""What a backend declares about itself beyond its code: known precision gaps and contract exceptions.

A :class:`Gap` says that a backend falls behind the float32 floor for a stated reason, and where: which
dtypes, components, case tags and device classes, up to which ratio. A failing component inside the
scope and under the ceiling is a declared gap (XFAIL, still shown with its figures); anything else in the
same cell (another component, a ratio past the ceiling, non-finite values, a wrong shape, a violated
contract) stays a FAIL. A :class:`ContractException` excuses one named contract ("writes its logits input
by design") and no numeric failure.

The older form ``expected_gaps={"bfloat16": "reason", "float32@tag+tag": "reason"}`` still works: each
entry becomes a Gap over every component with a ceiling of LEGACY_CEILING, and registering it warns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("harness")

LEGACY_CEILING = 10.0
CONTRACTS = ("input-unchanged", "guard-bands", "invariants", "determinism")


@dataclass(frozen=True)
class Gap:
    """A declared precision gap: ``reason``, and its scope. Empty scope fields mean "any"."""

    reason: str
    dtypes: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # the case must carry all of them
    devices: tuple[str, ...] = ()  # device classes: cpu, h100, h200, ...
    ceiling: float = LEGACY_CEILING  # the worst ratio (error over bound) the gap may reach
    # values outside the dtype's range are part of the gap: +-inf/NaN where the oracle is finite (an eager
    # fp16 overflow) or a result flushed to all zeros (an underflow); off by default, so that such results
    # fail even inside a declared precision gap
    range_errors: bool = False

    def __post_init__(self) -> None:
        if not self.reason:
            raise ValueError("Gap needs a reason (why the backend falls behind the floor)")
        if not self.ceiling > 1:
            raise ValueError(f"Gap ceiling must be a ratio above 1 (error over bound), got {self.ceiling!r}")

    def covers_cell(self, dtype: str, tags: Iterable[str], device_class: str) -> bool:
        return ((not self.dtypes or dtype in self.dtypes) and set(self.tags) <= set(tags)
                and (not self.devices or device_class in self.devices))

    def covers_component(self, name: str) -> bool:
        return not self.components or name in self.components

    def scope(self) -> str:
        parts = [", ".join(self.dtypes) or "any dtype"]
        if self.components:
            parts.append(", ".join(self.components))
        if self.tags:
            parts.append("cases tagged " + "+".join(self.tags))
        if self.devices:
            parts.append("on " + ", ".join(self.devices))
        return "; ".join(parts) + f"; up to {self.ceiling:g}x" + ("; overflow included" if self.range_errors else "")


@dataclass(frozen=True)
class ContractException:
    """A contract the backend breaks by design (e.g. "input-unchanged": it writes its logits input)."""

    contract: str
    reason: str
    dtypes: tuple[str, ...] = ()  # empty: any dtype

    def applies(self, contract: str, dtype: str) -> bool:
        return contract == self.contract and (not self.dtypes or dtype in self.dtypes)

    def __post_init__(self) -> None:
        if self.contract not in CONTRACTS:
            raise ValueError(f"ContractException contract {self.contract!r} is not one of {', '.join(CONTRACTS)}")
        if not self.reason:
            raise ValueError("ContractException needs a reason")


def gaps_from(declared: object, who: str) -> tuple[Gap, ...]:
    """Backend.expected_gaps as Gaps: a sequence of Gap, or the older {dtype[@tag+tag]: reason} dict."""
    if not declared:
        return ()
    if isinstance(declared, Gap):
        return (declared,)
    if isinstance(declared, dict):
        log.warning("%s: expected_gaps={dtype: reason} is the older form; it now declares a Gap over every "
                    "component up to %gx. Declare Gap(reason, dtypes=..., components=..., tags=..., ceiling=...) "
                    "to scope it", who, LEGACY_CEILING)
        out = []
        for key, reason in declared.items():
            dt, _, need = str(key).partition("@")
            out.append(Gap(str(reason), dtypes=(dt,), tags=tuple(t for t in need.split("+") if t)))
        return tuple(out)
    items = tuple(declared)  # type: ignore[arg-type]
    bad = [x for x in items if not isinstance(x, Gap)]
    if bad:
        raise TypeError(f"{who}: expected_gaps takes Gap(...) declarations, got {type(bad[0]).__name__}")
    return items


def check_scope(gaps: Iterable[Gap], who: str, components: set[str], tags: set[str], dtypes: set[str]) -> None:
    """A misspelled component, tag or dtype in a declaration is an error at registration, not a gap that
    silently covers nothing."""
    for g in gaps:
        for what, names, known in (("component", g.components, components), ("tag", g.tags, tags),
                                   ("dtype", g.dtypes, dtypes)):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"{who}: Gap {what} {', '.join(map(repr, unknown))} is not one of the operator's "
                                 f"{what}s: {', '.join(sorted(known)) or '(none)'}")
