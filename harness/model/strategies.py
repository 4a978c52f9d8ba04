"""Property-based cases: draw from an operator's hypothesis strategy, and shrink a failing cell.

Operators declare ``strategy(device)`` (a hypothesis strategy of Case objects biased to block
boundaries and odd sizes). ``sample_cases`` draws examples for `harness run --hypothesis N`;
``shrink_case`` finds the smallest failing case below a failing one (a sweep's or a drawn one), along its own
parameters and layouts (harness/front/minimal.py runs it on every failing triple of a run).
"""

from __future__ import annotations

import time
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


def shrink_case(case: Case, fails: Callable[[Case], bool], seconds: float) -> Case | None:
    """The smallest case found below ``case`` for which ``fails`` is true, within ``seconds``; None where no
    smaller case fails (``case`` itself is not re-run).

    Operator-agnostic and deterministic: a layout twin is first dropped for its base case, each ``layout*``
    parameter set to "contiguous", then each integer parameter above 1 bisected down to the smallest value
    that still fails (a size bug fails from a threshold up: V > 1024, L > W), in passes until one changes
    nothing. A candidate the operator rejects (a size it cannot make) is one that does not fail. Hypothesis's
    own shrinker starts from a case it drew, not from a given one: a sweep's case is not its draw."""
    stop = time.monotonic() + seconds
    best = case

    def tried(params: dict) -> bool:
        nonlocal best
        if time.monotonic() > stop:
            raise _OutOfTime
        candidate = _named(case, params)
        if candidate.params == best.params or not fails(candidate):
            return False
        best = candidate
        return True

    try:
        changed = True
        while changed:
            changed = False
            for k, v in list(best.params.items()):
                if k == "twin" or (k.startswith(("layout", "grad_layout")) and isinstance(v, str)
                                   and v != "contiguous"):
                    params = dict(best.params)
                    params.pop(k) if k == "twin" else params.update({k: "contiguous"})
                    changed |= tried(params)
            for k, v in list(best.params.items()):
                if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                    changed |= _bisect(best.params, k, v, tried)
    except _OutOfTime:
        pass
    return best if best is not case else None


def _bisect(params: dict, k: str, v: int, tried: Callable[[dict], bool]) -> bool:
    """The smallest value of integer parameter ``k`` in [1, v) that still fails, by bisection (each failing
    try is kept by ``tried``); True when one was found."""
    lo, hi, found = 1, v, False  # hi fails; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if tried({**params, k: mid}):
            hi, found = mid, True
            params = {**params, k: mid}
        else:
            lo = mid + 1
    return found


class _OutOfTime(Exception):
    """Raised by a try past the time limit: the smallest failing case found so far stands."""


def _named(case: Case, params: dict) -> Case:
    """A smaller case of ``case``: named after what changed, tagged "shrunk"."""
    base = case.name.split("~")[0]
    changed = "-".join(f"{k}{v}" for k, v in params.items() if k != "twin" and v != case.params.get(k))
    name = f"{base}-min{('-' + changed) if changed else ''}"
    if "twin" in params:
        name += f"~{params['twin']}"
    tags = case.tags if "shrunk" in case.tags else (*case.tags, "shrunk")
    return Case(name, params, tags, case.microbatches)
