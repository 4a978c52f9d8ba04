"""What the Liger-Kernel adapters share: whether the package is there (found, never imported here), which release
it is, the files of its kernels (their digests go into each record, so that ``--compare`` sees an upgrade).

Liger's normalization and activation kernels fail under TRITON_INTERPRET=1 (liger-kernel 0.8.5, triton 3.9:
AttributeError "'float' object has no attribute 'to'" in RMSNorm, its fused add, LayerNorm and SwiGLU; TypeError
in GEGLU): their backends declare the GPU only. The cross-entropies and RoPE run interpreted on a CPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from harness import Gap

PACKAGE = "liger_kernel"


def installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def release() -> str:
    """The installed release, as its metadata names it ("unknown" for a source tree without it)."""
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def kernel_files(*names: str) -> tuple[str, ...]:
    """Liger's own files (liger_kernel/ops/<name>) that define a backend, for its provenance."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return ()
    ops = Path(next(iter(spec.submodule_search_locations))) / "ops"
    return tuple(str(ops / n) for n in names if (ops / n).is_file())


def description(what: str) -> str:
    return f"Liger-Kernel's {what}"


def origin() -> str:
    return f"liger-kernel {release()}"


# Semantics Liger's cross-entropies share (softmax_xent, fused_linear_xent), declared as gaps of both; the
# ceilings are the worst ratios measured (docs/kernels/liger.md) with about 2x room
# a confident row's loss, ~1e-10 against a bound of its own size, rounds to 0: up to 3.59e6x (softmax_xent fp32,
# H200), as eager torch's (backends/torch/softmax_xent.py, ceiling 1e7)
CONFIDENT_LOSS = Gap("Liger forms a row's loss as lse - z_y: a confident row's loss log1p(r) ~ 1e-10 rounds to 0 "
                     "(no log1p)", components=("loss",), tags=("confident",), ceiling=1e7, range_errors=True)
EMPTY_MEAN = Gap("Liger's mean over no valid token is 0, where torch's (and the oracle's) is 0/0 = NaN",
                 components=("loss",), tags=("nan-mean",), ceiling=2.0, range_errors=True)
