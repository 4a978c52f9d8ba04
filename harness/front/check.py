"""`harness check PLUGIN [PLUGIN...]`: a fast adapter doctor.

Every backend the plugins register (and every backend of an operator a plugin registers) runs one tiny
case here: the smallest case of its operator's smoke preset on this device, in float32 unless the backend
takes no float32, in a worker process (runner.CellExecutor), so that a crash or a hang is a finding and
not the end of the check. The cell record is then explained in plain words, each finding naming what in
the adapter to change. Numerics are not diagnosed here: a cell whose wiring is right but whose results
are wrong points at `harness run --sizes sweep`.

Exit status: 0 every backend ran its case and passed; 1 a finding (a mistake in the adapter or a failing
cell); 2 a usage error (a plugin that does not load, or registers no backend); 3 nothing wrong was found
but some backend could not run on this machine (its devices, a missing package): it was not tested.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..judge.judgement import judge_cell
from ..model import registry
from ..model.devices import checked_device
from ..model.inputs import generator
from ..model.records import CellRecord, ComponentFigures, Status
from ..model.registry import Backend
from ..model.spec import Case, Component, OperatorSpec
from ..run.runner import CellExecutor, Task, plan
from .arguments import device_arg, plugin_arg, seconds

DEFAULT_TIMEOUT = 30.0  # a tiny case: a backend that takes longer hangs, or compiles for long (--timeout S)
PRESET = "smoke"
WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `harness check` (a bad value: cli's one-line usage error, exit 2)."""

    parser.add_argument("plugins", nargs="+", metavar="PLUGIN", type=plugin_arg,
                        help="adapter file (path/to/adapter.py) or module (package.module)")
    parser.add_argument("--device", type=device_arg, default=None,
                        help="cpu, cuda or cuda:N (default: cuda if this machine has a GPU, else cpu)")
    parser.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT,
                        help=f"seconds each tiny case may take before it is a TIMEOUT (default {DEFAULT_TIMEOUT:g}; "
                             "a backend that compiles for longer needs more)")


def run(args: argparse.Namespace) -> int:
    """Check every backend the plugins register; print one block per (operator, backend); the exit status."""

    device = checked_device(args.device)  # a bad or absent device: cli.main's exit 2 / 3, like every command
    try:
        loaded = load(list(args.plugins))
    except Stop as e:
        print(f"harness check: {e.message}", file=sys.stderr)
        return e.code
    checks = check_all(loaded, device, args.timeout)
    print(render(checks, device))
    return exit_code(checks)


# -- what a check finds ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One thing to tell about a backend, in plain words. ``blocking``: it kept the backend from running
    here (its devices, a missing package), so nothing was tested, but nothing that ran is wrong either."""

    topic: str
    text: str
    blocking: bool = False


@dataclass
class BackendCheck:
    """What checking one (operator, backend) found; ``status`` is the cell's, or "not checked"."""

    operator: str
    backend: str
    origin: str
    device: str
    case: str = ""
    dtype: str = ""
    status: str = "not checked"
    seconds: float | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """"mistake" (something to fix), "unchecked" (could not run here) or "ok"."""
        if any(not f.blocking for f in self.findings):
            return "mistake"
        return "unchecked" if self.findings or not self.case else "ok"


@dataclass(frozen=True)
class Subject:
    """A backend under check and what explaining its cell needs."""

    op: OperatorSpec
    backend: Backend
    plugins: tuple[str, ...]  # what `harness run` needs to load for it
    plugin_operator: bool  # the operator was registered by a plugin (its output_dtypes are the user's)
    timeout: float

    @property
    def adapter_files(self) -> set[str]:
        """The adapter's own files: its plugin file and the sources it declares, resolved."""
        spec = self.backend.origin.removeprefix("plugin:")
        files = [*self.backend.sources, *([spec] if Path(spec).is_file() else [])]
        return {str(Path(f).resolve()) for f in files if f}

    def rerun(self, case: str = "", sizes: str = "sweep") -> str:
        """The `harness run` command that judges this backend in full."""
        plugins = " ".join(f"--plugin {p}" for p in self.plugins)
        only = f" --case {case}" if case else ""
        return f"harness run --kernel {self.op.name} {plugins} --backend {self.backend.name} --sizes {sizes}{only}"


class Stop(Exception):
    """Ends the check before any backend runs: exit ``code`` with ``message``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Loaded:
    """The backends to check, the plugins that registered them, and the operators plugins registered."""

    backends: list[Backend]
    plugins: list[str]
    operators: dict[str, str]  # operator registered by a plugin -> that plugin


# -- loading --------------------------------------------------------------------------------------------

def load(specs: list[str]) -> Loaded:
    """Load each plugin; a plugin that fails to load or registers no backend stops the check (exit 2)."""
    registry.discover()
    found: dict[str, Backend] = {}
    new_ops: dict[str, str] = {}
    plugins = list(dict.fromkeys(specs))
    for spec in plugins:
        ops_before = set(registry.operators())
        try:
            mine = registry.load_plugin(spec)
        except FileNotFoundError as e:  # the positional PLUGIN, not an option: name it as the user typed it
            raise Stop(2, f"error: PLUGIN {spec!r}: no such file; expected an adapter file (path/to/adapter.py) "
                          "or an importable module") from e
        except ValueError as e:  # PluginError and RegistrationError are ValueErrors
            raise Stop(2, f"error: {e}") from e
        ops = set(registry.operators()) - ops_before
        mine += [b for op in sorted(ops) for b in registry.backends(op)]
        if not mine:
            raise Stop(2, f"error: {spec}: registers no backend; an adapter calls register_backend(Backend("
                          "operator=..., name=..., impl=...)) when it is imported (see docs/user-guide.md, "
                          "'Plug in your own kernel: adapters')")
        found.update((b.key, b) for b in mine)
        new_ops.update(dict.fromkeys(ops, spec))
    return Loaded(list(found.values()), plugins, new_ops)


# -- checking -------------------------------------------------------------------------------------------

def check_all(loaded: Loaded, device: str, timeout: float) -> list[BackendCheck]:
    """One BackendCheck per backend, all cells through one worker (started only if a cell can run)."""
    gpu = int(device.split(":")[1]) if ":" in device else None
    executor = CellExecutor(device.split(":")[0], loaded.plugins, timeout, gpu)
    try:
        return [check_backend(_subject(b, loaded, timeout), executor, device) for b in loaded.backends]
    finally:
        executor.close()


def _subject(b: Backend, loaded: Loaded, timeout: float) -> Subject:
    """The backend with the plugins it needs: the operator's (when a plugin registered it) and its own."""
    mine = [loaded.operators.get(b.operator, ""), b.origin.removeprefix("plugin:")]
    return Subject(registry.get_operator(b.operator), b, tuple(p for p in dict.fromkeys(mine) if p),
                   b.operator in loaded.operators, timeout)


def check_backend(s: Subject, executor: CellExecutor, device: str) -> BackendCheck:
    """Run the backend's tiny case (unless it cannot run here) and explain the cell."""
    b = s.backend
    out = BackendCheck(b.operator, b.name, b.origin, device)
    out.findings = unrunnable(b, device)
    if out.findings:
        return out
    task, skipped = tiny_task(s.op, b, device)
    if task is None:
        out.findings = [Finding("skipped", "no smoke case runs on this backend here: " + "; ".join(skipped),
                                blocking=True)]
        return out
    out.case, out.dtype = task.case.name, task.dtype
    cell = _run(executor, task)
    out.status, out.seconds = cell.status.value, cell.duration_s
    out.findings = explain(cell, s)
    return out


def _run(executor: CellExecutor, task: Task) -> CellRecord:
    try:
        return executor.run(task)
    except (EOFError, OSError, RuntimeError) as e:  # the worker could not start (its plugin load failed there)
        return task.failed("ERROR", f"the worker process did not start ({type(e).__name__}: {e})")


def unrunnable(b: Backend, device: str) -> list[Finding]:
    """Why the backend cannot run on ``device`` here, from its declarations: devices, requires."""
    dev = device.split(":")[0]
    found = []
    if dev not in b.devices:
        found.append(Finding("devices", _devices_text(b, dev), blocking=True))
    missing = [p for p in b.requires if not _importable(p)]
    if missing:
        found.append(Finding("requires", f"it requires {', '.join(missing)}, not installed here, so it cannot run: "
                                         f"pip install {' '.join(missing)} (or fix the name in requires=(...) if it "
                                         "is misspelled)", blocking=True))
    return found


def _devices_text(b: Backend, dev: str) -> str:
    said = f"it declares devices={b.devices!r}, which excludes this machine's {dev}: nothing could be checked here."
    if dev == "cpu":
        interp = "" if b.interpret else " and set interpret=True"
        return (f"{said} To check it here, if it is a Triton kernel add \"cpu\" to devices{interp} (it then runs "
                "on CPU tensors under TRITON_INTERPRET=1); a CUDA or TileLang kernel needs a GPU: run "
                "`harness check` on a GPU machine.")
    return f"{said} Add \"{dev}\" to devices if the kernel runs on GPU tensors, or check it with --device cpu."


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def tiny_task(op: OperatorSpec, b: Backend, device: str) -> tuple[Task | None, list[str]]:
    """The task of the smallest smoke case the backend takes here, or None and why each case was skipped."""
    dtype = "float32" if "float32" in b.dtypes or not b.dtypes else b.dtypes[0]
    skipped = []
    for case in smallest_first(op, device.split(":")[0], dtype):
        tasks = plan([op.name], PRESET, [b.name], [dtype], device, repeats=1, cases={op.name: [case]}).tasks
        if not tasks:
            return None, [f"{b.key} is a {b.role} backend, which conformance runs do not judge"]
        if not tasks[0].skip:
            return tasks[0], skipped
        skipped.append(f"{case.name} ({dtype}): {tasks[0].skip}")
    return None, skipped or [f"operator {op.name} has no {PRESET} case that allows {dtype}"]


def smallest_first(op: OperatorSpec, dev: str, dtype: str) -> list[Case]:
    """The operator's smoke cases on this device that allow ``dtype``, fewest input elements first."""
    preset = PRESET if PRESET in op.presets else next(iter(op.presets))
    cases = [c for c in op.cases(preset, dev) if dtype in c.params.get("dtypes", [dtype])]
    return sorted(cases, key=lambda c: _elements(op, c))


def _elements(op: OperatorSpec, case: Case) -> int:

    try:
        inputs = op.make_inputs(case, torch.float32, generator(op.name, case.name, case.params, 0), "cpu")
    except Exception:  # noqa: BLE001 - the worker reports it when the case runs; here it only sorts last
        return sys.maxsize
    return sum(t.numel() for t in inputs.tensors.values() if isinstance(t, torch.Tensor))


# -- explaining a cell ----------------------------------------------------------------------------------

def explain(cell: CellRecord, s: Subject) -> list[Finding]:
    """The findings of one cell, from its status, error, traceback, components and what it returned."""
    if cell.status == Status.TIMEOUT:
        return [Finding("timeout", f"no result within {s.timeout:g} s (--timeout) on {cell.case.name}, the "
                                   "smallest case: the worker was killed. The kernel hangs (a loop that never ends, "
                                   "a wait that never returns) or is far too slow for a case this small. If it only "
                                   "needs longer (a first compile), wait longer: `harness check "
                                   f"{' '.join(s.plugins) or '...'} --timeout S` with S seconds above {s.timeout:g}.")]
    if cell.status == Status.CRASH:
        crash = Finding("crash", f"{cell.error} ({cell.case.name}, {cell.dtype}): the kernel took the process down "
                                 "(an invalid memory access, an abort, os._exit); the check went on in a fresh "
                                 f"worker. To see the fault, run the case alone: `{s.rerun(cell.case.name, PRESET)}`.")
        return [crash] + ([exception(cell, s)] if cell.traceback else [])
    if cell.status == Status.ERROR:
        return [exception(cell, s)]
    if cell.status == Status.SKIP:
        return [Finding("skipped", cell.error, blocking=True)]
    return wiring(cell, s) or numerics(cell, s)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_ERROR = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*): (?P<message>.*)$", re.DOTALL)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{self.file}:{self.line} (in {self.func})"


def frames(traceback: str) -> list[Frame]:
    """The frames of a formatted traceback, outermost first."""
    return [Frame(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(traceback)]


def exception(cell: CellRecord, s: Subject) -> Finding:
    """The exception of an ERROR cell: its type and message, and the adapter's file:line."""
    m = _ERROR.match(cell.error)
    kind, message = (m["kind"], m["message"]) if m else ("an error", cell.error)
    first, *rest = message.strip().splitlines() or [""]
    text = f"it raised {kind}: {first}{' ...' if rest else ''}"
    fs = [f for f in frames(cell.traceback) if not f.file.startswith("<")]  # not <frozen importlib...>
    adapter = s.adapter_files
    mine = [f for f in fs if str(Path(f.file).resolve()) in adapter]
    if mine:
        text += f" -- at {mine[-1].where()} in the adapter"
        if fs[-1] != mine[-1]:
            text += f", raised at {fs[-1].where()}"
        return Finding("exception", text + ": fix the adapter or the kernel it calls there.")
    if fs:
        text += f" -- raised at {fs[-1].where()}, outside the adapter's files"
        if any("torch/autograd" in f.file for f in fs):
            text += (" while autograd ran the backward (torch checks that a backward returns one gradient per "
                     "forward input, each shaped like its input)")
    return Finding("exception", text + ".")


# outputs and gradients as the cell record shows them

_SHAPE = re.compile(r"^\[(?P<dims>[\d, ]*)\](?: (?P<dtype>\w+))?$")


def _parse(text: str) -> tuple[tuple[int, ...], str | None] | None:
    """'[4, 7] float32' (or '[4, 7]') as the record writes a shape and dtype; None for anything else."""
    m = _SHAPE.match(text.strip())
    if m is None:
        return None
    return tuple(int(d) for d in m["dims"].split(",") if d.strip()), m["dtype"]


def wiring(cell: CellRecord, s: Subject) -> list[Finding]:
    """Outputs and gradients missing, misnamed, misshapen or in another dtype."""
    found, explained = returned_findings(cell, s.op)
    for fig, comp in _tensors(cell, s.op):
        if comp.source not in explained:
            found.append(tensor_finding(fig, comp, cell.dtype, s))
    if found and not any(s.op.component(f.name).kind == "grad" for f in cell.components):
        first = found[0]
        found[0] = Finding(first.topic, first.text + " (Its gradients were not checked: no upstream gradient can "
                                                     "be applied to a missing or misshapen output.)")
    return found


def _tensors(cell: CellRecord, op: OperatorSpec) -> list[tuple[ComponentFigures, Component]]:
    """The first unjudgeable (missing or misshapen) component of each output and gradient."""
    seen: dict[str, tuple[ComponentFigures, Component]] = {}
    for fig in cell.components:
        comp = op.component(fig.name)
        if fig.kind in ("missing", "shape") and comp.source not in seen:
            seen[comp.source] = (fig, comp)
    return list(seen.values())


def _flagged(cell: CellRecord, op: OperatorSpec, source: str) -> bool:
    return any(fig.kind in ("missing", "shape") and op.component(fig.name).source == source for fig in cell.components)


def _names(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(names)


def returned_findings(cell: CellRecord, op: OperatorSpec) -> tuple[list[Finding], set[str]]:
    """Findings on how the backend named its outputs and gradients (cell.returned), and the sources
    ("out:NAME", "grad:NAME") they already explain."""
    note = cell.returned or {}
    found, explained = [], set()
    outs = note.get("outputs")
    if outs is not None:
        text, missing = _outputs_text(outs, op)
        if text:
            found.append(Finding("outputs", text))
            explained |= {"out:" + m for m in missing}
    grads = note.get("grads")
    if grads is not None:
        keys = grads["keys"]
        extra = [k for k in keys if k not in op.differentiable]
        missing = [x for x in op.differentiable if x not in keys and _flagged(cell, op, "grad:" + x)]
        found.append(Finding("gradients", f"backward returned gradients under the keys {_names(keys)}; they are read "
                                          f"by input name ({_names(op.differentiable)}): {_names(extra)} "
                                          f"{'is' if len(extra) == 1 else 'are'} not an input of {op.name}"
                                          + (f", and {_names(missing)} got no gradient" if missing else "")
                                          + _rename(extra, missing)))
        explained |= {"grad:" + m for m in missing}
    return found, explained


def _rename(extra: list[str], missing: list[str]) -> str:
    return f" (rename {extra[0]!r} to {missing[0]!r}?)" if len(extra) == 1 and len(missing) == 1 else ""


def _outputs_text(outs: dict, op: OperatorSpec) -> tuple[str, list[str]]:
    """What is wrong with how impl returned its outputs, and the outputs of the case it left out."""
    order = f"{op.name}'s outputs, in order: {_names(op.outputs)}"
    expected = outs["expected"]
    if outs["type"] == "dict":
        keys = outs["keys"]
        extra = [k for k in keys if k not in op.outputs]
        missing = [o for o in expected if o not in keys]
        if not extra and not missing:
            return "", []  # an output this case does not ask for (an option turned it off): ignored, harmless
        parts = [f"impl returned a dict with the keys {_names(keys) or '(none)'}"]
        if extra:
            parts.append(f"{_names(extra)} {'is' if len(extra) == 1 else 'are'} not an output of {op.name} (ignored)")
        if missing:
            parts.append(f"{_names(missing)} {'is' if len(missing) == 1 else 'are'} missing")
        return "; ".join(parts) + _rename(extra, missing) + f". {order}.", missing
    n, want = outs["count"], len(expected)
    if n is None:
        return (f"impl returned a {outs['type']}; it must return a dict keyed by output name, a tuple in the "
                f"operator's order, or one tensor. {order}.", [])
    what = "a single tensor" if outs["type"] == "Tensor" else f"a {outs['type']} of {n} values"
    missing = expected[n:]
    tail = (f"the last {n - want} value(s) were ignored" if n > want else
            f"so {_names(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    return (f"impl returned {what}, but this case has {want} output(s): {tail}. {order}; return them in that "
            "order, or as a dict keyed by these names.", missing)


def tensor_finding(fig: ComponentFigures, comp: Component, case_dtype: str, s: Subject) -> Finding:
    """A missing, misshapen or mistyped output or gradient."""
    name = comp.tensor_name
    what = f"output {name!r}" if comp.kind == "out" else f"the gradient of input {name!r}"
    if fig.kind == "missing":
        if comp.kind == "out":
            return Finding("outputs", f"output {name!r} was not returned. {s.op.name}'s outputs, in order: "
                                      f"{_names(s.op.outputs)}.")
        return Finding("gradient", f"the gradient of input {name!r} is None: it was never computed. The backward "
                                   f"returned None for {name!r}, or the outputs do not depend on it through autograd "
                                   "(detached, computed under no_grad, or a raw kernel result that no "
                                   "autograd.Function wraps).")
    expected, got = _parse(fig.expected), _parse(fig.got)
    if expected is None or got is None:
        return Finding("outputs" if comp.kind == "out" else "gradient",
                       f"{what} must be a tensor {fig.expected}; the harness got: {fig.got}. {s.op.name}'s outputs, "
                       f"in order: {_names(s.op.outputs)}; its differentiable inputs: {_names(s.op.differentiable)}.")
    if expected[0] != got[0]:
        return Finding("shape", _shape_text(what, name, comp.kind, expected, got))
    return Finding("dtype", _dtype_text(what, name, comp.kind, expected[1] or "", got[1] or "", case_dtype, s))


def _shape_text(what: str, name: str, kind: str, expected: tuple, got: tuple) -> str:
    want, have = list(expected[0]), list(got[0])
    text = f"{what} has shape {have}, expected {want}"
    if len(have) > 1 and have == want[::-1]:
        text += ": it is the transpose of the expected shape (transpose it back, or compute it in that layout)"
    elif sorted(have) == sorted(want):
        text += ": the right sizes in another order (permute it back)"
    if kind == "grad":
        text += f"; a gradient has the shape of its input {name!r}"
    if got[1] and expected[1] and got[1] != expected[1]:
        text += f"; its dtype is {got[1]}, expected {expected[1]}"
    return text + "."


def _dtype_text(what: str, name: str, kind: str, want: str, have: str, case_dtype: str, s: Subject) -> str:
    text = f"{what} came back as {have}; expected {want} for this {case_dtype} case"
    if kind == "grad":
        return text + f": a gradient takes its input's dtype, cast it in the backward (d{name}.to({name}.dtype))."
    text += f": cast it before returning it ({name}.to(torch.{want}))"
    if s.plugin_operator:
        return text + (f", or, if {have} is what {s.op.name} should return, say so in the OperatorSpec your plugin "
                       "registers: output_dtypes=lambda inputs: {" + f"{name!r}: torch.{have}" + ", ...}.")
    return text + f" ({s.op.name} fixes this output's dtype)."


def numerics(cell: CellRecord, s: Subject) -> list[Finding]:
    """A cell whose wiring is right but whose results fail: named, not diagnosed."""
    j = judge_cell(cell)
    if not j.failing:
        return []
    bad = [f"{c.name} ({c.reason})" for c in j.failed_components]
    bad += [f"contract {c.name} ({c.detail or 'violated'})" for c, excused in j.contracts if not c.ok and not excused]
    return [Finding("results", f"the adapter is wired correctly (it ran and returned every output and gradient in "
                               f"the right shape and dtype), but the kernel's results are wrong on {cell.case.name}: "
                               f"{'; '.join(bad)}. This check does not diagnose numerics: `{s.rerun()}` gives the "
                               "full judgement (where the errors are, and likely causes).")]


# -- output ---------------------------------------------------------------------------------------------

def status_line(c: BackendCheck) -> str:
    ran = f"{c.case} ({c.dtype}, {c.device})"
    took = "" if c.seconds is None else f" in {c.seconds:.1f} s" if c.seconds >= 0.1 else " in <0.1 s"
    if c.outcome == "ok":
        return f"ok: ran {ran}{took}"
    if c.outcome == "unchecked":
        return f"not checked: nothing could run here ({c.device})"
    status = "the cell passed" if c.status == Status.PASS.value else c.status
    return f"to fix ({status}): ran {ran}{took}; {len(c.findings)} finding(s)"


def render(checks: list[BackendCheck], device: str) -> str:
    lines = []
    for c in checks:
        lines += [f"{c.operator}/{c.backend}  ({c.origin})", "  " + status_line(c)]
        lines += [textwrap.fill(f"{f.topic}: {f.text}", WIDTH, initial_indent="  - ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False) for f in c.findings]
        lines.append("")
    counts = {o: sum(c.outcome == o for c in checks) for o in ("ok", "mistake", "unchecked")}
    lines.append(f"{len(checks)} backend(s) on {device}: {counts['ok']} ok, {counts['mistake']} to fix, "
                 f"{counts['unchecked']} not checked here")
    if counts["ok"]:
        lines.append("ok means wired correctly on one tiny case; `harness run --plugin ... --sizes sweep` judges "
                     "the kernel's results")
    return "\n".join(lines)


def exit_code(checks: list[BackendCheck]) -> int:
    """1 any finding to fix; else 3 when a backend could not be checked here; else 0."""
    outcomes = {c.outcome for c in checks}
    if "mistake" in outcomes:
        return 1
    return 3 if "unchecked" in outcomes or not checks else 0
