"""TF32 matmuls, explicitly: the floor reference of a backend that declares ``matmul_precision="tf32"``.

What a tensor core does with float32 matrices in TF32 mode: each multiplied operand is reduced to TF32
(float32's sign and 8-bit exponent, 10 explicit mantissa bits instead of 23), the products of two such
values are formed exactly (11 x 11 significand bits fit in float32's 24), and the products are summed in
float32. Only the operands lose precision; an added matrix (the ``self``/bias of ``addmm``, the C of
C + A @ B) never goes through the multiplier and stays float32, as do the results.

:class:`TF32Matmuls` reproduces that on any device. While it is active, every matrix-multiply aten op
(``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``addbmm``, ``addmv``, ``mv``, ``dot``, ``vdot``,
``_addmm_activation``; ``matmul``, ``einsum``, ``tensordot`` and ``F.linear`` are composite and reach the
dispatcher as these) has its float32 multiplied operands reduced to TF32 by :func:`round_tf32`, then runs
in plain float32 with float32 accumulation. The reduction is integer arithmetic on the float32 bits (NaN
and Inf kept), so the CPU and every GPU give the same bits; the result does not depend on
``torch.backends.cuda.matmul.allow_tf32`` or on cuBLAS's choice of kernel, and the harness keeps
``allow_tf32`` off under the mode so that nothing is reduced twice. It is a ``TorchDispatchMode``, below
autograd, so the matmuls that autograd runs in a backward are reduced too (the saved float32 operands
are reduced again when the backward multiplies them, as a TF32 kernel's backward GEMMs would); on a GPU
that backward runs in the autograd engine's device thread, which inherits the mode.

Which reduction: the two that TF32 kernels use. Measured on an H100 (torch 2.11, triton 3.6), C = A @ I
with A uniform in +-[1, 2) (65536 values): Triton's ``tl.dot(..., input_precision="tf32")`` gave the
truncated A for every element (``"rz"``: the low 13 bits dropped; the tensor core ignores them), with
32x32x32 (both operands), 64x64x32, 128x128x32 and 64x128x64 tiles; cuBLAS with ``allow_tf32=True``
gave A rounded to nearest, ties to even (``"rne"``) for every element. Truncation errs up to twice as
far and always towards zero, so a Triton TF32 kernel measured against a round-to-nearest floor failed
by 1.0x to 2.6x on the GPU (harness/measure/oracle.py says which one the floor takes, and why).

The reference code that the mode is used on (``references/*.py``) multiplies with ``@``/``matmul``
(lazy_attention: q k^T and e v; fused_linear_xent: hidden weight^T; mhc_pre: X phi^T), which reach
the dispatcher as ``mm``/``bmm``; none calls ``scaled_dot_product_attention``. The mode raises on the
fused attention ops (``_scaled_dot_product_*``, ``_flash_attention_*``, ``_efficient_attention_*``),
whose internal GEMMs it could not reach, rather than let them run at full float32 precision unnoticed.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Tensor = torch.Tensor

TF32_MANTISSA_BITS = 10
EPS_TF32 = 2.0**-TF32_MANTISSA_BITS  # spacing of TF32 values in [1, 2); unit roundoff is half of it
_DROP = 23 - TF32_MANTISSA_BITS  # float32 mantissa bits that TF32 drops: 13
_HALF = (1 << (_DROP - 1)) - 1  # 0x0FFF: just under half of the dropped range
_KEEP = -(1 << _DROP)  # 0xFFFFE000 as int32: sign, exponent and the 10 kept mantissa bits
_EXP = 0x7F800000  # all ones: Inf or NaN

aten = torch.ops.aten
# op -> names of the operands that go through the multiplier (never an added input such as addmm's self)
MULTIPLIED: dict[object, tuple[str, ...]] = {
    aten.mm: ("self", "mat2"),
    aten.bmm: ("self", "mat2"),
    aten.addmm: ("mat1", "mat2"),
    aten._addmm_activation: ("mat1", "mat2"),
    aten.baddbmm: ("batch1", "batch2"),
    aten.addbmm: ("batch1", "batch2"),
    aten.addmv: ("mat", "vec"),
    aten.mv: ("self", "vec"),
    aten.dot: ("self", "tensor"),
    aten.vdot: ("self", "other"),
    aten.matmul: ("self", "other"),  # composite: only reached if a backend registers it directly
}
ROUNDINGS = ("rne", "rz")
_UNREACHABLE = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")


def round_tf32(x: Tensor, rounding: str = "rne") -> Tensor:
    """``x`` (float32) reduced to TF32, NaN and Inf unchanged; a new float32 tensor of the same shape,
    detached. Other dtypes are returned as they are.

    ``rounding="rne"``: to nearest, ties to even (cuBLAS's TF32; values that round past the largest
    finite TF32 value become Inf, as IEEE rounding says). ``"rz"``: towards zero, the 13 low mantissa
    bits dropped (what the tensor core does with the float32 bits that Triton's TF32 ``tl.dot`` feeds it).
    """
    if x.dtype != torch.float32:
        return x
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r}: expected one of {ROUNDINGS}")
    b = x.detach().view(torch.int32)
    if rounding == "rne":
        # add just under half an ulp of TF32, plus one when the kept part is odd (ties go to even), then
        # drop the 13 low bits; the carry may run into the exponent, which is the correct rounding up.
        # On the int32 view this is the same bit arithmetic for negative values (two's complement add).
        r = (b + (_HALF + ((b >> _DROP) & 1))) & _KEEP
    else:
        r = b & _KEEP
    finite = (b & _EXP) != _EXP
    return torch.where(finite, r, b).view(torch.float32)


def _positions(func: torch._ops.OpOverload, names: tuple[str, ...]) -> list[int]:
    args = func._schema.arguments
    return [i for i, a in enumerate(args) if a.name in names and not a.kwarg_only]


class TF32Matmuls(TorchDispatchMode):
    """While active, float32 matrix multiplies reduce their multiplied operands to TF32 by ``rounding``
    (:func:`round_tf32`) and compute in float32 (module docstring)."""

    def __init__(self, rounding: str = "rne") -> None:
        super().__init__()
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding={rounding!r}: expected one of {ROUNDINGS}")
        self.rounding = rounding
        self.rounded_calls = 0  # how many matmul ops had float32 operands reduced (for tests and notes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        names = MULTIPLIED.get(func.overloadpacket)
        if names is None:
            if any(s in func.__name__ for s in _UNREACHABLE):
                raise NotImplementedError(
                    f"{func}: a fused attention op under TF32Matmuls; its GEMMs cannot be reduced "
                    "to TF32 from outside (write the reference with explicit matmuls)")
            return func(*args, **kwargs)
        args = list(args)
        hit = False
        for i in _positions(func, names):
            if i < len(args) and isinstance(args[i], Tensor) and args[i].dtype == torch.float32:
                args[i] = round_tf32(args[i], self.rounding)
                hit = True
        for n in names:
            if isinstance(kwargs.get(n), Tensor) and kwargs[n].dtype == torch.float32:
                kwargs = {**kwargs, n: round_tf32(kwargs[n], self.rounding)}
                hit = True
        self.rounded_calls += hit
        return func(*args, **kwargs)
