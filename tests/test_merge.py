"""`harness report --add`: report folders merged run by run (harness/store/merge.py), on the committed CPU
records of mhc_pre cut into runs of our own making."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.front.cli import main
from harness.store.merge import groups, merge_folder
from harness.store.reports import PACKED, FolderLock, load

ROOT = Path(__file__).resolve().parent.parent
OP = "mhc_pre"


def _committed() -> tuple[dict, list[dict]]:
    """The committed CPU run of mhc_pre: its run record and its cells that ran (not SKIP)."""
    (g,) = groups(ROOT / "reports" / "cpu", OP)
    cells = [json.loads(ln) for ln in g.lines[1:]]
    return g.run, [c for c in cells if c.get("duration_s")]


def _write(root: Path, runs: list[tuple[dict, list[dict]]], packed: bool = False) -> Path:
    """A report folder holding these (run record, cells) in this order, its cells stamped with their run."""
    d = root / "cpu"
    d.mkdir(parents=True)
    lines = []
    for run, cells in runs:
        lines.append(json.dumps({"run": run}))
        lines += [json.dumps({**c, "run_id": run["run_id"]}) for c in cells]
    text = "\n".join(lines) + "\n"
    if packed:
        (d / f"{OP}{PACKED}").write_bytes(gzip.compress(text.encode()))
    else:
        (d / f"{OP}.jsonl").write_text(text)
    return root


def _run(base: dict, run_id: str, date: str, cells: list[dict]) -> dict:
    """A run record of ``cells`` alone (its plan), so that it supersedes nothing of another backend's."""
    planned = {f"{c['backend']}|{c['dtype']}|" for c in cells}
    return {**base, "run_id": run_id, "date": date,
            "planned": [k for k in base["planned"] if any(k.startswith(p) for p in planned)]}


def _durations(root: Path) -> dict[tuple, float]:
    return {(c.backend, c.dtype, c.case.name): c.duration_s for c in load(root / "cpu", OP)[0]}


def test_two_shards_render_as_one_folder(tmp_path: Path):
    base, cells = _committed()
    tri = [c for c in cells if c["backend"] == "triton"]
    gold = [c for c in cells if c["backend"] == "golden"]
    assert tri and gold
    a = _write(tmp_path / "a", [(_run(base, "a1", "2026-11-29 10:00 UTC", tri), tri)])
    b = _write(tmp_path / "b", [(_run(base, "b1", "2026-11-29 10:00 UTC", gold), gold)])
    got = merge_folder(b, a)
    assert got.records == {f"cpu/{OP}": len(gold)} and got.new_runs == {"b1"}
    backends = {c.backend for c in load(a / "cpu", OP)[0]}
    assert backends == {"triton", "golden"}


@pytest.mark.parametrize("newer_added", [True, False])
def test_the_newer_run_wins_whichever_folder_holds_it(tmp_path: Path, newer_added: bool):
    # a cell both folders hold: the result of the later run stands, not of the folder merged last
    base, cells = _committed()
    tri = [c for c in cells if c["backend"] == "triton"]
    old = _run(base, "old", "2026-11-29 10:00 UTC", tri)
    new = _run(base, "new", "2026-11-29 11:00 UTC", tri)
    later = [{**c, "duration_s": 1234.5} for c in tri]
    mine, theirs = ((old, tri), (new, later)) if newer_added else ((new, later), (old, tri))
    a = _write(tmp_path / "a", [mine])
    b = _write(tmp_path / "b", [theirs])
    merge_folder(b, a)
    assert set(_durations(a).values()) == {1234.5}


def test_a_run_both_folders_share_counts_once_and_a_packed_folder_stays_packed(tmp_path: Path):
    # b began as a copy of a (its packed records), then its run went on: the run is one, its cells the union
    base, cells = _committed()
    tri = [c for c in cells if c["backend"] == "triton"]
    run = _run(base, "r", "2026-11-29 10:00 UTC", tri)
    half = len(tri) // 2
    a = _write(tmp_path / "a", [(run, tri[:half])], packed=True)
    b = _write(tmp_path / "b", [(run, tri)])
    got = merge_folder(b, a)
    assert got.new_runs == set()
    assert (a / "cpu" / f"{OP}{PACKED}").exists() and not (a / "cpu" / f"{OP}.jsonl").exists()
    (g,) = groups(a / "cpu", OP)
    assert len(g.lines) == 1 + len(tri) and len(load(a / "cpu", OP)[0]) == len(tri)


def test_the_command_merges_renders_and_refuses_bad_folders(tmp_path: Path, capsys):
    base, cells = _committed()
    tri = [c for c in cells if c["backend"] == "triton"]
    gold = [c for c in cells if c["backend"] == "golden"]
    b = _write(tmp_path / "b", [(_run(base, "b1", "2026-11-29 10:00 UTC", gold), gold)])
    c = _write(tmp_path / "c", [(_run(base, "c1", "2026-11-29 10:00 UTC", tri), tri)])
    out = tmp_path / "merged"  # a new folder: --add makes it
    assert main(["report", "--report", str(out), "--add", str(b), "--add", str(c)]) == 0
    said = capsys.readouterr().out
    assert f"added {b}: cpu/{OP} {len(gold)} records" in said
    status = (out / "STATUS.md").read_text()
    assert "| mhc_pre | golden |" in status and "| mhc_pre | triton |" in status
    # a folder that is not a report folder, the --report folder itself, a folder a run holds
    with pytest.raises(SystemExit) as e:
        main(["report", "--report", str(out), "--add", str(tmp_path / "none")])
    assert e.value.code == 2 and "--add" in capsys.readouterr().err
    assert main(["report", "--report", str(out), "--add", str(out)]) == 2
    assert "is the --report folder itself" in capsys.readouterr().err
    held = FolderLock(out / "cpu", "someone", "harness run --kernel mhc_pre")
    held.acquire()
    try:
        assert main(["report", "--report", str(out), "--add", str(b)]) == 2
        assert "in use by another run" in capsys.readouterr().err
    finally:
        held.release()
