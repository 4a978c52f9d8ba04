"""Mutant backends: a real backend's package (or module) copied to a temporary directory under a new name,
its edits applied there (each old text must occur exactly once), and the copy's adapter imported while
registrations are captured: the production kernels carry no bug switches, and Triton/CUDA see the
mutated source files on disk. A mutant runs as the backend ``mutant:<id>``.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import tempfile
from pathlib import Path

from . import registry
from .spec import Mutant

MUTANT_PREFIX = "mutant:"


def resolve(operator: str, name: str) -> registry.Backend:
    """The backend ``name`` of ``operator``: a registered one, or the mutant ``mutant:<id>`` built here."""
    if name.startswith(MUTANT_PREFIX):
        return mutant_backend(name[len(MUTANT_PREFIX):])
    return registry.get_backend(operator, name)


_BUILT: dict[str, registry.Backend] = {}
_TMP = Path(tempfile.mkdtemp(prefix="harness-mutants-"))


class MutantError(Exception):
    """A mutant that cannot be built: its edit does not apply exactly once."""


def _origin(b: registry.Backend) -> tuple[Path, bool]:
    """The backend's package directory (True) or single module file (False)."""
    name = b.package or ""
    mod = importlib.import_module(name)
    if hasattr(mod, "__path__"):
        return Path(next(iter(mod.__path__))), True
    # an adapter module inside a package directory (backends/<impl>/<op>/adapter.py)
    f = Path(mod.__file__ or "")
    if f.name == "adapter.py":
        return f.parent, True
    return f, False


def check_edits(m: Mutant) -> list[str]:
    """Problems with the mutant's edits against the current source (empty when all apply once)."""
    b = registry.get_backend(m.operator, m.backend)
    src, is_pkg = _origin(b)
    problems = []
    for i, (rel, old, _new) in enumerate(m.edits):
        path = src / rel if is_pkg else src
        if not path.exists():
            problems.append(f"edit {i}: {rel} does not exist in {src.name}")
            continue
        n = path.read_text().count(old)
        if n != 1:
            problems.append(f"edit {i}: the old text occurs {n} times in {rel} (must be exactly once): {old[:60]!r}")
    return problems


def mutant_backend(mutant_id: str) -> registry.Backend:
    if mutant_id in _BUILT:
        return _BUILT[mutant_id]
    m = next((x for x in registry.mutants() if x.id == mutant_id), None)
    if m is None:
        raise KeyError(f"no mutant {mutant_id!r}; mutants: {', '.join(x.id for x in registry.mutants())}")
    problems = check_edits(m)
    if problems:
        raise MutantError(f"mutant {m.id}: " + "; ".join(problems))
    base = registry.get_backend(m.operator, m.backend)
    src, is_pkg = _origin(base)
    mod_name = "_harness_mutant_" + re.sub(r"\W", "_", m.id)
    root = _TMP / mod_name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    if is_pkg:
        dst = root / mod_name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        for rel, old, new in m.edits:
            p = dst / rel
            p.write_text(p.read_text().replace(old, new, 1))
        target = f"{mod_name}.adapter" if (dst / "adapter.py").exists() else mod_name
    else:
        text = src.read_text()
        for _rel, old, new in m.edits:
            text = text.replace(old, new, 1)
        (root / f"{mod_name}.py").write_text(text)
        target = mod_name
    sys.path.insert(0, str(root))
    try:
        with registry.capture_registrations() as got:
            importlib.import_module(target)
    finally:
        sys.path.remove(str(root))
    mine = [b for b in got if b.operator == m.operator and b.name == m.backend]
    if not mine:
        raise MutantError(f"mutant {m.id}: the mutated copy registered no {m.operator}/{m.backend} backend")
    b = mine[0]
    b.name, b.origin = f"mutant:{m.id}", f"mutant of {base.key}"
    _BUILT[mutant_id] = b
    return b
