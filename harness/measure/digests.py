"""A cell's inputs as drawn, reduced to a digest and a size: recorded with the cell, checked when a repro
bundle is replayed, and compared by --compare (two runs' cells are comparable on the same inputs only)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import sys
import textwrap
import types
from typing import Any

import torch

from ..model.registry import get_operator
from ..model.spec import Case
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


# The harness modules that make a cell's inputs, oracle and floor, hashed whole (as code: comments aside).
ORACLE_MODULES = ("harness.measure.oracle", "harness.measure.orders", "harness.measure.tf32",
                  "harness.measure.chunking", "harness.model.inputs", "harness.model.twins")
# OperatorSpec fields that list, draw, time or describe cases without defining any case's inputs, oracle, floor
# or figures: a case added to a preset, or a benchmark, changes no cell's digest
NOT_ORACLE = frozenset({"presets", "aliases", "strategy", "cost_model", "bench_cases", "perf_targets", "baseline",
                        "doc"})


def _code(source: str) -> str:
    """Source as code: comments and layout aside where it parses whole (a lambda's line may not)."""
    try:
        return ast.unparse(ast.parse(textwrap.dedent(source)))
    except SyntaxError:
        return source.strip()


def _module_code(name: str) -> str:
    mod = sys.modules.get(name)
    try:
        return _code(inspect.getsource(mod)) if mod is not None else name
    except (OSError, TypeError):  # no source file
        return name


def _followed(module: str) -> bool:
    """Whether a definition of ``module`` is hashed as code: an operator's own (cases/, references/, a plugin), not
    torch's, the standard library's or the harness's layers (ORACLE_MODULES are hashed whole)."""
    if module.startswith(("harness.cases", "harness.references")):
        return True
    if module.startswith("harness") or module.split(".")[0] in sys.stdlib_module_names:
        return False
    path = str(getattr(sys.modules.get(module), "__file__", None) or "")
    return bool(path) and "site-packages" not in path and "dist-packages" not in path


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _walk(obj: Any, out: list[str], seen: dict[int, int]) -> None:
    """What defines ``obj`` into ``out``: a function's code, the module-level values and closures it reads and
    what defines them in turn; a dataclass's fields; a plain value's repr. A function, class or dataclass met
    before is written as a reference to its first place (``seen``: id -> its number), so that cycles end and the
    text still differs wherever the structure does."""
    if isinstance(obj, (int, float, str, bool, bytes, type(None), torch.dtype)):
        out.append(repr(obj))
        return
    if id(obj) in seen:
        out.append(f"@{seen[id(obj)]}")
        return
    seen[id(obj)] = len(seen)
    if isinstance(obj, functools.partial):
        for x in (obj.func, obj.args, obj.keywords):
            _walk(x, out, seen)
    elif inspect.isfunction(obj) or inspect.ismethod(obj):
        fn = inspect.unwrap(getattr(obj, "__func__", obj))
        if not _followed(fn.__module__):
            out.append(f"{fn.__module__}.{fn.__qualname__}")
            return
        out.append(fn.__qualname__)  # with its code below: the module it sits in does not matter
        with contextlib.suppress(OSError, TypeError):
            out.append(_code(inspect.getsource(fn)))
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                _walk(fn.__globals__[name], out, seen)
        for x in (fn.__defaults__ or ()) + tuple(c.cell_contents for c in fn.__closure__ or ()
                                                 if c.cell_contents is not None):
            _walk(x, out, seen)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _walk(x, out, seen)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr):
            out.append(repr(k))
            _walk(obj[k], out, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out.append(type(obj).__qualname__)
        for f in dataclasses.fields(obj):
            _walk(getattr(obj, f.name), out, seen)
    elif inspect.isclass(obj) and _followed(obj.__module__):
        with contextlib.suppress(OSError, TypeError):
            out.append(_code(inspect.getsource(obj)))
    else:  # a module, a class of a library, an object: by name
        out.append(getattr(obj, "__name__", type(obj).__qualname__))


@functools.cache
def oracle_code(op_name: str) -> str:
    """A digest of the code that makes a cell's inputs, oracle, floor and figures: the harness's ORACLE_MODULES, and
    what every OperatorSpec field outside NOT_ORACLE is defined by (its reference, make_inputs, components,
    extra bound, ... and the operator code they read), as code: comments, layout and the presets' lists of cases
    aside. Two runs' cells with the same digest, seed and inputs were judged against the same oracle, so a change
    in their error is the backend's."""
    return spec_code(get_operator(op_name))


def spec_code(op: Any) -> str:
    """oracle_code of an OperatorSpec (uncached)."""
    out = [_module_code(name) for name in ORACLE_MODULES]
    seen: dict[int, int] = {}
    for f in dataclasses.fields(op):
        if f.name not in NOT_ORACLE:
            out.append(f.name)
            _walk(getattr(op, f.name), out, seen)
    return hashlib.sha1("\n".join(out).encode("utf-8", "surrogateescape")).hexdigest()[:12]
