"""Build raw CUDA sources into a shared library with nvcc, cached by content, loaded with ctypes.

The cache key is the sha256 of every source's bytes, the flags and ``nvcc --version``, so an edited
source (a bug-zoo mutant, say) gets its own library and a stale one is never loaded. The cache lives
in ``$HARNESS_CUDA_CACHE`` or ``~/.cache/harness-cuda``. Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_FLAGS = ("-O3", "-arch=sm_90", "--shared", "-Xcompiler", "-fPIC")

_lock = threading.Lock()
# seconds spent in nvcc per library path, for reports (0.0: came from the cache)
build_seconds: dict[str, float] = {}


def nvcc_path() -> str | None:
    """The nvcc to use: on PATH, else under $CUDA_HOME / $CUDA_PATH / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


@functools.cache
def nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def cache_dir() -> Path:
    d = Path(os.environ.get("HARNESS_CUDA_CACHE") or Path.home() / ".cache" / "harness-cuda")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _require_nvcc() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found (not on PATH, $CUDA_HOME or /usr/local/cuda)")
    return nvcc


def _run_nvcc(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed on {what} (exit {proc.returncode}):\n{' '.join(cmd)}\n"
                           f"{proc.stderr}{proc.stdout}")


def library_path(sources: Sequence[str | Path], flags: Sequence[str] = DEFAULT_FLAGS,
                 name: str = "kernels") -> Path:
    """Compile ``sources`` into one shared library unless the cache already holds it; its path."""
    nvcc = _require_nvcc()
    h = hashlib.sha256()
    for src in sources:
        h.update(Path(src).name.encode() + b"\0" + Path(src).read_bytes() + b"\0")
    h.update("\0".join(flags).encode() + b"\0" + nvcc_version(nvcc).encode())
    out = cache_dir() / f"{name}-{h.hexdigest()[:20]}.so"
    with _lock:
        if out.exists():
            build_seconds.setdefault(str(out), 0.0)
            return out
        # build beside the target and rename: concurrent processes never load a half-written file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            t0 = time.perf_counter()
            _run_nvcc([nvcc, *flags, "-o", tmp, *map(str, sources)], ", ".join(map(str, sources)))
            build_seconds[str(out)] = time.perf_counter() - t0
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


def load(sources: Sequence[str | Path], flags: Sequence[str] = DEFAULT_FLAGS,
         name: str = "kernels") -> ctypes.CDLL:
    """Compile (cached) and load ``sources`` as one shared library."""
    return ctypes.CDLL(str(library_path(sources, flags, name)))


class Launchers:
    """A backend's shared library, compiled and loaded on first use, its extern "C" functions typed.

    ``signatures`` maps each function to its ctypes argument types (restype int: a cudaError_t or 0,
    unless ``restypes`` says otherwise); ``errors`` names the function that turns a code into a message
    (restype char*).
    """

    def __init__(self, sources: Sequence[str | Path], flags: Sequence[str], name: str,
                 signatures: dict[str, list], errors: str, restypes: dict[str, Any] | None = None):
        self.sources, self.flags, self.name = tuple(sources), tuple(flags), name
        self.signatures, self.errors, self.restypes = signatures, errors, restypes or {}
        self._so: ctypes.CDLL | None = None

    def lib(self) -> ctypes.CDLL:
        if self._so is None:
            so = load(self.sources, self.flags, name=self.name)
            for fn, args in self.signatures.items():
                getattr(so, fn).argtypes = args
                getattr(so, fn).restype = self.restypes.get(fn, ctypes.c_int)
            getattr(so, self.errors).argtypes = [ctypes.c_int]
            getattr(so, self.errors).restype = ctypes.c_char_p
            self._so = so
        return self._so

    def check(self, code: int, what: str) -> None:
        """Raise RuntimeError with the library's own message when a launcher returned an error."""
        if code != 0:
            msg = getattr(self.lib(), self.errors)(code).decode()
            raise RuntimeError(f"{self.name} CUDA {what} failed: {msg} (code {code})")


def compile_only(paths: Sequence[str | Path], arch: str = "sm_90", flags: Sequence[str] = ("-O3",)) -> None:
    """Compile each .cu to an object file and throw it away; raises RuntimeError with nvcc's output."""
    nvcc = _require_nvcc()
    with tempfile.TemporaryDirectory() as tmp:
        for i, src in enumerate(paths):
            obj = os.path.join(tmp, f"{i}.o")
            _run_nvcc([nvcc, *flags, f"-arch={arch}", "-Xcompiler", "-fPIC", "-c", "-o", obj, str(src)],
                      str(src))
