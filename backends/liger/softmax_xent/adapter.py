"""Registers Liger's cross-entropy as ``softmax_xent/liger`` where liger_kernel is installed (docs/kernels/liger.md)."""

from __future__ import annotations

from harness.backends.liger._release import CONFIDENT_LOSS, EMPTY_MEAN, description, installed, kernel_files, origin

from harness import Backend, ContractException, Gap, register_backend

# ceilings: the worst ratios measured (CPU interpreter and an H200, docs/kernels/liger.md) with about 2x room
_LOSS_16BIT = ("Liger returns the loss in the logits' dtype: each row's loss rounded to 16 bits (+-inf where a "
               "z-loss term exceeds float16's range)")
LOSS_16BIT = (
    Gap(_LOSS_16BIT, dtypes=("float16",), components=("loss",), ceiling=3.5e3, range_errors=True),  # 1.74e3x
    Gap(_LOSS_16BIT, dtypes=("bfloat16",), components=("loss",), ceiling=2.5e4),  # 1.06e4x (H200, N128-V1025-none)
)

if installed():
    register_backend(Backend(
        operator="softmax_xent", name="liger", impl=".wrapper:softmax_xent_liger", package=__package__,
        devices=("cpu", "cuda"), interpret=True, requires=("liger_kernel",), origin=origin(),
        sources=(__file__, __file__.replace("adapter.py", "wrapper.py"), *kernel_files("cross_entropy.py")),
        expected_gaps=(CONFIDENT_LOSS, EMPTY_MEAN, *LOSS_16BIT),
        contract_exceptions=(ContractException(
            "input-unchanged", "Liger writes the gradient over the logits in the forward, by design (no dlogits "
            "buffer)"),),
        deterministic=True,
        description=description("liger_cross_entropy (dlogits formed in the forward, written over the logits)")))
