"""Registers the CUDA backend of ``mhc_pre`` (no torch, triton or nvcc work at import)."""

from pathlib import Path

from harness import Backend, register_backend

_HERE = Path(__file__).parent
_TRITON = _HERE.parent.parent / "triton" / "mhc_pre"

register_backend(Backend(
    operator="mhc_pre", name="cuda", impl=".wrapper:forward_saved", backward=".wrapper:backward_saved",
    package=__package__,
    devices=("cuda",), requires=("triton",), dtypes=("float32", "bfloat16", "float16"),
    # the backward is the Triton backend's: its dx / dphi tiles (wrapper.GPU_CONFIG there)
    blocks={"BLOCK_ND": 128, "BLOCK_T": 32},
    sources=tuple(str(_HERE / f) for f in ("mhc_pre.cu", "loader.py", "wrapper.py", "adapter.py"))
    + tuple(str(_TRITON / f) for f in ("kernels.py", "wrapper.py")),
    deterministic=True, matmul_precision="ieee",
    description="raw CUDA forward reading x once: a thread-block cluster splits each token block's row, "
                "MMAs on exact bf16 parts, partial sums met through distributed shared memory, h_in from "
                "the tile held on chip (rows too long for it: the Triton forward); the Triton backward"))
