"""The oracle digest (harness/measure/digests.py): what defines a cell's inputs, oracle and figures changes it; the
presets' lists of cases, comments and layout do not, so that adding a case keeps earlier runs comparable."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from harness.measure.digests import spec_code

OPERATOR = '''
import torch
from harness.model.spec import Component, Inputs, OperatorSpec, Case

SCALE = {scale}


def _draw(n, gen):
    return torch.randn(n, generator=gen) * SCALE  {comment}


def make_inputs(case, dtype, gen, device):
    return Inputs({{"x": _draw(case.params["n"], gen).to(dtype)}}, {{}})


def reference(x):
    return {{"y": x * x}}


def smoke(device):
    return [Case(f"n{{n}}", {{"n": n}}) for n in {sizes}]


SPEC = OperatorSpec(name="digest_probe", inputs=("x",), differentiable=("x",), outputs=("y",), graded_outputs=("y",),
                    reference=reference, make_inputs=make_inputs, components=(Component("y", "out:y"),),
                    presets={{"smoke": smoke}})
'''


def _digest(tmp_path: Path, tag: str, scale: str = "2.0", comment: str = "", sizes: str = "(3, 5)") -> str:
    path = tmp_path / f"digest_probe_{tag}.py"
    path.write_text(OPERATOR.format(scale=scale, comment=comment, sizes=sizes))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    try:
        spec.loader.exec_module(mod)
        return spec_code(mod.SPEC)
    finally:
        del sys.modules[path.stem]


def test_what_defines_the_inputs_changes_the_digest_and_a_preset_comment_or_layout_does_not(tmp_path: Path):
    base = _digest(tmp_path, "a")
    assert _digest(tmp_path, "b") == base  # the same code in another module file
    assert _digest(tmp_path, "c", scale="3.0") != base  # a constant a helper of make_inputs reads
    assert _digest(tmp_path, "d", sizes="(3, 5, 7)") == base  # a case added to a preset
    assert _digest(tmp_path, "e", comment="# drawn at SCALE") == base  # a comment
