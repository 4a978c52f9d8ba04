"""Registration of the raw CUDA softmax_xent backend (no torch or nvcc work at import)."""

from __future__ import annotations

from pathlib import Path

from harness import Backend, register_backend

_HERE = Path(__file__).parent
# threads per block of the row kernels (g_block in softmax_xent.cu); the seed bug (blockDim = V)
# bites at V > 1024
BLOCK_V = 256

register_backend(Backend(
    operator="softmax_xent", name="cuda", impl=".wrapper:softmax_xent_cuda", package=__package__,
    devices=("cuda",), requires=(), dtypes=("float32", "bfloat16", "float16"),
    blocks={"BLOCK_V": BLOCK_V},
    sources=tuple(str(_HERE / f) for f in ("softmax_xent.cu", "loader.py", "wrapper.py")),
    deterministic=True,
    description="raw CUDA (nvcc, ctypes): one block per row, online softmax with a warp-uniform running "
                "max, dlogits for g=1 written in the forward from a re-read of the row, recomputed in the "
                "backward only when g != 1; fixed-order reductions, no float atomics"))
