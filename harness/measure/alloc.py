"""NaN-poisoned allocations with guard bands, for backends that allocate their own buffers.

While a backend runs, ``torch.empty``, ``torch.empty_like``, ``torch.empty_strided`` and
``Tensor.new_empty`` called from Python return views into a larger buffer: the view is filled
with NaN (integers with their max value), and guard bands before and after it hold a recorded
pattern. An element the kernel never writes stays NaN and fails the verdict as "non-finite"; a
write past either end changes a guard band and fails the contract.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch

GUARD = 256  # elements on each side


def _poison_value(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _guard_fill(buf: torch.Tensor) -> None:
    if buf.dtype.is_floating_point:
        buf.fill_(-7.75)
    elif buf.dtype == torch.bool:
        buf.fill_(True)
    else:
        buf.fill_(0x5A)


def _shape_of(size: tuple[Any, ...]) -> tuple[Any, ...]:
    """The shape of ``torch.empty(2, 3)`` and of ``torch.empty((2, 3))`` alike."""
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)


def _dense(t: torch.Tensor) -> bool:
    """Strides are a permutation of a contiguous layout (what preserve_format keeps)."""
    expected = 1
    for st, sz in sorted(zip(t.stride(), t.shape, strict=True)):
        if sz != 1 and st != expected:
            return False
        expected *= sz
    return True


class PoisonedAllocations:
    """Context manager; ``violations()`` lists guard bands that changed."""

    def __init__(self, guard: int = GUARD):
        self.guard = guard
        self.records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, str, str]] = []
        self.count = 0

    def _alloc(
        self,
        shape: tuple[int, ...],
        stride: tuple[int, ...] | None,
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool = False,
        pin: bool = False,
    ) -> torch.Tensor:
        numel_storage = 1
        if stride is None:
            n = 1
            for s in shape:
                n *= s
            numel_storage = n
        else:
            numel_storage = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) if all(shape) else 0
        g = self.guard
        buf = self._orig_empty(numel_storage + 2 * g, dtype=dtype, device=device)
        _guard_fill(buf[:g])
        _guard_fill(buf[g + numel_storage :])
        body = buf[g : g + numel_storage]
        body.fill_(_poison_value(dtype))
        view = body.view(shape) if stride is None else body.as_strided(shape, stride)
        frames = [f for f in traceback.extract_stack(limit=8) if not f.filename.endswith("alloc.py")]
        site = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
        self.records.append(
            (
                buf,
                buf[:g].clone(),
                buf[g + numel_storage :].clone(),
                f"{list(shape)} {str(dtype).replace('torch.', '')}",
                site,
            )
        )
        self.count += 1
        if requires_grad:
            view.requires_grad_(True)
        return view

    def __enter__(self) -> PoisonedAllocations:
        self._keep_originals()
        self._install_hooks()
        return self

    def _keep_originals(self) -> None:
        """The allocators as they are now: what the hooks fall back on, what _alloc allocates its padded
        buffers with (the hook would recurse) and what __exit__ puts back."""
        self._orig_empty = torch.empty
        self._orig_empty_like = torch.empty_like
        self._orig_empty_strided = torch.empty_strided
        self._orig_new_empty = torch.Tensor.new_empty

    def _install_hooks(self) -> None:
        """Replace the four allocators with hooks into _alloc (the four that __exit__ puts back)."""
        torch.empty = self._empty_hook()
        torch.empty_like = self._empty_like_hook()
        torch.empty_strided = self._empty_strided_hook()
        torch.Tensor.new_empty = self._new_empty_hook()

    # The hooks stay in this file: _alloc names the allocating line as the innermost frame outside alloc.py,
    # so a hook defined in another module would be named instead of the backend's line.

    def _empty_hook(self) -> Callable[..., torch.Tensor]:
        """torch.empty: poisoned for a plain dense tensor; what it cannot lay out (out=, another layout or
        memory format, arguments it does not know) goes to the original."""
        outer = self

        def empty(
            *size: Any,
            out: Any = None,
            dtype: Any = None,
            layout: Any = None,
            device: Any = None,
            requires_grad: bool = False,
            pin_memory: bool = False,
            memory_format: Any = None,
            **kw: Any,
        ) -> torch.Tensor:
            if (
                out is not None
                or kw
                or (memory_format not in (None, torch.contiguous_format))
                or (layout not in (None, torch.strided))
            ):
                return outer._orig_empty(
                    *size,
                    out=out,
                    dtype=dtype,
                    layout=layout,
                    device=device,
                    requires_grad=requires_grad,
                    pin_memory=pin_memory,
                    memory_format=memory_format,
                    **kw,
                )
            shape = _shape_of(size)
            dt = dtype or torch.get_default_dtype()
            dev = torch.device(device) if device is not None else torch.get_default_device()
            return outer._alloc(tuple(int(s) for s in shape), None, dt, dev, requires_grad)

        return empty

    def _empty_like_hook(self) -> Callable[..., torch.Tensor]:
        """torch.empty_like: poisoned, in the source's strides where preserve_format keeps a dense permuted
        layout; another layout or unknown arguments go to the original."""
        outer = self

        def empty_like(
            t: torch.Tensor,
            *,
            dtype: Any = None,
            layout: Any = None,
            device: Any = None,
            requires_grad: bool = False,
            memory_format: Any = torch.preserve_format,
            **kw: Any,
        ) -> torch.Tensor:
            dt = dtype or t.dtype
            dev = torch.device(device) if device is not None else t.device
            if kw or layout not in (None, torch.strided):
                return outer._orig_empty_like(
                    t,
                    dtype=dtype,
                    layout=layout,
                    device=device,
                    requires_grad=requires_grad,
                    memory_format=memory_format,
                    **kw,
                )
            if memory_format == torch.preserve_format and _dense(t) and not t.is_contiguous():
                return outer._alloc(tuple(t.shape), tuple(t.stride()), dt, dev, requires_grad)
            return outer._alloc(tuple(t.shape), None, dt, dev, requires_grad)

        return empty_like

    def _empty_strided_hook(self) -> Callable[..., torch.Tensor]:
        """torch.empty_strided: always poisoned, in the strides asked for."""
        outer = self

        def empty_strided(
            size: Any,
            stride: Any,
            *,
            dtype: Any = None,
            layout: Any = None,
            device: Any = None,
            requires_grad: bool = False,
            pin_memory: bool = False,
            **kw: Any,
        ) -> torch.Tensor:
            dt = dtype or torch.get_default_dtype()
            dev = torch.device(device) if device is not None else torch.get_default_device()
            return outer._alloc(tuple(size), tuple(stride), dt, dev, requires_grad)

        return empty_strided

    def _new_empty_hook(self) -> Callable[..., torch.Tensor]:
        """Tensor.new_empty: always poisoned, dtype and device defaulting to the tensor's own."""
        outer = self

        def new_empty(
            self_t: torch.Tensor,
            *size: Any,
            dtype: Any = None,
            device: Any = None,
            requires_grad: bool = False,
            **kw: Any,
        ) -> torch.Tensor:
            shape = _shape_of(size)
            return outer._alloc(
                tuple(int(s) for s in shape),
                None,
                dtype or self_t.dtype,
                torch.device(device) if device is not None else self_t.device,
                requires_grad,
            )

        return new_empty

    def __exit__(self, *exc: object) -> None:
        torch.empty = self._orig_empty
        torch.empty_like = self._orig_empty_like
        torch.empty_strided = self._orig_empty_strided
        torch.Tensor.new_empty = self._orig_new_empty

    def violations(self) -> list[str]:
        out = []
        g = self.guard
        for buf, lo, hi, what, site in self.records:
            n = buf.numel() - 2 * g
            for side, saved, cur in (("before the start", lo, buf[:g]), ("past the end", hi, buf[g + n :])):
                same = (cur == saved) | (torch.isnan(cur) & torch.isnan(saved))
                if not bool(same.all()):
                    first = int((~same).nonzero()[0])
                    off = first - g if side.startswith("before") else first
                    out.append(f"write {side} of a buffer {what} (guard element {off}) allocated at {site}")
        return out

    def owns(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a view into one of the NaN-poisoned buffers handed out (a result the backend
        allocated through the harness: a NaN left in it is an element never written)."""
        try:
            ptr = t.untyped_storage().data_ptr()
        except (AttributeError, RuntimeError):
            return False
        return any(buf.untyped_storage().data_ptr() == ptr for buf, *_ in self.records)

    def release(self) -> None:
        self.records.clear()
