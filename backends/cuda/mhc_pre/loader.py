"""Compile mhc_pre.cu once (nvcc, cached by source hash) and expose its launchers via ctypes.

The sources are found next to this file, so a bug-zoo mutant (a patched copy of this package)
compiles its own patched kernel.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from harness import cuda_build

CU_SOURCES: tuple[Path, ...] = (Path(__file__).with_name("mhc_pre.cu"),)
NVCC_FLAGS: tuple[str, ...] = cuda_build.DEFAULT_FLAGS

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# mhc_fwd's answer where the token row does not fit a cluster's shared memory
UNSUPPORTED = -1

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "mhc_fwd": [_P, _I32, _I64, _I64, _I32, _I64, _I64, _I64, _I64, _I64, _P, _I32, _P, _P, _P, _F32, _F32, _F32,
                _P, _P, _P, _P, _P, _P, _P, _P],
    "mhc_wfrag_bytes": [_I32, _I64],
    "mhc_tune": [_I32, _I32, _I32, _I32],
    "mhc_error_string": [_I32],
}

_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """The loaded library (compiled on first use)."""
    global _lib
    if _lib is None:
        so = cuda_build.load(CU_SOURCES, NVCC_FLAGS, name="mhc_pre")
        for fn, args in _SIGNATURES.items():
            getattr(so, fn).argtypes = args
            getattr(so, fn).restype = ctypes.c_int
        so.mhc_error_string.restype = ctypes.c_char_p
        so.mhc_wfrag_bytes.restype = ctypes.c_int64
        _lib = so
    return _lib


def check(code: int, what: str) -> None:
    """Raise RuntimeError with CUDA's own message when a launcher returned an error."""
    if code != 0:
        msg = lib().mhc_error_string(code).decode()
        raise RuntimeError(f"mhc_pre CUDA {what} failed: {msg} (code {code})")
