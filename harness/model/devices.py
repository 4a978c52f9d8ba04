"""--device: cpu, cuda (every visible GPU) or cuda:N, checked against this machine."""

from __future__ import annotations

import re

from .errors import CannotRunHere, UsageError


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parsed_device(device: str | None) -> str | None:
    """--device as given, if well formed (cpu, cuda, cuda:N); None stays None (the default is decided where
    the cells run)."""
    if device is not None and device != "cpu" and device != "cuda" and not re.fullmatch(r"cuda:\d+", device):
        raise UsageError(f"--device {device!r}: expected cpu, cuda (every visible GPU) or cuda:N")
    return device


def checked_device(device: str | None) -> str:
    """--device as given (cpu, cuda, cuda:N) or the default; anything else is a usage error, and cuda on a
    machine without a GPU is refused (exit 3) rather than turned into a run of SKIP cells that exits 0."""
    if device is None:
        return default_device()
    parsed_device(device)
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CannotRunHere(f"--device {device}: no CUDA device on this machine (torch "
                                f"{torch.__version__}, torch.cuda.is_available() is False); use --device cpu")
        n = torch.cuda.device_count()
        if ":" in device and int(device.split(":")[1]) >= n:
            raise UsageError(f"--device {device}: this machine has {n} GPU(s), cuda:0 to cuda:{n - 1}")
    return device
