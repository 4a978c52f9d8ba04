"""Property-based cases: draw from an operator's hypothesis strategy, and shrink a failing cell.

Operators declare ``strategy(device)`` (a hypothesis strategy of Case objects biased to block
boundaries and odd sizes). ``sample_cases`` draws examples for `harness run --hypothesis N`;
``shrink_failure`` lets hypothesis minimize a failing case to the smallest shape that still fails.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, seed, settings

from . import registry
from .spec import Case

_ALL_CHECKS = list(HealthCheck)


def sample_cases(op_name: str, device: str, n: int, seed_: int = 0) -> list[Case]:
    op = registry.get_operator(op_name)
    if op.strategy is None:
        return []
    got: list[Case] = []

    @seed(seed_)
    @settings(max_examples=n, database=None, phases=[Phase.generate], suppress_health_check=_ALL_CHECKS, deadline=None)
    @given(op.strategy(device))
    def collect(case: Case) -> None:
        got.append(case)

    collect()
    out, names = [], set()
    for c in got:
        if c.name not in names:
            names.add(c.name)
            out.append(c)
    return out[:n]


def shrink_failure(
    op_name: str, device: str, fails: Callable[[Case], bool], max_examples: int = 60, seed_: int = 0
) -> Case | None:
    """The smallest case hypothesis finds for which ``fails`` is true, or None."""
    op = registry.get_operator(op_name)
    if op.strategy is None:
        return None
    found: list[Case] = []

    @seed(seed_)
    @settings(
        max_examples=max_examples,
        database=None,
        suppress_health_check=_ALL_CHECKS,
        deadline=None,
        phases=[Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
    )
    @given(op.strategy(device))
    def check(case: Case) -> None:
        if fails(case):
            found.append(case)
            raise AssertionError(case.name)

    try:
        check()
    except AssertionError:
        return found[-1] if found else None
    return None
