"""Provenance: which files, commit, packages and device produced a result."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..model.registry import REPO_ROOT, interpreted


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


# The code a cell's figures and verdict come from: the harness, the in-tree backends (kernels included), the
# references and the cases. Docs, reports, tests and CI scripts are not in it: a commit that changes only those
# leaves a run's results reusable (--resume), which a lent GPU's short calls need across such commits.
CODE_DIRS = ("harness", "backends", "references", "cases")
CODE_SUFFIXES = frozenset({".py", ".cu", ".cuh", ".h", ".hpp", ".cpp"})


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of every source file under CODE_DIRS (its path and bytes), the same on a checkout and on a copy
    of the tree without .git; a plugin's backend files are in the run header's ``backends`` instead."""
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for p in sorted((REPO_ROOT / d).rglob("*")):
            if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file():
                h.update(p.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def same_code(then: dict[str, Any], now: dict[str, Any]) -> bool:
    """Did the run ``then`` (a run header, a zoo's provenance) measure with the code ``now`` has: the same commit,
    or the same code digest and package versions (a commit of docs, reports or tests between)? What --resume
    reuses, in harness run and harness mutants."""
    if then.get("commit") == now.get("commit"):
        return True
    return (bool(then.get("code")) and then.get("code") == now.get("code")
            and then.get("versions") == now.get("versions"))


def _git(folder: str | os.PathLike, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=10)


def _repo_state(folder: str) -> tuple[str | None, str]:
    """The git repository holding ``folder`` (its top folder, or None) and its HEAD (+dirty where a tracked
    file has uncommitted changes). The harness's own checkout is named as git_commit() names it."""
    try:
        top = _git(folder, "rev-parse", "--show-toplevel").stdout.strip()
        if not top:
            return None, "unknown"
        if Path(top).resolve() == REPO_ROOT.resolve():
            return top, git_commit()
        head = _git(top, "rev-parse", "--short=12", "HEAD").stdout.strip()
        dirty = _git(top, "status", "--porcelain", "--untracked-files=no").stdout.strip()
        return top, (head or "unknown") + ("+dirty" if head and dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None, "unknown"


def source_commit(path: str | os.PathLike) -> str:
    """The commit of the git repository a file lives in: HEAD, +dirty where that repository has uncommitted
    changes or does not track the file itself (its commit does not hold what ran); 'unknown' outside a
    repository, or where the repository ignores the file (a package installed in a virtual environment
    inside a checkout is not that checkout's code)."""
    p = Path(path).resolve()
    top, commit = _repo_state(str(p.parent))
    if top is None:
        # a tree that travels without .git (HARNESS_COMMIT) still names the harness's commit for its own files
        return git_commit() if p.is_relative_to(REPO_ROOT.resolve()) else "unknown"
    if commit == "unknown" or Path(top).resolve() == REPO_ROOT.resolve() and os.environ.get("HARNESS_COMMIT"):
        return commit
    try:
        if _git(top, "check-ignore", "-q", "--", str(p)).returncode == 0:
            return "unknown"
        tracked = _git(top, "ls-files", "--error-unmatch", "--", str(p)).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit if tracked or commit.endswith("+dirty") else commit + "+dirty"


def plugin_file(spec: str) -> Path | None:
    """The file a --plugin loads: the path given, or where a module given by name is found (not imported:
    a plugin registers backends when it runs)."""
    if spec.endswith(".py") or Path(spec).exists():
        return Path(spec).resolve()

    mod = sys.modules.get(spec)
    origin = getattr(mod, "__file__", None)
    if origin is None:
        try:
            found = importlib.util.find_spec(spec)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None and found.has_location else None
    return Path(origin).resolve() if origin else None


def plugin_provenance(plugins: list[str]) -> list[dict[str, str | None]]:
    """Per --plugin (a file or a module): as given, the file it loads, and the commit of the git repository
    that file lives in (source_commit); the run's header keeps it beside the harness's own commit."""
    out = []
    for spec in plugins:
        f = plugin_file(spec)
        out.append({"plugin": spec, "path": str(f) if f else None, "commit": source_commit(f) if f else "unknown"})
    return out


def plugin_label(p: dict[str, Any]) -> str:
    """A plugin as a report names it: its file's name (a module by its name) and its repository's commit."""
    spec = str(p.get("plugin") or p.get("path") or "?")
    name = Path(spec).name if spec.endswith(".py") or "/" in spec else spec
    return f"plugin `{name}` at `{p.get('commit', 'unknown')}`"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    # liger-kernel: the release the optional `liger` backends ran (backends/liger/), where installed
    for pkg in ("torch", "triton", "tilelang", "hypothesis", "numpy", "liger-kernel"):
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

    there = elsewhere or {}
    return {
        "commit": git_commit(),
        "code": code_digest(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": there.get("device") or device_name(device),
        "device_class": there.get("device_class") or device_class(device),
        "versions": there.get("versions") or versions(),
        "interpreted": device.split(":")[0] == "cpu" or interpreted(),
    }


def backend_provenance(files: list[str]) -> list[dict[str, str]]:
    return [r for r in (file_record(f) for f in files) if r]
