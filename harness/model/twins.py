"""Layout twins: a case's tensors re-placed with other strides, derived for any operator.

Like OpInfo's ``noncontiguous()`` samples, a twin of a case is the same point of the input space in other
layouts: its inputs and upstream gradients are drawn exactly as the base case's (bit-identical values, so
the oracle is the same) and then re-placed (:func:`harness.model.inputs.place`) in layouts derived from the
tensors themselves, never from an operator's names. Every floating tensor of rank >= 1 with more than one
element among the inputs and the graded outputs' upstream gradients is eligible:

=============  ======================================================================================
``stride``     every eligible tensor with innermost stride 2 (``stride:2``: a slice of a twice wider
               buffer, NaN in the gaps): a kernel that ignores the last dimension's stride reads NaN
``mixed``      the eligible tensors with innermost strides 2, 3, 4, ... in the operator's order (inputs
               first, then upstream gradients), so that their strides differ pairwise, innermost ones
               included: a kernel that addresses one tensor with another's strides reads wrong elements
``offset``     every eligible tensor a narrow view of a wider NaN buffer, as torch.cat's backward hands
               them on: 16 bytes of storage offset, rows 32 bytes longer than the view (``offset``): a
               kernel that takes the storage's start or the row's length for the view's reads NaN
``unaligned``  every eligible tensor contiguous, its data pointer one element past a 16-byte boundary
               (``unaligned``): a kernel whose vector or TMA loads assume alignment faults or reads the
               wrong elements
``expand``     every upstream gradient of rank >= 1 one value broadcast to its shape, every stride 0, as
               ``y.sum().backward()`` hands it on (``expand``; the value is the base draw's first): a
               kernel that reads it as contiguous reads the NaN behind that value. The only twin whose
               values differ from its base case's (constant, as such a gradient is); its oracle is its own
=============  ======================================================================================

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
    "offset": "every eligible input and upstream gradient a narrow view: a storage offset, rows longer than the view",
    "unaligned": "every eligible input and upstream gradient at a data pointer that is not 16-byte aligned",
    "expand": "every upstream gradient one value expanded to its shape (stride 0), as y.sum().backward() gives",
}
# what a failure of each twin whose base case passes says (the judge's layout hint)
TWIN_CAUSES = {
    "stride": "an innermost stride taken as 1",
    "mixed": "one tensor addressed with another's strides",
    "offset": "a storage offset or a row length taken for the view's",
    "unaligned": "a data pointer assumed 16-byte aligned (vector or TMA loads)",
    "expand": "a stride-0 upstream gradient read as if contiguous",
}
# the twins whose layouts harness.model.inputs.place does not take: placed here (_placed)
ADVERSARIAL = ("offset", "unaligned", "expand")
ALIGN = 16  # bytes: what vector loads and TMA descriptors assume of a data pointer
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


def adversarial(case: Case) -> list[Case]:
    """The ADVERSARIAL twins of ``case`` (storage offset, unaligned pointer, stride-0 upstream gradient): what
    a smoke preset adds to one of its cases so that it has every layout feature of a sweep's twins."""
    return [twin(case, w) for w in ADVERSARIAL]


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
    if which == "expand":
        return {name: which for name in picked if name.startswith(GRAD)}
    if which in ADVERSARIAL:
        return {name: which for name in picked}
    return {name: f"stride:{2 if which == 'stride' else 2 + i}" for i, name in enumerate(picked)}


def _replace(t: Tensor, layout: str, device: str) -> Tensor:
    placed = _placed(t.detach(), layout, device) if layout in ADVERSARIAL else place(t.detach(), layout, device)
    return placed.requires_grad_(t.requires_grad)


def _placed(values: Tensor, layout: str, device: str) -> Tensor:
    """``values`` in one of the ADVERSARIAL layouts (module docstring), inside a NaN-filled buffer."""
    pad = max(1, ALIGN // values.element_size())  # elements in 16 bytes
    nan = float("nan")
    if layout == "offset":
        shape = list(values.shape)
        buf = torch.full((*shape[:-1], shape[-1] + 2 * pad), nan, dtype=values.dtype, device=device)
        out = buf[..., pad:pad + shape[-1]]
        out.copy_(values.to(device))
        return out
    if layout == "unaligned":
        buf = torch.full((values.numel() + pad,), nan, dtype=values.dtype, device=device)
        out = buf[1:1 + values.numel()].view(values.shape)
        out.copy_(values.to(device))
        return out
    if layout == "expand":
        buf = torch.full((values.numel(),), nan, dtype=values.dtype, device=device)
        buf[0] = values.reshape(-1)[0]
        return buf.as_strided(values.shape, (0,) * values.dim())
    raise ValueError(f"layout {layout!r}: expected one of {', '.join(ADVERSARIAL)}")


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
