"""The plan: a request expanded into tasks (operator x case x dtype x backend), each one cell to run or skip.

Every executor (harness/run/executor.py) runs a plan's tasks; the skip rules that mark the tasks that do not
run are data in harness/model/skips.py. Cells of one (operator, case, dtype) group run on one worker in a
row (:func:`order_groups`), so that the group's inputs and oracle are computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..measure.failures import error_cell
from ..model import registry
from ..model.mutant_builds import resolve as resolve_backend
from ..model.records import CellId, CellRecord
from ..model.registry import Backend
from ..model.skips import Candidate, skip_for
from ..model.spec import Case, dtype_name, dtype_of


@dataclass
class Task:
    operator: str
    backend: str
    case: Case
    dtype: str
    device: str
    seed: int = 0
    repeats: int = 2
    skip: str | None = None
    skip_kind: str = ""  # "unavailable" (backend cannot run here) or "unsupported" (this cell only): model/skips.py
    oom_tries: int = 0  # times this cell ran out of memory on a shared GPU

    @property
    def id(self) -> CellId:
        return CellId.of(self.operator, self.backend, self.dtype, self.case, self.seed)

    def failed(self, status: str, message: str) -> CellRecord:
        """The cell for this task when it produced no result of its own (SKIP, TIMEOUT, CRASH, ...)."""
        cell = error_cell(self.operator, self.backend, self.case, self.dtype, self.device, self.seed, status, message)
        if status == "SKIP":
            cell.skip_kind = self.skip_kind
        return cell

    def payload(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "backend": self.backend,
            "case": self.case.to_json(),
            "dtype": self.dtype,
            "device": self.device,
            "seed": self.seed,
            "repeats": self.repeats,
        }


@dataclass
class Plan:
    tasks: list[Task] = field(default_factory=list)
    explicit: list[str] = field(default_factory=list)  # backends the user named


def plan(
    kernels: list[str],
    sizes: str,
    backends: list[str] | None,
    dtypes: list[str] | None,
    device: str,
    seed: int = 0,
    repeats: int = 2,
    cases: dict[str, list[Case]] | None = None,
    case_filter: str | None = None,
    here: bool = True,
) -> Plan:
    """Expand the request into tasks; unknown names raise KeyError/ValueError with the valid ones. Without
    ``here`` the cells run on other machines, which judge a backend's packages and GPU themselves (worker.py)."""

    ops = registry.resolve_kernels(kernels)
    dev = device.split(":")[0]
    p = Plan(explicit=list(backends or []))
    if backends:
        _refuse_unknown_backends(ops, backends)
    for op_name in ops:
        op = registry.get_operator(op_name)
        chosen = _chosen_backends(op_name, backends, single=len(ops) == 1)
        case_list = cases[op_name] if cases and op_name in cases else op.cases(sizes, dev)
        if case_filter:
            case_list = [c for c in case_list if case_filter in c.name]
        want = [dtype_name(dtype_of(d)) for d in dtypes] if dtypes else list(op.dtypes.get(dev, ("float32",)))
        for case in case_list:
            allowed = case.params.get("dtypes")
            for dt in want:
                if allowed and dt not in allowed:
                    continue  # the case itself takes no such dtype: not a cell at all, so not a SKIP either
                for b in chosen:
                    p.tasks.append(_task(op_name, b, case, dt, device, seed, repeats, here))
    return p


def _task(op_name: str, b: Backend, case: Case, dtype: str, device: str, seed: int, repeats: int,
          here: bool) -> Task:
    t = Task(op_name, b.name, case, dtype, device, seed, repeats)
    skipped = skip_for(Candidate(b, case, dtype, device, here))
    if skipped is not None:
        t.skip, t.skip_kind = skipped
    return t


def _refuse_unknown_backends(ops: list[str], backends: list[str]) -> None:
    """A name no selected operator knows (a typo: "trtion") is an error, not a quietly smaller run."""
    known_any = {b.name for op_name in ops for b in registry.backends(op_name)}
    unknown = [n for n in backends if n not in known_any and not n.startswith("mutant:")]
    if unknown:
        listing = "; ".join(f"{o}: {', '.join(sorted(b.name for b in registry.backends(o))) or '(none)'}"
                            for o in ops)
        raise KeyError(f"--backend {','.join(unknown)}: no selected operator has such a backend ({listing})")


def _chosen_backends(op_name: str, backends: list[str] | None, single: bool) -> list[Backend]:
    """The operator's backends the request names (all but speed references when it names none). With
    several operators, a name another operator has is fine here; with one, it is that operator's error."""
    judged = [b for b in registry.backends(op_name) if b.role != "speed-reference"]
    if not backends:
        return judged
    known = {b.name for b in registry.backends(op_name)}
    chosen = [b for b in judged if b.name in backends]
    chosen += [resolve_backend(op_name, n) for n in backends if n.startswith("mutant:")]
    missing = [n for n in backends if n not in known and not n.startswith("mutant:")]
    if missing and single:
        raise KeyError(
            f"--backend {','.join(missing)}: operator {op_name!r} has backends "
            f"{', '.join(sorted(known)) or '(none)'}"
        )
    return chosen


def order_groups(todo: list[Task], durations: dict[tuple[str, str], float]) -> list[list[Task]]:
    """Cells grouped by (operator, case, dtype): one worker runs a group (its inputs are drawn once).

    With recorded durations the groups run longest first, so that the long ones do not start last and
    leave the other workers idle at the end (a group never seen before counts as the median group).
    Without them, operators are interleaved, so that a sweep cut short still has cells of each."""
    groups: dict[tuple, list[Task]] = {}
    for t in todo:
        groups.setdefault((t.operator, t.case.name, repr(sorted(t.case.params.items())), t.dtype), []).append(t)
    if durations:
        known = sorted(durations.values())
        typical = known[len(known) // 2]

        def cost(g: list[Task]) -> float:
            return sum(durations.get(t.id, typical) for t in g)

        return sorted(groups.values(), key=cost, reverse=True)  # stable: ties keep the plan's order
    by_op: dict[str, list[list[Task]]] = {}
    for g in groups.values():
        by_op.setdefault(g[0].operator, []).append(g)
    return [g for i in range(max(map(len, by_op.values()))) for gs in by_op.values() if i < len(gs) for g in [gs[i]]]
