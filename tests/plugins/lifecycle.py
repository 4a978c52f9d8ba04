"""Backends for the worker-lifecycle tests (tests/test_worker_lifecycle.py): kernels that hang, spin, or start
processes of their own, each noting what it is to the file named by $LIFECYCLE_PIDS, one line per call:
``<backend> <worker pid> <worker pgid> <child pid or 0> <time>``."""

import os
import subprocess
import sys
import time

from harness.backends.golden.mhc_pre import backward, forward

from harness import Backend, register_backend


def _note(name: str, child: subprocess.Popen | None = None) -> None:
    path = os.environ.get("LIFECYCLE_PIDS")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {os.getpid()} {os.getpgid(0)} {child.pid if child else 0} {time.time():.3f}\n")


def _child() -> subprocess.Popen:
    """A process of the kernel's own (a compiler, a server), as long-lived as a kernel's helper can be; its
    output not the run's (it would hold the run's stdout open)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _hangs(**kw):
    _note("hangs")
    time.sleep(3600)


def _spins(**kw):
    """A child, then a tight Python loop: no blocking call for a signal to interrupt."""
    _note("spins", _child())
    n = 0
    while True:
        n += 1


def _blocks(**kw):
    """A child, then a blocking C call: read(2) on a pipe nobody writes to."""
    _note("blocks", _child())
    r, _w = os.pipe()
    os.read(r, 1)


def _spawns(x, phi, alpha, bias, gamma=None, **kw):
    """A child left running, and a correct result."""
    _note("spawns", _child())
    return forward(x, phi, alpha, bias, gamma, **kw)


def _spawns_hangs(**kw):
    _note("spawns-hangs", _child())
    time.sleep(3600)


for name, impl, bwd, dtypes in [("hangs", _hangs, None, ("float32", "float16")),
                                ("spins", _spins, None, ("float32",)),
                                ("blocks", _blocks, None, ("float16",)),
                                ("spawns", _spawns, backward, ("float32", "float16")),
                                ("spawns-hangs", _spawns_hangs, None, ("float32", "float16"))]:
    register_backend(Backend(operator="mhc_pre", name=name, impl=impl, backward=bwd, devices=("cpu", "cuda"),
                             dtypes=dtypes, sources=(__file__,)))
