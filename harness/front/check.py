"""`harness check PLUGIN [PLUGIN...]`: a fast adapter doctor.

Every backend the plugins register (and every backend of an operator a plugin registers) runs one tiny
case here: the smallest case of its operator's smoke preset on this device, in float32 unless the backend
takes no float32, in a worker process (run.single.SingleWorker), so that a crash or a hang is a finding and
not the end of the check. The cell record is then explained in plain words, each finding naming what in
the adapter to change (harness/front/check_findings.py). Numerics are not diagnosed here: a cell whose
wiring is right but whose results are wrong points at `harness run --sizes sweep`.

Exit status: 0 every backend ran its case and passed; 1 a finding (a mistake in the adapter or a failing
cell); 2 a usage error (a plugin that does not load, or registers no backend); 3 nothing wrong was found
but some backend could not run on this machine (its devices, a missing package): it was not tested.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap
from dataclasses import dataclass, field

import torch

from ..judge.judgement import judge_cell
from ..model import registry
from ..model.devices import checked_device
from ..model.inputs import generator
from ..model.records import CellRecord
from ..model.registry import Backend
from ..model.spec import Case, OperatorSpec
from ..run.plan import Task, plan
from ..run.single import SingleWorker
from .arguments import device_arg, plugin_arg, seconds
from .check_findings import PRESET, Finding, Subject, explain

DEFAULT_TIMEOUT = 30.0  # a tiny case: a backend that takes longer hangs, or compiles for long (--timeout S)
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
    executor = SingleWorker(device.split(":")[0], loaded.plugins, timeout, gpu, max_hangs=0)
    try:
        return [check_backend(_subject(b, loaded, timeout), executor, device) for b in loaded.backends]
    finally:
        executor.close()


def _subject(b: Backend, loaded: Loaded, timeout: float) -> Subject:
    """The backend with the plugins it needs: the operator's (when a plugin registered it) and its own."""
    mine = [loaded.operators.get(b.operator, ""), b.origin.removeprefix("plugin:")]
    return Subject(registry.get_operator(b.operator), b, tuple(p for p in dict.fromkeys(mine) if p),
                   b.operator in loaded.operators, timeout)


def check_backend(s: Subject, executor: SingleWorker, device: str) -> BackendCheck:
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
    out.status, out.seconds = judge_cell(cell).shown, cell.duration_s
    out.findings = explain(cell, s)
    return out


def _run(executor: SingleWorker, task: Task) -> CellRecord:
    try:
        return executor.run_one(task)
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


# -- output ---------------------------------------------------------------------------------------------

def status_line(c: BackendCheck) -> str:
    ran = f"{c.case} ({c.dtype}, {c.device})"
    took = "" if c.seconds is None else f" in {c.seconds:.1f} s" if c.seconds >= 0.1 else " in <0.1 s"
    if c.outcome == "ok":
        return f"ok: ran {ran}{took}"
    if c.outcome == "unchecked":
        return f"not checked: nothing could run here ({c.device})"
    status = "the cell passed" if c.status == "PASS" else c.status
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
