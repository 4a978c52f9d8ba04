"""Registers the Gluon backends of ``softmax_xent`` (no triton or torch.cuda import here)."""

from __future__ import annotations

from harness import Backend, ContractException, register_backend

_DIR = "backends/gluon/softmax_xent/"
_SOURCES = tuple(_DIR + f for f in ("kernels.py", "wrapper.py", "adapter.py"))
# columns per ring slot for 16-bit logits (wrapper.CONFIG; float32 slots hold 4096): the unit along V in
# which the report locates errors (the local rule judges in tiles of at most 1024 columns whatever this says)
BLOCK_V = 8192


def hopper_only(case, dtype: str, device: str) -> str | None:
    """TMA and mbarriers need sm_90 or later: on an older GPU the cell is SKIP with that reason."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():  # planned here, run elsewhere: the worker's GPU decides
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return None if major >= 9 else f"needs sm_90 or later (TMA, mbarrier); this GPU is sm_{major}{minor}"


register_backend(Backend(
    operator="softmax_xent", name="gluon", impl=".wrapper:softmax_xent_gluon", package=__package__,
    devices=("cuda",), requires=("triton",), dtypes=("float32", "bfloat16", "float16"),
    blocks={"BLOCK_V": BLOCK_V}, sources=_SOURCES, deterministic=True, skip=hopper_only,
    description="Gluon (sm_90): one persistent program per SM streams its rows through a ring of 16 KB "
                "slots that a producer warp fills by TMA, the statistics pass and the dlogits pass of a row "
                "back to back (the second read meant to hit L2); dlogits for g=1 written in the forward, recomputed "
                "in the backward only when g != 1 (checked on the device); per-lane online (max, sum) with "
                "one exponential per element; fixed-order reductions, no atomics"))

# As cuda-inplace (issue 31): for training loops that drop the logits after the loss, no dlogits buffer.
register_backend(Backend(
    operator="softmax_xent", name="gluon-inplace", impl=".wrapper:softmax_xent_gluon_inplace",
    package=__package__, devices=("cuda",), requires=("triton",), dtypes=("float32", "bfloat16", "float16"),
    blocks={"BLOCK_V": BLOCK_V}, sources=_SOURCES, deterministic=True, skip=hopper_only,
    contract_exceptions=(ContractException(
        "input-unchanged", "writes dlogits over its logits input by design (no dlogits buffer: for training "
        "loops that drop the logits after the loss)"),),
    description="the gluon backend writing dlogits for g=1 over the logits in the forward; the backward "
                "scales them in place when g != 1 (one more rounding); one backward per forward"))
