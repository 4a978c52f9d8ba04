"""Compile softmax_xent.cu once (nvcc, cached by source hash) and expose its launchers via ctypes.

The sources are found next to this file, so a bug-zoo mutant (a patched copy of this package)
compiles its own patched kernel.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from harness.tools import cuda_build

CU_SOURCES: tuple[Path, ...] = (Path(__file__).with_name("softmax_xent.cu"),)
NVCC_FLAGS: tuple[str, ...] = cuda_build.DEFAULT_FLAGS

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}

_P, _I64, _I32, _F32, _F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_double
_LAUNCHERS = cuda_build.Launchers(CU_SOURCES, NVCC_FLAGS, "softmax_xent", {
    "xent_forward": [_P, _I32, _I64, _I64, _I64, _P, _I64, _I64, _I32, _I32, _F64, _F32, _F32, _P, _I64,
                     _P, _P, _P, _P, _P],
    "xent_backward": [_P, _I32, _I64, _I64, _I64, _P, _I64, _I64, _F32, _F32, _P, _P, _P, _I64, _I32, _P,
                      _I64, _P],
    "xent_scale": [_P, _I32, _I64, _I64, _I64, _P, _I64, _P],
    "xent_tune": [_I32],
    "xent_tune_cluster": [_I32, _I32],
}, errors="xent_error_string")
# the loaded library (compiled on first use), and an exception with CUDA's message for a failed launch
lib = _LAUNCHERS.lib
check = _LAUNCHERS.check
