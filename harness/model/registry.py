"""Operators and backends: registration, discovery and availability.

In-tree operators live in ``cases/<operator>.py`` and register an :class:`OperatorSpec`; in-tree
backends live under ``backends/<implementation>/`` and register on import. Both folders are imported as
``harness.cases`` and ``harness.backends`` (see harness/__init__.py). External kernels plug
in through the ``harness.backends`` entry-point group or ``--plugin path/to/adapter.py`` /
``--plugin package.module``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .declarations import ContractException, Gap, check_scope, gaps_from
from .spec import Case, Mutant, OperatorSpec

log = logging.getLogger("harness")

ENTRY_POINT_GROUP = "harness.backends"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Backend:
    """A judged implementation of one operator.

    ``impl`` is an autograd-capable callable ``impl(**tensors, **options) -> dict | tuple | Tensor``
    (outputs in the operator's declared order), or a ``"module:attr"`` string imported on first use
    (relative to ``package`` when it starts with a dot), so that adapters register without importing
    triton, CUDA or TileLang. With ``backward`` given, ``impl`` returns ``(outputs, saved)`` and
    ``backward(saved, grad_outputs: dict) -> dict`` of gradients by input name.
    """

    operator: str
    name: str
    impl: Callable | str
    backward: Callable | str | None = None
    devices: tuple[str, ...] = ("cuda",)
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    blocks: dict[str, int] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    deterministic: bool = True
    # Triton kernels: may run on CPU tensors under TRITON_INTERPRET=1
    interpret: bool = False
    matmul_precision: str = "ieee"
    options: dict[str, Any] = field(default_factory=dict)
    # per-cell skip: fn(case, dtype_name, device) -> reason or None
    skip: Callable[[Case, str, str], str | None] | None = None
    package: str | None = None
    sources: tuple[str, ...] = ()
    origin: str = "in-tree"
    description: str = ""
    # baseline backends are timed in `harness bench` but not required to pass the floor
    role: str = "kernel"
    # known precision gaps, each scoped (dtypes, components, case tags, device classes) up to a ceiling
    # ratio: a tuple of declarations.Gap (or the older {"dtype[@tag+tag]": reason} dict, read as Gaps over
    # every component up to 10x). Declared, never hidden: the report shows their figures as XFAIL
    expected_gaps: Any = ()
    # contracts broken by design (declarations.ContractException); they excuse no numeric failure
    contract_exceptions: tuple[ContractException, ...] = ()
    # True: this registration takes over a backend of the same operator and name (else that is an error)
    replaces: bool = False
    _resolved: Any = field(default=None, repr=False)
    _gaps: tuple[Gap, ...] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.operator}/{self.name}"

    @property
    def gaps(self) -> tuple[Gap, ...]:
        """The declared precision gaps as scoped Gap declarations."""
        if self._gaps is None:
            self._gaps = gaps_from(self.expected_gaps, self.key)
        return self._gaps

    def _load(self, ref: Callable | str) -> Callable:
        if callable(ref):
            return ref
        mod_name, _, attr = ref.partition(":")
        mod = importlib.import_module(mod_name, package=self.package)
        return getattr(mod, attr)

    def resolve(self) -> tuple[Callable, Callable | None]:
        if self._resolved is None:
            bwd = self._load(self.backward) if self.backward is not None else None
            self._resolved = (self._load(self.impl), bwd)
        return self._resolved

    def unavailable(self, device: str, here: bool = True) -> str | None:
        """Why this backend cannot run on ``device`` here, or None. Without ``here`` (the cells run on other
        machines), only what does not depend on the machine: the devices it declares."""
        dev = device.split(":")[0]
        if dev not in self.devices:
            hint = " (a Triton backend runs there under TRITON_INTERPRET=1)" if self.interpret else ""
            return f"runs on {'/'.join(self.devices)} only; this run is on {dev}{hint}"
        if not here:
            return None
        for pkg in self.requires:
            if importlib.util.find_spec(pkg) is None:
                return f"package {pkg!r} is not installed (pip install {pkg})"
        if dev == "cuda":
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device on this machine"
        return None

    def source_files(self) -> list[str]:
        """Files whose content defines this backend, relative to the repo when inside it."""
        files = list(self.sources)
        if not files and self.package:
            spec = importlib.util.find_spec(self.package)
            if spec is not None and spec.origin:
                files.append(spec.origin)
        return files


_OPERATORS: dict[str, OperatorSpec] = {}
_ALIASES: dict[str, list[str]] = {}
_BACKENDS: dict[str, dict[str, Backend]] = {}
_MUTANTS: dict[str, Mutant] = {}
_discovered = False
_plugins_loaded: list[str] = []
# While set, registrations are captured here instead of the global table (mutants use this).
_capture: list[Backend] | None = None


def register_operator(spec: OperatorSpec) -> OperatorSpec:
    old = _OPERATORS.get(spec.name)
    if old is not None and _defined_in(old) != _defined_in(spec):  # the same module imported again is no clash
        raise RegistrationError(f"operator {spec.name!r} is already registered (by {_defined_in(old)}): give "
                                f"yours another name (registering it from {_defined_in(spec)})")
    _OPERATORS[spec.name] = spec
    for alias in spec.aliases:
        _ALIASES.setdefault(alias, [])
        if spec.name not in _ALIASES[alias]:
            _ALIASES[alias].append(spec.name)
    return spec


def _defined_in(spec: OperatorSpec) -> str:
    """The module that defines an operator: where its inputs are made (every OperatorSpec has make_inputs)."""
    return getattr(spec.make_inputs, "__module__", None) or "?"


def register_mutant(m: Mutant) -> Mutant:
    _MUTANTS[m.id] = m
    return m


def mutants(operator: str | None = None) -> list[Mutant]:
    discover()
    return [m for m in _MUTANTS.values() if operator is None or m.operator == operator]


def register_backend(backend: Backend | None = None, /, **kwargs: Any) -> Any:
    """Register a backend, directly or as a decorator.

    Decorator form (the 20-line adapter)::

        from harness import register_backend

        @register_backend(operator="softmax_xent", name="mine", devices=("cuda",))
        def my_xent(logits, targets, *, ignore_index, reduction, label_smoothing, z_loss):
            return {"loss": my_kernel(logits, targets, ...)}
    """

    def add(b: Backend) -> Backend:
        if b.package is None and callable(b.impl):
            b.package = b.impl.__module__
        _check_declarations(b)
        if _capture is not None:
            _capture.append(b)
            return b
        if _discovered and b.operator not in _OPERATORS:
            raise RegistrationError(f"backend {b.key}: no operator {b.operator!r} is registered; operators: "
                                    f"{', '.join(sorted(_OPERATORS))} (register_operator(...) it first)")
        table = _BACKENDS.setdefault(b.operator, {})
        if b.name in table:
            old = table[b.name]
            if not b.replaces:
                raise RegistrationError(f"backend {b.key} is already registered ({old.origin}): give yours another "
                                        "name, or register it with replaces=True to run it instead")
            log.warning("backend %s (%s) replaces the one registered by %s", b.key, _loading or b.origin, old.origin)
        table[b.name] = b
        return b

    if backend is not None:
        return add(backend)

    def deco(fn: Callable) -> Callable:
        src = kwargs.pop("sources", None)
        if src is None:
            mod = sys.modules.get(fn.__module__)
            f = getattr(mod, "__file__", None)
            src = (f,) if f else ()
        add(Backend(impl=fn, sources=tuple(src), package=fn.__module__, **kwargs))
        return fn

    return deco


class RegistrationError(ValueError):
    """A registration that would make a run ambiguous or test nothing: an unknown operator, a name taken."""


class PluginError(ValueError):
    """A plugin that cannot be loaded, with the file and line to look at."""


# the plugin being loaded (so that a replacement names where it came from)
_loading: str | None = None


def _check_declarations(b: Backend) -> None:
    """Declarations name the operator's components, tags and dtypes correctly, or registration fails."""
    op = _OPERATORS.get(b.operator)
    if op is None or not (b.gaps or b.contract_exceptions):
        return
    check_scope(b.gaps, b.key, {c.name for c in op.components}, operator_tags(op),
                {"float32", "bfloat16", "float16"})


def operator_tags(op: OperatorSpec) -> set[str]:
    """Every tag a case of the operator carries, in any preset on any device."""
    tags: set[str] = set()
    for preset in op.presets:
        for dev in ("cpu", "cuda"):
            try:
                tags.update(t for c in op.cases(preset, dev) for t in c.tags)
            except Exception:  # noqa: BLE001 - a preset that does not exist on that device
                continue
    return tags


def _import_tree(package: str) -> None:
    """Import every module of an in-tree package that registers something (adapters, cases)."""
    try:
        pkg = importlib.import_module(package)
    except ImportError as e:  # pragma: no cover - broken checkout
        log.error("cannot import %s: %s", package, e)
        return
    for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
        parts = info.name.split(".")[1:]  # under the harness namespace
        if parts[-1].startswith("_"):
            continue
        if parts[0] == "cases":
            wanted = len(parts) == 2 and not info.ispkg
        else:
            # backends/<impl>/<op>.py, or backends/<impl>/<op>/adapter.py; kernels and wrappers
            # are imported lazily by their adapter, so that registering needs no triton or GPU.
            wanted = (len(parts) == 3 and not info.ispkg) or (len(parts) == 4 and parts[-1] == "adapter")
        if not wanted:
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:  # an adapter that fails to import must not hide the others
            log.error("cannot import %s: %s: %s", info.name, type(e).__name__, e)


def discover() -> None:
    """Import in-tree operators and backends and entry-point plugins, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    _import_tree("harness.cases")
    _import_tree("harness.backends")
    try:

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                if callable(obj) and not isinstance(obj, type):
                    obj()
            except Exception as e:
                log.error("entry point %s failed to load: %s", ep.name, e)
    except Exception as e:  # pragma: no cover
        log.error("entry points unavailable: %s", e)


def load_plugin(spec: str) -> list[Backend]:
    """Load ``path/to/adapter.py`` or ``package.module`` once; returns the backends it registered.

    A file's own folder is importable from it (an adapter importing its kernel module beside it). Any
    error while loading becomes a PluginError naming the file and line (a usage error, not a traceback)."""
    global _loading
    if spec in _plugins_loaded:
        return []
    discover()  # in-tree operators first: a plugin registers against them (or adds its own)
    before = {(b.operator, b.name, id(b)) for t in _BACKENDS.values() for b in t.values()}
    origin = f"plugin:{spec}"
    _loading = origin
    try:
        _exec_plugin(spec)
    finally:
        _loading = None
    new = [b for t in _BACKENDS.values() for b in t.values() if (b.operator, b.name, id(b)) not in before]
    for b in new:
        b.origin = origin
    _plugins_loaded.append(spec)
    return new


def _exec_plugin(spec: str) -> None:
    p = Path(spec)
    if not (spec.endswith(".py") or p.exists()):
        try:
            importlib.import_module(spec)
        except ImportError as e:
            raise PluginError(f"--plugin {spec!r}: not a file and not an importable module ({e})") from e
        except Exception as e:  # noqa: BLE001 - the module's own error, named
            raise PluginError(f"--plugin {spec}: {_where(e, None)}{type(e).__name__}: {e}") from e
        return
    if not p.exists():
        raise FileNotFoundError(f"--plugin {spec!r}: no such file")
    name = "harness_plugin_" + p.stem + "_" + str(abs(hash(str(p.resolve()))) % 10**8)
    folder = p.resolve().parent
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))  # the adapter's own modules, beside it, before any other plugin's
    shadowed = _set_aside(folder, spec)
    mspec = importlib.util.spec_from_file_location(name, p)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    sys.modules[name] = mod
    try:
        mspec.loader.exec_module(mod)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise PluginError(f"--plugin {spec}: {e.filename}:{e.lineno}: SyntaxError: {e.msg}") from e
    except Exception as e:  # noqa: BLE001 - an import or registration error inside the plugin, named
        sys.modules.pop(name, None)
        raise PluginError(f"--plugin {spec}: {_where(e, str(p.resolve()))}{type(e).__name__}: {e}") from e
    finally:
        # the earlier plugin's modules keep their plain names; this plugin's objects hold on to its own
        sys.modules.update(shadowed)
        _PLUGIN_FOLDERS.add(folder)


# folders of the plugin files loaded so far: their modules beside them are imported by plain name
_PLUGIN_FOLDERS: set[Path] = set()


def _folder_of(mod: Any) -> Path | None:
    f = getattr(mod, "__file__", None)
    if not f:
        return None
    path = Path(f).resolve()
    return path.parent.parent if path.name == "__init__.py" else path.parent


def _set_aside(folder: Path, spec: str) -> dict[str, Any]:
    """Modules beside this plugin whose plain names another plugin's modules hold already (two adapters each
    with a kernels.py): taken out of sys.modules while this plugin loads, so that its `import kernels` gets
    its own file, then put back. A name held by an installed or standard module cannot be set aside safely:
    a warning names it."""
    local = {f.stem for f in folder.glob("*.py")} - {"conftest"}  # pytest's own business
    local |= {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").is_file()}
    aside = {}
    for n in sorted(local):
        held = sys.modules.get(n)
        where = _folder_of(held) if held is not None else None
        if held is None or where == folder:
            continue
        if where in _PLUGIN_FOLDERS:
            aside[n] = sys.modules.pop(n)
        else:
            log.warning("--plugin %s: %s beside it is hidden by the module %r already imported from %s; a "
                        "plain `import %s` in the plugin gets that one: rename the file", spec,
                        f"{n}.py" if (folder / f"{n}.py").exists() else f"{n}/", n, getattr(held, "__file__", "?"), n)
    return aside


def _where(e: BaseException, file: str | None) -> str:
    """'path:line: ' of the deepest frame in the plugin's file (or the last frame outside the harness)."""

    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if file is not None and f.filename == file]
    mine = mine or [f for f in frames if "/harness/" not in f.filename and "importlib" not in f.filename]
    return f"{mine[-1].filename}:{mine[-1].lineno}: " if mine else ""


def plugins_loaded() -> list[str]:
    return list(_plugins_loaded)


def operators() -> dict[str, OperatorSpec]:
    discover()
    return dict(_OPERATORS)


def get_operator(name: str) -> OperatorSpec:
    discover()
    if name not in _OPERATORS:
        raise KeyError(
            f"unknown operator {name!r}; operators: {', '.join(sorted(_OPERATORS))}; "
            f"families: {', '.join(sorted(_ALIASES))}"
        )
    return _OPERATORS[name]


def resolve_kernels(names: list[str]) -> list[str]:
    """Expand operator ids and family aliases ('mhc', 'all') into operator ids."""
    discover()
    out: list[str] = []
    for n in names:
        if n == "all":
            cand = sorted(_OPERATORS)
        elif n in _OPERATORS:
            cand = [n]
        elif n in _ALIASES:
            cand = _ALIASES[n]
        else:
            raise KeyError(
                f"--kernel {n!r} is not an operator or family; operators: "
                f"{', '.join(sorted(_OPERATORS))}; families: {', '.join(sorted(_ALIASES))}; or 'all'"
            )
        out += [c for c in cand if c not in out]
    return out


def backends(operator: str | None = None) -> list[Backend]:
    discover()
    if operator is None:
        return [b for t in _BACKENDS.values() for b in t.values()]
    return list(_BACKENDS.get(operator, {}).values())


def get_backend(operator: str, name: str) -> Backend:
    discover()
    table = _BACKENDS.get(operator, {})
    if name in table:
        return table[name]
    raise KeyError(f"operator {operator!r} has no backend {name!r}; backends: {', '.join(sorted(table)) or '(none)'}")


def capture_registrations() -> _Capture:
    return _Capture()


class _Capture:
    """Context manager collecting registrations instead of publishing them (used by mutants)."""

    def __enter__(self) -> list[Backend]:
        global _capture
        self._prev = _capture
        _capture = []
        return _capture

    def __exit__(self, *exc: object) -> None:
        global _capture
        _capture = self._prev


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
