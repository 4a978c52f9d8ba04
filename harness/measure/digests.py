"""A cell's inputs as drawn, reduced to a digest and a size: recorded with the cell, checked when a repro
bundle is replayed, and compared by --compare (two runs' cells are comparable on the same inputs only)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from pathlib import Path
from typing import Any

import torch

from ..model import inputs
from ..model.registry import get_operator
from ..model.spec import Case
from . import oracle
from .oracle import drawn_inputs


def tensors_digest(tensors: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        v = tensors[k]
        if isinstance(v, torch.Tensor):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def tensors_nbytes(tensors: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))


def input_digest(op: Any, case: Case, dtype: torch.dtype, seed: int, device: str) -> tuple[str, int]:
    """Digest and size of a cell's inputs as drawn (bit-identical on every device, see oracle)."""
    inputs = drawn_inputs(op, case, dtype, seed, device)  # the cached draw itself: no copy of a large case
    return tensors_digest(inputs.tensors), tensors_nbytes(inputs.tensors)


# harness/'s layer folders: a module's place among them is not part of what the oracle computes
LAYERS = ("model", "judge", "store", "measure", "across", "render", "run", "tools", "front")
_LAYER_IN_PATH = re.compile(r"(?<=harness[./])(?:" + "|".join(LAYERS) + r")[./]")
_RELATIVE_LAYER = re.compile(r"^(\s*from )\.\.(?:" + "|".join(LAYERS) + r")\.?", re.M)
_IMPORT = re.compile(r"from (?:\.|harness)\S* import [^(\n]*")


def _placeless(text: str) -> str:
    """A source text as it read before harness/ had layer folders: each harness module named without its
    layer (harness.model.inputs -> harness.inputs, ..model.inputs -> .inputs, and a file's path in a comment
    likewise) and each run of one-line imports of harness modules sorted as it was. The moves into
    layers thereby left every operator's digest, and the committed reports' comparability, as they were."""
    lines = _RELATIVE_LAYER.sub(r"\1.", _LAYER_IN_PATH.sub("", text)).split("\n")
    out: list[str] = []
    run: list[str] = []
    for line in [*lines, None]:
        if line is not None and _IMPORT.fullmatch(line):
            run.append(line)
            continue
        out += sorted(run)
        run = []
        if line is not None:
            out.append(line)
    return "\n".join(out)


def _without_adversarial(text: str) -> str:
    """A case module as it read before its presets listed the adversarial layout twins (issue #44): each
    `` *adversarial(...),`` of a preset list and its import taken out. A preset's list of cases is not part of
    what the oracle of any one case computes, so adding cases left the operator's digest, and the committed
    reports' comparability, as they were."""
    text = text.replace("import adversarial, twin,", "import twin,")
    out, at = [], 0
    while (start := text.find(" *adversarial(", at)) >= 0:
        depth, i = 0, start + len(" *adversarial")
        while True:  # to the parenthesis that closes the call
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        out.append(text[at:start])
        at = i + 1 if text[i:i + 1] == "," else i
    return "".join(out) + text[at:]


def _as_placed_before(path: str) -> str:
    """The path a harness module had before the layer folders: the digest hashes files in that order."""
    p = Path(path)
    return str(p.parent.parent / p.name) if p.parent.name in LAYERS and p.parent.parent.name == "harness" else path


@functools.cache
def oracle_code(op_name: str) -> str:
    """A digest of the code that makes a cell's inputs, oracle and floor: the operator's reference and case
    modules and harness/measure/oracle.py and harness/model/inputs.py. Two runs' cells with the same digest,
    seed and inputs were judged against the same oracle, so a change in their error is the backend's."""
    op = get_operator(op_name)
    files = {inspect.getsourcefile(m) for m in (oracle, inputs)}
    for fn in (op.reference, op.make_inputs):
        try:
            files.add(inspect.getsourcefile(fn))
        except TypeError:  # a builtin or a C function: no source to hash
            pass
    h = hashlib.sha1()
    for f in sorted((x for x in files if x), key=_as_placed_before):
        text = _without_adversarial(_placeless(Path(f).read_bytes().decode("utf-8", "surrogateescape")))
        h.update(text.encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:12]
