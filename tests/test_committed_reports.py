"""The committed reports, re-judged under today's rules and declarations (as `harness report` does)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.judge.judgement import judge_cell
from harness.model.records import CellRecord
from harness.store.reports import load

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def _cells():
    for d in sorted(p for p in REPORTS.iterdir() if p.is_dir()):
        for j in sorted(d.glob("*.jsonl")):
            for c in load(d, j.stem)[0]:
                yield d.name, c


def test_no_committed_cell_fails_where_a_gap_is_declared_today():
    # the in-tree backends pass or sit inside their scoped, capped gaps on every committed device class
    failing = [(dc, c.operator, c.backend, c.dtype, c.case.name, [x.name for x in j.failed_components])
               for dc, c in _cells() if (j := judge_cell(c, device_class=dc)).failing]
    assert not failing, failing[:10]


def test_declared_gaps_cover_only_their_scope():
    # every XFAIL cell's failing components are inside the declaration that covers it, under its ceiling
    for dc, c in _cells():
        j = judge_cell(c, device_class=dc)
        if j.shown != "XFAIL":
            continue
        for comp in j.failed_components:
            g = comp.gap
            assert g is not None and g.covers_component(comp.name), (dc, c.case.name, comp.name)
            assert comp.verdict.kind != "bound" or comp.verdict.worst_ratio <= g.ceiling


def test_every_committed_report_re_judges_to_the_verdicts_it_shows():
    # the verdicts a committed report was rendered with (its .json) are the ones today's judge gives its
    # records (its .jsonl): moving the harness into layers and the verdict into the judge changed none
    checked = 0
    for jsonl in sorted(REPORTS.rglob("*.jsonl")):
        rendered = jsonl.with_suffix(".json")
        if not rendered.exists():
            continue
        shown = {CellRecord.from_json(c).id: c.get("shown") or c["status"]
                 for c in json.loads(rendered.read_text())["cells"]}
        for c in load(jsonl.parent, jsonl.stem)[0]:
            assert judge_cell(c, device_class=jsonl.parent.name).shown == shown[c.id], (rendered, c.id)
            checked += 1
    assert checked > 2000
