"""Registering the in-tree operators and backends imports no kernel code: no triton, no TileLang, no kernel
or wrapper module. The interpreter is chosen before Triton kernels are first decorated (`harness bench
--device cpu` sets TRITON_INTERPRET in-process), and a module under backends/<impl>/ that is not an adapter
must not be imported as one: the Triton norms' row plan was, before its name began with an underscore; it
imported triton, and every interpreted Triton bench then failed with "Cannot call @triton.jit'd outside of
the scope of a kernel"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, sys
from harness.model import registry
registry.discover()
kernel_code = sorted(m for m in sys.modules if m.startswith("harness.backends.") and m.rsplit(".", 1)[-1] in
                     ("kernels", "wrapper", "loader", "aot") or m.split(".")[0] in ("triton", "tilelang"))
print(json.dumps({"imported": kernel_code, "backends": len(registry.backends("rmsnorm"))}))
"""


def test_discovery_imports_no_kernel_code():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["backends"] >= 2  # it did register something
    assert out["imported"] == [], f"discovery imported kernel code: {out['imported']}"
