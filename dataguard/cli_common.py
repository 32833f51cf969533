"""What every `dataguard` command shares: exit codes, the one-line error, path checks."""

from __future__ import annotations

import errno
import os
from pathlib import Path

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report as one line with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def os_message(exc: OSError) -> str:
    """'<strerror>: <filename>', plus what to do about a full disk."""
    text = exc.strerror or str(exc)
    if exc.filename is not None:
        text += f": {exc.filename}"
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        text += " (free some space and run again: finished work is kept and resumed)"
    return text


def check_output(output: Path) -> None:
    """Refuse, before any work, an output that cannot be a folder we can write in. (The
    pipeline checks again when it claims the folder; this only makes the message early.)"""
    if output.exists() and not output.is_dir():
        raise CliError(f"output {output}: is a file, not a folder")
    probe = output
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe != output and not probe.is_dir():
        raise CliError(f"output {output}: {probe} is a file, so no folder can be made inside it")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(f"output {output}: permission denied: cannot write in {probe}")
