"""Registers the example RMSNorm operator and two Triton backends for it.

    harness run --plugin adapter.py --kernel example_rmsnorm --backend example-triton --sizes sweep --device cpu
"""

import kernels  # beside this file: the harness puts a plugin's folder on sys.path
import rmsnorm  # noqa: F401 - registers the operator

from harness import Backend, register_backend

COMMON = dict(operator="example_rmsnorm", devices=("cpu", "cuda"), interpret=True, requires=("triton",),
              # the feature axis is localized per kernel block (OperatorSpec.dim_blocks names BLOCK)
              blocks={"BLOCK": kernels.BLOCK}, sources=(kernels.__file__, rmsnorm.__file__, __file__))

register_backend(Backend(name="example-triton", impl=kernels.rmsnorm, **COMMON))
register_backend(Backend(name="example-triton-wrong", impl=kernels.rmsnorm_last_block_dw,
                         description="dw keeps only the last feature block (store after the loop)", **COMMON))
