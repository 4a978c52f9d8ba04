"""Layout twins: a case's tensors re-placed with other strides, derived for any operator.

Like OpInfo's ``noncontiguous()`` samples, a twin of a case is the same point of the input space in other
layouts: its inputs and upstream gradients are drawn exactly as the base case's (bit-identical values, so
the oracle is the same) and then re-placed (:func:`harness.model.inputs.place`) in layouts derived from the
tensors themselves, never from an operator's names. Every floating tensor of rank >= 1 with more than one
element among the inputs and the graded outputs' upstream gradients is eligible:

==========  =========================================================================================
``stride``  every eligible tensor with innermost stride 2 (``stride:2``: a slice of a twice wider buffer,
            NaN in the gaps): a kernel that ignores the last dimension's stride reads NaN
``mixed``   the eligible tensors with innermost strides 2, 3, 4, ... in the operator's order (inputs
            first, then upstream gradients), so that their strides differ pairwise, innermost ones
            included: a kernel that addresses one tensor with another's strides reads wrong elements
==========  =========================================================================================

A twin is named ``<case>~<twin>`` and carries ``params["twin"]``; a preset asks for twins with
:func:`with_twins`. A backend that needs unit innermost strides copies in its wrapper (the contract).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from .inputs import place
from .spec import Case, Inputs, OperatorSpec

Tensor = torch.Tensor

TWINS = {
    "stride": "every eligible input and upstream gradient with innermost stride 2",
    "mixed": "the eligible inputs and upstream gradients with mutually different innermost strides 2, 3, 4, ...",
}
# how a twin's layouts name an upstream gradient (the gradient of the loss with respect to that output)
GRAD = "grad:"


def twin(case: Case, which: str) -> Case:
    """The ``which`` twin of ``case`` (see the module docstring): same values, other strides."""
    if which not in TWINS:
        raise ValueError(f"twin {which!r}: expected one of {', '.join(TWINS)}")
    if "twin" in case.params:
        raise ValueError(f"case {case.name!r} is already the {case.params['twin']!r} twin of "
                         f"{base_case(case).name!r}: derive twins from the base case")
    return Case(f"{case.name}~{which}", {**case.params, "twin": which}, case.tags, case.microbatches)


def with_twins(cases: Sequence[Case], which: Sequence[str] = tuple(TWINS),
               only: Collection[str] | None = None) -> list[Case]:
    """``cases``, each followed by its ``which`` twins; with ``only``, just the cases of those names get twins
    (a name that is not among ``cases`` is an error)."""
    if only is not None:
        unknown = sorted(set(only) - {c.name for c in cases})
        if unknown:
            raise ValueError(f"with_twins: no case named {', '.join(unknown)}; cases: "
                             f"{', '.join(c.name for c in cases)}")
    out: list[Case] = []
    for c in cases:
        out.append(c)
        if only is None or c.name in only:
            out += [twin(c, w) for w in which]
    return out


def base_case(case: Case) -> Case:
    """The case a twin was derived from (the case itself when it is no twin): its draws are the twin's."""
    which = case.params.get("twin")
    if which is None:
        return case
    params = {k: v for k, v in case.params.items() if k != "twin"}
    return Case(case.name.removesuffix(f"~{which}"), params, case.tags, case.microbatches)


def eligible(t: object) -> bool:
    """A tensor whose layout a twin changes: floating, rank >= 1, more than one element."""
    return isinstance(t, Tensor) and t.is_floating_point() and t.dim() >= 1 and t.numel() > 1


def _ordered(op: OperatorSpec, tensors: dict[str, object]) -> list[str]:
    return [n for n in op.inputs if n in tensors] + [n for n in tensors if n not in op.inputs]


def layouts(op: OperatorSpec, case: Case, inputs: dict[str, object],
            grads: dict[str, object] | None = None) -> dict[str, str]:
    """The layout of each tensor a twin re-places: input names, and ``grad:<output>`` for upstream gradients
    (only when ``grads`` is given). Empty for a case that is no twin."""
    which = case.params.get("twin")
    if which is None:
        return {}
    if which not in TWINS:
        raise ValueError(f"case {case.name!r}: twin {which!r} is not one of {', '.join(TWINS)}")
    named = [(n, inputs[n]) for n in _ordered(op, inputs)]
    if grads is not None:
        named += [(GRAD + n, grads[n]) for n in [*[o for o in op.graded_outputs if o in grads],
                                                 *[o for o in grads if o not in op.graded_outputs]]]
    picked = [name for name, t in named if eligible(t)]
    return {name: f"stride:{2 if which == 'stride' else 2 + i}" for i, name in enumerate(picked)}


def _replace(t: Tensor, layout: str, device: str) -> Tensor:
    return place(t.detach(), layout, device).requires_grad_(t.requires_grad)


def twin_inputs(op: OperatorSpec, case: Case, inputs: Inputs, device: str) -> Inputs:
    """The base case's inputs re-placed as the twin ``case`` says (unchanged for a case that is no twin)."""
    lay = layouts(op, case, inputs.tensors)
    if not lay:
        return inputs
    tensors = {n: (_replace(t, lay[n], device) if n in lay else t) for n, t in inputs.tensors.items()}
    return Inputs(tensors, inputs.options)


def twin_grad_outputs(op: OperatorSpec, case: Case, inputs: dict[str, object], grads: dict[str, Tensor],
                      device: str) -> dict[str, Tensor]:
    """The base case's upstream gradients re-placed as the twin ``case`` says (``inputs``: the cell's inputs,
    which take the first strides)."""
    lay = layouts(op, case, inputs, grads)
    return {n: (_replace(g, lay[GRAD + n], device) if GRAD + n in lay else g) for n, g in grads.items()}
