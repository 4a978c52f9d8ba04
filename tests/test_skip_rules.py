"""The skip rules as data (harness/model/skips.py): one table, first match wins, the same reasons and kinds the
plan always gave, and a backend's own ``skip`` callable still asked, after the harness-wide rules."""

from __future__ import annotations

import pytest

from harness.model import registry
from harness.model.registry import Backend
from harness.model.skips import INTERPRETER_BF16, RULES, Candidate, SkipRule, skip_for
from harness.model.spec import Case
from harness.run.plan import plan

CASE = Case("c", {})


def _backend(name: str = "synthetic", **kw) -> Backend:
    kw.setdefault("devices", ("cpu", "cuda"))
    return Backend(operator="mhc_pre", name=name, impl=lambda **_: None, **kw)


def test_one_table_in_the_order_the_plan_asks():
    assert [(r.name, r.kind) for r in RULES] == [
        ("backend unavailable here", "unavailable"),
        ("dtype not declared by the backend", "unsupported"),
        ("bf16 under the Triton interpreter", "unsupported"),
        ("the backend's own skip callable", "unsupported"),
    ]
    assert all(isinstance(r, SkipRule) for r in RULES)


def refuses(case: Case, dtype: str, dev: str) -> str | None:
    return f"refused {case.name} {dtype} on {dev}"


@pytest.mark.parametrize("backend, dtype, device, here, expected", [
    # a backend that cannot run here is unavailable, whatever else is true of the cell
    (_backend(devices=("cuda",), dtypes=("float32",), interpret=True, skip=refuses), "bfloat16", "cpu", True,
     ("runs on cuda only; this run is on cpu (a Triton backend runs there under TRITON_INTERPRET=1)",
      "unavailable")),
    (_backend(dtypes=("float32",), interpret=True, skip=refuses), "bfloat16", "cpu", True,
     ("backend declares dtypes float32 only", "unsupported")),
    (_backend(interpret=True, skip=refuses), "bfloat16", "cpu", True, (INTERPRETER_BF16, "unsupported")),
    (_backend(interpret=True, skip=refuses), "float16", "cpu", True, ("refused c float16 on cpu", "unsupported")),
    # the callable gets the device class; on a cluster (here=False) the GPU is the cluster's to judge
    (_backend(skip=refuses), "bfloat16", "cuda:1", False, ("refused c bfloat16 on cuda", "unsupported")),
    (_backend(interpret=True), "bfloat16", "cuda", False, None),
    (_backend(skip=lambda *_: ""), "float32", "cpu", True, None),  # a falsy answer runs the cell
    (_backend(skip=lambda *_: None), "float32", "cpu", True, None),
])
def test_first_rule_that_gives_a_reason_skips(backend, dtype, device, here, expected):
    assert skip_for(Candidate(backend, CASE, dtype, device, here)) == expected


def test_the_plan_marks_its_tasks_by_the_rules(monkeypatch):
    registry.discover()
    mine = [_backend("plain"), _backend("narrow", dtypes=("float32",)), _backend("interp", interpret=True),
            _backend("own", skip=lambda case, dt, dev: "no odd sizes" if dt == "float16" else None),
            _backend("gpu-only", devices=("cuda",))]
    monkeypatch.setattr(registry, "backends", lambda op=None: mine)
    tasks = plan(["mhc_pre"], "smoke", None, ["float32", "float16", "bfloat16"], "cpu").tasks
    assert tasks
    for t in tasks:
        b = next(b for b in mine if b.name == t.backend)
        got = (t.skip, t.skip_kind) if t.skip else None
        assert got == skip_for(Candidate(b, t.case, t.dtype, "cpu")), t
        if t.skip:
            cell = t.failed("SKIP", t.skip)
            assert (cell.status.value, cell.error, cell.skip_kind) == ("SKIP", t.skip, t.skip_kind)
    kinds = {(t.backend, t.dtype): t.skip_kind for t in tasks}
    assert kinds[("plain", "bfloat16")] == "" and kinds[("narrow", "float16")] == "unsupported"
    assert kinds[("interp", "bfloat16")] == "unsupported" and kinds[("own", "float16")] == "unsupported"
    assert kinds[("gpu-only", "float32")] == "unavailable" and kinds[("own", "float32")] == ""
