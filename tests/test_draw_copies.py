"""gen_inputs hands every call a copy of the case's pristine draw: a backend that writes its inputs (in place
by design, or by a bug) must not change what later calls, the oracle or other backends' cells on the same
case see. On a GPU, "cuda" (the current device) once compared unequal to the draw's cuda:0, and the
"copy" was the draw itself."""

from __future__ import annotations

import pytest
import torch

from harness.measure.oracle import drawn_inputs, gen_inputs
from harness.model.registry import get_operator
from harness.model.spec import Case

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "pad"])
def test_a_written_copy_leaves_the_draw_and_the_next_copy_alone(device: str, layout: str) -> None:
    op = get_operator("softmax_xent")
    case = Case("copies", {"N": 5, "V": 33, "layout": layout})
    first = gen_inputs(op, case, torch.float32, 0, device).tensors["logits"]
    pristine = drawn_inputs(op, case, torch.float32, 0, device).tensors["logits"]
    assert first.untyped_storage().data_ptr() != pristine.untyped_storage().data_ptr()
    want = pristine.clone()
    first.detach().fill_(7.0)  # what an in-place backend does to its input
    second = gen_inputs(op, case, torch.float32, 0, device).tensors["logits"]
    assert torch.equal(pristine, want) and torch.equal(second, want)
    assert second.stride() == pristine.stride()
