"""The tracked tree stays small enough to travel to a GPU machine beside the TileLang bundle.

A device call carries at most 64 MiB; the TileLang bundle takes 44.6 MB of it, so the tracked files
must stay below 12 MB (issue #24). Committed reports are the usual cause of growth: records of figures
rounded where only the eye reads them, heatmaps for failing cells only, never for declared gaps.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 12_000_000


def test_tracked_files_stay_below_12_mb():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [ROOT / f for f in out.decode().split("\0") if f]
    total = sum(f.stat().st_size for f in files if f.is_file())
    biggest = sorted(((f.stat().st_size, f.relative_to(ROOT)) for f in files if f.is_file()), reverse=True)[:5]
    assert total < LIMIT_BYTES, f"tracked files take {total / 1e6:.1f} MB (limit 12 MB); largest: {biggest}"
