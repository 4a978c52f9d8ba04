"""The command line's argument types: a bad value is one line naming the argument and what was expected,
exit 2 (``harness <cmd>: error: ...``), never a traceback. Shared by `harness` and `harness check`."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any

from ..model.devices import parsed_device
from ..model.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (``harness run: error: argument --timeout: ...``),
    exit 2, without the usage block (``--help`` shows that)."""

    def error(self, message: str):  # type: ignore[override]
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # "argument --device: --device 'gpu': ..."
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind: type, text: str, ok: Any, expected: str) -> Any:
    try:
        v = kind(text)
    except ValueError:
        v = None
    if v is None or not ok(v):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return v


def seconds(text: str) -> float:
    """A time limit: seconds, finite and above 0."""
    return _number(float, text, lambda v: 0 < v < math.inf, "a number of seconds above 0")


def budget(text: str) -> float:
    """A time budget: seconds, finite and at least 0 (0: none)."""
    return _number(float, text, lambda v: 0 <= v < math.inf, "a number of seconds, 0 or more")


def at_least(n: int):
    """A whole number >= n."""
    def check(text: str) -> int:
        return _number(int, text, lambda v: v >= n, f"a whole number >= {n}")

    return check


def growth(text: str) -> float:
    return _number(float, text, lambda v: 1 < v < math.inf, "a growth factor above 1 (1.5: a ratio grown by half)")


def fraction(text: str) -> float:
    return _number(float, text, lambda v: 0 <= v <= 1, "a fraction from 0 to 1")


def device_arg(text: str) -> str:
    try:
        return parsed_device(text) or text
    except UsageError as e:  # "--device 'gpu': expected cpu, cuda (every visible GPU) or cuda:N"
        raise argparse.ArgumentTypeError(str(e)) from None


def plugin_arg(text: str) -> str:
    """An adapter file or an importable module's name; a folder or nothing is refused here, a file that does
    not exist or does not load when it is loaded (registry.load_plugin names file and line)."""
    if not text.strip() or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"expected an adapter file (path/to/adapter.py) or a module "
                                         f"(package.module), got {'a folder' if text.strip() else 'nothing'}: {text!r}")
    return text


def existing_report(text: str) -> str:
    """A report folder that exists and holds records (``harness report --add``)."""
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such folder; expected a report folder that `harness run` "
                                         "wrote")
    if not any(any(p.glob(g)) for g in ("*/*.jsonl", "*/*.jsonl.gz")):
        raise argparse.ArgumentTypeError(f"{text!r} holds no cell records (no <device-class>/<operator>.jsonl); "
                                         "expected a report folder that `harness run` wrote")
    return text


def report_arg(text: str) -> str:
    """A folder for reports: absent (created) or a folder; a file, or a path through a file, is refused."""
    p = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got nothing")
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; expected a folder for the reports")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text!r}: {parent} is a file; expected a folder for the reports")
            break
    return text
