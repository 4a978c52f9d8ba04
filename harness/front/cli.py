"""`harness` command line: run, list, report, mutants, bench, repro, check.

The options are harness/front/parser.py's; `harness run` is harness/front/run_command.py, `harness check`
harness/front/check.py, the other commands harness/front/commands.py. Here: the entry point (the console
script `harness` and `python -m harness`), and how it ends: the exit status, and for a bug of the harness
one line on stderr and the trace in a file."""

from __future__ import annotations

import logging
import os
import select
import shlex
import sys
import tempfile
import traceback
from datetime import datetime
from pathlib import Path

from ..model.errors import CannotRunHere, UsageError
from ..store.reports import HARNESS_DIR, ensure_harness_dir
from .parser import parser

EX_SOFTWARE = 70  # an exception the harness did not expect: a bug in it (sysexits.h), one line and a trace file
EX_SIGPIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose output pipe was closed


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(a.fn(a))
    except UsageError as e:
        print(f"harness {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except CannotRunHere as e:
        print(f"harness {a.cmd}: {e}", file=sys.stderr)
        return 3
    except BrokenPipeError as e:
        if stdout_closed():  # `harness ... | head`: the reader left, as SIGPIPE ends other commands
            return EX_SIGPIPE
        return internal_error(a.cmd, e, sys.argv[1:] if argv is None else argv)
    except Exception as e:  # noqa: BLE001 - a bug of the harness (KeyboardInterrupt, SystemExit pass through)
        return internal_error(a.cmd, e, sys.argv[1:] if argv is None else argv)


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on its write end); if so
    it is pointed at /dev/null, so that the interpreter's last flush at exit does not fail again."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        gone = any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no file behind stdout (captured), or no poll here
        return False
    if gone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return gone


def internal_error(cmd: str, e: BaseException, argv: list[str] | None = None) -> int:
    """One line on stderr naming the exception and the file that holds its full trace; exit 70."""
    trace = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    command = " ".join(shlex.quote(x) for x in ["harness", *(argv if argv is not None else [cmd])])
    text = (f"harness {cmd}: internal error (a bug in the harness, not in the kernel under test)\n"
            f"command: {command}\ntime: {datetime.now().isoformat(timespec='seconds')}\n\n{trace}")
    path = _write_trace(text)
    msg = " ".join(str(e).split())
    msg = msg if len(msg) <= 300 else msg[:297] + "..."
    what = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    where = f"full trace in {path}" if path else "the full trace could not be written to a file"
    print(f"harness {cmd}: internal error: {what} ({where})", file=sys.stderr)
    return EX_SOFTWARE


def _write_trace(text: str) -> Path | None:
    """``.harness/internal-error-<timestamp>.txt`` under the current folder, else in the temporary folder."""
    name = f"internal-error-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}.txt"
    for folder in (Path(HARNESS_DIR), Path(tempfile.gettempdir())):
        try:
            folder = folder.absolute()  # the current folder may be gone: then the temporary one
            ensure_harness_dir(folder)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
            return folder / name
        except OSError:
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())
