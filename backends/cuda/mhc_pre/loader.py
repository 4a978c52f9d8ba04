"""Compile mhc_pre.cu once (nvcc, cached by source hash) and expose its launchers via ctypes.

The sources are found next to this file, so a bug-zoo mutant (a patched copy of this package)
compiles its own patched kernel.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from harness.tools import cuda_build

CU_SOURCES: tuple[Path, ...] = (Path(__file__).with_name("mhc_pre.cu"),)
NVCC_FLAGS: tuple[str, ...] = cuda_build.DEFAULT_FLAGS

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# mhc_fwd's answer where the token row does not fit a cluster's shared memory
UNSUPPORTED = -1

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_LAUNCHERS = cuda_build.Launchers(CU_SOURCES, NVCC_FLAGS, "mhc_pre", {
    "mhc_fwd": [_P, _I32, _I64, _I64, _I32, _I64, _I64, _I64, _I64, _I64, _P, _I32, _P, _P, _P, _F32, _F32, _F32,
                _P, _P, _P, _P, _P, _P, _P, _P],
    "mhc_plan": [_I32, _I32, _I64, _I64, _P],
    "mhc_wfrag_bytes": [_I32, _I64],
    "mhc_tune": [_I32, _I32, _I32, _I32],
}, errors="mhc_error_string", restypes={"mhc_wfrag_bytes": _I64})
# the loaded library (compiled on first use), and an exception with CUDA's message for a failed launch
lib = _LAUNCHERS.lib
check = _LAUNCHERS.check
