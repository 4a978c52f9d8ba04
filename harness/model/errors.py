"""The errors a user's request can meet, each with its exit code (docs/faults.md): raised anywhere below the
front doors, turned into one line and an exit code by them."""


class UsageError(Exception):
    """Bad arguments: exit code 2 with the message."""


class CannotRunHere(Exception):
    """The request is well formed but nothing of it can run on this machine (exit 3)."""


class ReportWriteError(UsageError):
    """The report folder cannot be written (a full disk, no permission): exit 2, one line. Not a failing
    cell (1: nothing is known to be wrong with a kernel) and not a bug of the harness (70): what the user
    gave, --report DIR, cannot be used as asked, like a --compare REF that cannot be read. The cells
    recorded before it stay readable in the JSONL."""
