"""What `harness check` tells about one backend's cell (harness/front/check.py runs the cells): its status,
exception, outputs and gradients explained in plain words, each finding naming what in the adapter to
change. Numerics are named, not diagnosed: a wrong result points at `harness run --sizes sweep`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..judge.judgement import judge_cell
from ..model.records import CellRecord, ComponentFigures, Status
from ..model.registry import Backend
from ..model.spec import Component, OperatorSpec

PRESET = "smoke"  # the preset whose smallest case a check runs, and the one a crash's rerun names


@dataclass(frozen=True)
class Finding:
    """One thing to tell about a backend, in plain words. ``blocking``: it kept the backend from running
    here (its devices, a missing package), so nothing was tested, but nothing that ran is wrong either."""

    topic: str
    text: str
    blocking: bool = False


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
