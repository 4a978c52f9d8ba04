"""Provenance: which files, commit, packages and device produced a result."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from .registry import REPO_ROOT, interpreted


def rel(path: str | os.PathLike) -> str:
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return p.name if "site-packages" not in str(p) else "site-packages/" + p.name


def file_record(path: str) -> dict[str, str] | None:
    if not path or not Path(path).exists():
        return None
    data = Path(path).read_bytes()
    return {"path": rel(path), "sha256": hashlib.sha256(data).hexdigest()[:16]}


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """HEAD (+dirty); HARNESS_COMMIT names it where the tree travels without .git (a GPU machine)."""
    if os.environ.get("HARNESS_COMMIT"):
        return os.environ["HARNESS_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        # the harness's own outputs (reports/) do not make the sources dirty: a run that follows another
        # one, before its reports are committed, would otherwise name a dirty tree
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (head or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "tilelang", "hypothesis", "numpy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.device(device))
        return "cuda (unavailable)"
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def device_class(device: str) -> str:
    """'cpu', 'h100', 'h200', ... : reports of different classes never overwrite each other."""
    if not device.startswith("cuda"):
        return "cpu"
    name = device_name(device).lower()
    for tag in ("h200", "h100", "h800", "h20", "b200", "gb200", "a100", "l40s", "l4", "a10"):
        if tag in name:
            return tag
    return "cuda-" + "".join(ch for ch in name.split()[-1] if ch.isalnum())


def run_provenance(device: str, elsewhere: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's header. ``elsewhere``: the device, device class and versions of the machines that run the
    cells when they are not this one (an executor on a cluster; each cell also records its own)."""
    from datetime import datetime, timezone

    there = elsewhere or {}
    return {
        "commit": git_commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": there.get("device") or device_name(device),
        "device_class": there.get("device_class") or device_class(device),
        "versions": there.get("versions") or versions(),
        "interpreted": device.split(":")[0] == "cpu" or interpreted(),
    }


def backend_provenance(files: list[str]) -> list[dict[str, str]]:
    return [r for r in (file_record(f) for f in files) if r]
