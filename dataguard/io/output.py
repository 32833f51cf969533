"""The output folder: prove what dataguard wrote before ever deleting anything.

A user may point ``--output`` at ``.``, at a project folder, or at a folder that holds the
input. dataguard therefore never deletes a file it cannot prove it wrote:

* a new or empty folder gets a ``.dataguard`` marker *before* anything else is written;
* a non-empty folder without that marker is refused, untouched;
* the marker lists every file dataguard writes there (registered before the file is
  written), and cleaning removes exactly those, plus resume files in ``_work/`` whose names
  only dataguard uses; a user's file beside or inside the folder survives every run mode;
* an input that is one of the folder's own files is refused instead of being deleted;
* one run at a time: an exclusive ``flock`` on ``.dataguard.lock`` (released by the
  kernel when the process dies, so a killed run never leaves a stale lock).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dataguard import __version__
from dataguard.io.safe_files import LinkRefused, find_link
from dataguard.io.work_names import WORK, WORK_FILE

MARKER = ".dataguard"
LOCK = ".dataguard.lock"
MARKER_FORMAT = "dataguard-output/1"
# Files the previous run left that describe it; removed before any data changes so that a
# folder never shows an old manifest beside new, half-written shards.
RUN_DESCRIPTIONS = ("manifest.json", "run.json", "audit.html", "audit.json")


class OutputFolderError(ValueError):
    """The output folder cannot be used (not ours, locked, not writable); says why in one line."""


class OutputFolder:
    """Claim, lock, register and clean one output folder."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self._lock_fd: int | None = None
        self._owned: set[str] = set()

    # ------------------------------------------------------------------ claiming
    def claim(self, inputs: Iterable[Path] = ()) -> None:
        """Make the folder ours (or prove it already is), lock it, and check the inputs."""
        self._check_path()
        marker = self.root / MARKER
        for name in (MARKER, LOCK):
            if (self.root / name).is_symlink():
                raise OutputFolderError(str(LinkRefused(self.root / name)))
        if marker.is_file():
            self._lock()
            self._owned = self._read_marker()
        else:
            entries = sorted(p.name for p in self.root.iterdir())
            if entries:
                shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
                hint = (" (if it is the output of a dataguard older than the marker, remove it yourself)"
                        if "manifest.json" in entries else "")
                raise OutputFolderError(
                    f"output folder {self.root} is not empty ({shown}) and has no {MARKER} marker, "
                    f"so dataguard did not write it; choose a new or empty folder{hint}")
            self._write_marker()  # first file in the folder: from now on it is provably ours
            self._lock()
        self._check_inputs(inputs)
        for sub in ("data", "rejected", WORK):
            link = find_link(self.root / sub)  # at any depth: writing through it would land outside
            if link is not None:
                raise OutputFolderError(f"{link} is a link; dataguard writes only inside "
                                        f"{self.root} - remove the link or choose another output folder")

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _check_path(self) -> None:
        for parent in [*reversed(self.root.parents), self.root]:
            if parent.exists() and not parent.is_dir():
                what = "is a file" if parent == self.root else f"is inside {parent}, which is a file"
                raise OutputFolderError(f"output {self.root} {what}; choose a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputFolderError(f"cannot create output folder {self.root}: {_why(exc)}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise OutputFolderError(f"output folder {self.root} is not writable")

    def _lock(self) -> None:
        import fcntl

        path = self.root / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a planted link: its target would get our pid
                raise OutputFolderError(str(LinkRefused(path))) from None
            raise OutputFolderError(f"cannot lock output folder {self.root}: {_why(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise OutputFolderError(f"another dataguard run (pid {holder}) is writing to {self.root}; "
                                    "wait for it to finish or choose another output folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _check_inputs(self, inputs: Iterable[Path]) -> None:
        root = self.root.resolve()
        for path in inputs:
            resolved = Path(path).resolve()
            try:
                rel = resolved.relative_to(root)
            except ValueError:
                continue
            top = rel.parts[0] if rel.parts else ""
            if rel.as_posix() in self._owned or top in (WORK, MARKER, LOCK) or not rel.parts:
                raise OutputFolderError(f"input {path} is part of output folder {self.root}, which this "
                                        "run would rewrite; write the output to another folder")

    # ------------------------------------------------------------------ the ledger
    def own(self, *paths: Path | str) -> None:
        """Record files (relative to the folder) as dataguard's *before* they are written."""
        new = {self._rel(p) for p in paths} - self._owned
        if new:
            self._owned |= new
            self._write_marker()

    def disown_missing(self) -> None:
        """Forget registered files that no longer exist (keeps the marker short)."""
        gone = {rel for rel in self._owned if not (self.root / rel).exists()}
        if gone:
            self._owned -= gone
            self._write_marker()

    def owned(self) -> list[str]:
        return sorted(self._owned)

    @staticmethod
    def _rel(path: Path | str) -> str:
        """A registered name: a relative path inside the folder, never escaping it."""
        p = Path(path)
        if p.is_absolute() or ".." in p.parts or p.as_posix() in ("", ".", MARKER, LOCK):
            raise ValueError(f"{path!r} is not a file name relative to the output folder")
        return p.as_posix()

    def _read_marker(self) -> set[str]:
        path = self.root / MARKER
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            files = doc["files"] if isinstance(doc, dict) and doc.get("format") == MARKER_FORMAT else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError):
            files = None
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise OutputFolderError(f"{path} is not a dataguard marker; refusing to touch {self.root}")
        return {f for f in files if not Path(f).is_absolute() and ".." not in Path(f).parts}

    def _write_marker(self) -> None:
        from dataguard.io.writer import atomic_write_bytes

        doc = {"format": MARKER_FORMAT, "written_by": f"dataguard {__version__}",
               "note": "dataguard only ever deletes the files listed here and its own _work/ files",
               "files": sorted(self._owned)}
        try:
            atomic_write_bytes(self.root / MARKER, (json.dumps(doc, indent=1) + "\n").encode())
        except OSError as exc:
            raise OutputFolderError(f"cannot write to output folder {self.root}: {_why(exc)}") from None

    # ------------------------------------------------------------------ cleaning
    def invalidate_run_description(self) -> None:
        """Remove the previous run's manifest/run.json/report before any data changes."""
        for name in RUN_DESCRIPTIONS:
            if name in self._owned:
                self._delete(name)

    def clean(self) -> None:
        """Delete every registered file and dataguard's own _work/ files; nothing else."""
        for rel in sorted(self._owned):
            self._delete(rel)
        self.clean_work()
        for sub in ("data", "rejected"):
            _rmdir_if_empty(self.root / sub)
        self.disown_missing()

    def remove_stale(self, folders: tuple[str, ...], current: set[str]) -> None:
        """Delete registered files under ``folders`` that are not in ``current`` (an earlier
        attempt's extra shards), then forget them."""
        for rel in self.owned():
            if rel.startswith(tuple(f"{f}/" for f in folders)) and rel not in current:
                self._delete(rel)
        self.disown_missing()

    def _delete(self, rel: str) -> None:
        """Unlink one registered file, never through a symlinked folder that leads outside."""
        target = self.root / rel
        root = os.path.realpath(self.root)
        if os.path.commonpath([root, os.path.realpath(target.parent)]) != root:
            return  # a folder on the way was replaced by a link elsewhere: not ours to touch
        if target.is_file() or target.is_symlink():
            target.unlink()

    def clean_work(self) -> None:
        """Remove _work/ files whose names only dataguard uses; keep anything else."""
        work = self.root / WORK
        if not work.is_dir() or work.is_symlink():
            return
        for seg in sorted(work.iterdir()):
            if seg.is_dir() and not seg.is_symlink() and WORK_FILE.match(seg.name):
                for f in seg.iterdir():
                    if WORK_FILE.match(f.name) and (f.is_file() or f.is_symlink()):
                        f.unlink()
                _rmdir_if_empty(seg)
            elif WORK_FILE.match(seg.name) and (seg.is_file() or seg.is_symlink()):
                seg.unlink()
        _rmdir_if_empty(work)


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass  # missing or not empty (a user's file is in it): leave it


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    return exc.strerror or str(exc)


def register_extra_output(root: str | os.PathLike, path: str | os.PathLike) -> None:
    """Before writing ``path`` (e.g. the audit report) inside a dataguard output folder,
    register it in the marker; refuse to overwrite a file there that dataguard did not write.

    Paths outside ``root``, or a ``root`` without a marker, are the caller's explicit choice
    and are left to it.
    """
    folder = OutputFolder(root)
    if not (folder.root / MARKER).is_file():
        return
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(folder.root))
    except ValueError:
        return
    owned = folder._read_marker()
    if rel.as_posix() not in owned and (folder.root / rel).exists():
        raise OutputFolderError(f"refusing to overwrite {path}: dataguard did not write it "
                                f"(it is not listed in {folder.root / MARKER})")
    folder._owned = owned
    folder.own(rel)
