"""Writing inside a folder dataguard owns without ever following a link out of it.

A user (or an attacker with write access to a shared folder) can plant a symbolic link where
dataguard is about to write: ``RUN/metrics.jsonl -> ~/.bashrc`` or ``OUT/_work/seg01 -> /etc``.
Following it would overwrite or truncate a file dataguard never wrote. So:

* `find_link` walks a folder (never through a link) and names the first link at any depth:
  output and run folders are checked once when they are claimed;
* every later write opens its file with ``O_NOFOLLOW`` (appends included) or writes a fresh
  temporary file (``O_EXCL | O_NOFOLLOW``) and renames it over the target; a link at the
  target is refused, never replaced, so the race between the check and the write is closed.

`disk_full` tells whether a failed write was a full disk, whichever library wrapped the
``ENOSPC`` (torch raises a ``RuntimeError`` from C++, safetensors its own error).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Below this much free space a failed write is taken to be the full disk it most likely is.
_LOW_SPACE = 16 * 1024 * 1024


class LinkRefused(OSError):
    """A write that would have gone through a symbolic link (the message names the link)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(errno.ELOOP, f"{os.fspath(path)} is a link; dataguard never writes through links "
                                      "(remove the link or choose another folder)")

    def __str__(self) -> str:
        return str(self.strerror)


def find_link(root: str | os.PathLike) -> Path | None:
    """The first symbolic link inside ``root`` (sorted walk, links never entered), or None."""
    root = Path(root)
    if root.is_symlink():
        return root
    if not root.is_dir():
        return None
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                return Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return None


def open_nofollow(path: str | os.PathLike, mode: str = "a") -> IO[Any]:
    """``open(path, mode)`` for writing ("w", "a", "wb", "ab") that refuses a link at ``path``."""
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        raise
    if "b" in mode:
        return os.fdopen(fd, mode)
    return os.fdopen(fd, mode, encoding="utf-8")


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``path`` through a fresh temporary file and a rename; refuse a link at ``path``."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_writer(path) as fh:
        fh.write(raw)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, *, durable: bool = True) -> Iterator[IO[bytes]]:
    """A binary handle on a fresh temporary file beside ``path`` (``O_EXCL | O_NOFOLLOW``),
    fsynced and renamed onto ``path`` when the block ends, removed if it raises: for files
    streamed in pieces (Arrow writers, ``torch.save``) that `write_atomic` would need whole.
    A link at ``path`` is refused. ``durable=False`` skips the fsync, for scratch files a
    crash makes worthless anyway."""
    path = Path(path)
    if path.is_symlink():
        raise LinkRefused(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
    except FileExistsError:  # left by a killed process of ours with the same pid: a plain file only
        if tmp.is_symlink() or not tmp.is_file():
            raise LinkRefused(tmp) from None
        tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def disk_full(exc: BaseException, folder: str | os.PathLike) -> bool:
    """Whether a failed write into ``folder`` was a full disk (or quota)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return True
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(folder).free < _LOW_SPACE
    except OSError:
        return False


def no_space_error(folder: str | os.PathLike) -> OSError:
    """The one ``ENOSPC`` error every command reports the same way (see `cli_common.os_message`)."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(folder))
