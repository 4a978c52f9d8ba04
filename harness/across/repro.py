"""Repro bundles: a failing cell saved with everything needed to replay it in one command.

``<report>/repro/<name>/bundle.json`` (``--report``'s folder, by default ``.harness/reports``) holds the
operator, backend, plugins, case, dtype, seed, versions and device; ``inputs.pt`` the inputs as generated
(when under 64 MB) and their digest (taken by the worker that ran the cell). Inputs are regenerated from the
seed on replay and checked against the digest, so a changed generator is noticed instead of silently
replaying something else. Anything else given to `harness repro` is a usage error (exit 2), not a traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from ..judge.judgement import judge_cell
from ..measure.digests import tensors_digest, tensors_nbytes
from ..measure.oracle import gen_inputs
from ..model import registry
from ..model.errors import UsageError
from ..model.records import CellRecord
from ..model.spec import Case, dtype_of
from ..store.provenance import run_provenance

MAX_SAVED_BYTES = 64 << 20


def save_bundle(cell: CellRecord, root: str | Path, plugins: list[str]) -> Path:
    op = registry.get_operator(cell.operator)
    case = cell.case
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{op.name}-{cell.backend}-{cell.dtype}-{case.name}")[:120]
    d = Path(root) / "repro" / name
    d.mkdir(parents=True, exist_ok=True)
    digest, size = cell.inputs_sha256, cell.inputs_bytes
    if digest is None or size is None or size <= MAX_SAVED_BYTES:
        # small inputs are saved; a cell whose worker died (CRASH, TIMEOUT) has no digest yet
        inputs = gen_inputs(op, case, dtype_of(cell.dtype), cell.seed, "cpu")
        digest, size = tensors_digest(inputs.tensors), tensors_nbytes(inputs.tensors)
        if size <= MAX_SAVED_BYTES:
            torch.save({k: v for k, v in inputs.tensors.items()}, d / "inputs.pt")
    judged = judge_cell(cell)
    bundle = {
        "operator": op.name,
        "backend": cell.backend,
        "dtype": cell.dtype,
        "case": case.to_json(),
        "seed": cell.seed,
        "device": cell.device,
        # absolute, so that the bundle replays from any folder (a plugin given as a module name stays one)
        "plugins": [str(Path(x).resolve()) if x.endswith(".py") or Path(x).exists() else x for x in plugins],
        "status": judged.shown,
        "failing": [c.name for c in judged.failed_components],
        "inputs_sha256": digest,
        "inputs_saved": size <= MAX_SAVED_BYTES,
        "provenance": run_provenance(cell.device or "cpu"),
        "command": f"harness repro {d}",
    }
    (d / "bundle.json").write_text(json.dumps(bundle, indent=1, default=str) + "\n")
    return d


BUNDLE_KEYS = ("operator", "backend", "dtype", "case", "seed", "inputs_sha256")


def _not_a_bundle(path: str, why: str) -> Exception:
    return UsageError(f"BUNDLE {path!r}: {why}; expected a repro bundle: the folder `harness run` printed after "
                      "'repro: harness repro' (<report>/repro/<cell>/), or the bundle.json in it")


def load_bundle(path: str) -> dict[str, Any]:
    """The bundle at ``path`` (its folder or its bundle.json), checked; anything else is a usage error."""
    d = Path(path)
    f = d / "bundle.json" if d.is_dir() else d
    if not d.exists():
        raise _not_a_bundle(path, "no such file or folder")
    if not f.is_file():
        raise _not_a_bundle(path, "this folder holds no bundle.json")
    try:
        b = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise _not_a_bundle(path, f"cannot be read ({type(e).__name__}: {e})") from e
    except json.JSONDecodeError as e:
        raise _not_a_bundle(path, f"{f.name} is not JSON ({e})") from e
    if not isinstance(b, dict):
        raise _not_a_bundle(path, f"{f.name} holds a JSON {type(b).__name__}, not an object")
    missing = [k for k in BUNDLE_KEYS if k not in b]
    if missing:
        raise _not_a_bundle(path, f"{f.name} lacks the key(s) {', '.join(missing)}")
    try:
        Case.from_json(b["case"])
        dtype_of(b["dtype"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _not_a_bundle(path, f"its case or dtype cannot be read ({type(e).__name__}: {e})") from e
    plugins = b.get("plugins") or []
    if not isinstance(b["seed"], int) or not isinstance(plugins, list) or not all(isinstance(x, str) for x in plugins):
        raise _not_a_bundle(path, "its seed is not an integer or its plugins not a list of names")
    return b
