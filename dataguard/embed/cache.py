"""A folder of derived model artifacts (ONNX exports, distilled static models), built once.

Where: ``$DATAGUARD_CACHE``, else ``$XDG_CACHE_HOME/dataguard``, else ``~/.cache/dataguard``;
entries live under ``embed/<kind>-<model>-<key>/`` where the key hashes every file of the
model folder (name, size, content) and the build settings, so a changed model or setting
never reuses a stale artifact.

Why it is safe to share between processes and runs:

* an entry is built in a private temporary folder next to it and renamed into place in
  one step, with ``MARKER`` (the list of its files and their SHA-256) written last, so a
  reader sees a whole entry or none; concurrent builders (two workers) serialise on a lock
  file and the second reuses the first's entry;
* an entry is used only when its marker parses and every file matches its checksum; a
  corrupt or truncated one (disk full, killed build) is moved aside and rebuilt;
* a folder without dataguard's marker is never overwritten or deleted: the build stops
  with an error that names it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dataguard.io.readers import file_sha256
from dataguard.io.safe_files import disk_full, no_space_error, open_nofollow

MARKER = "dataguard-cache.json"
_MODEL_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
# Entries this process verified (or built), with the (name, size, mtime, inode) of their
# files then: each worker loads an embedder once per segment, and re-hashing a 90 MB model
# file to find it unchanged is the expensive part; any change to a file changes its stamp.
_CHECKED: dict[Path, tuple[tuple[str, int, int, int], ...]] = {}


def _stamp(entry: Path) -> tuple[tuple[str, int, int, int], ...] | None:
    try:
        return tuple((p.name, (st := p.stat()).st_size, st.st_mtime_ns, st.st_ino) for p in sorted(entry.iterdir()))
    except OSError:
        return None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A one-off build's progress bars, tracer warnings and advice stay off the user's
    terminal (stderr is for problems); exceptions still propagate."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def cache_root() -> Path:
    env = os.environ.get("DATAGUARD_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "dataguard"


def model_hash(model_dir: Path) -> str:
    """SHA-256 over every file of the model folder (relative name, size, content); memoised
    per process by (name, size, mtime) so a worker hashes a 90 MB model once. Git metadata and
    Python's bytecode caches are left out: a model shipped in a package gains a __pycache__
    when the package is imported, and that must not make a new cache entry."""
    files = sorted(p for p in model_dir.rglob("*")
                   if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts and p.suffix != ".pyc")
    stamp = tuple((str(p.relative_to(model_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(model_dir.resolve()), stamp)
    if key not in _MODEL_HASHES:
        h = hashlib.sha256()
        for p, (rel, size, _) in zip(files, stamp, strict=True):
            h.update(f"{rel}\0{size}\0{file_sha256(p)}\n".encode())
        _MODEL_HASHES[key] = h.hexdigest()
    return _MODEL_HASHES[key]


def entry_name(kind: str, model_dir: Path, settings: dict[str, Any]) -> str:
    h = hashlib.sha256(model_hash(model_dir).encode())
    h.update(json.dumps(settings, sort_keys=True).encode())
    label = "".join(c if c.isalnum() or c in "-_" else "_" for c in model_label(model_dir))[:40]
    return f"{kind}-{label}-{h.hexdigest()[:16]}"


def model_label(model_dir: Path) -> str:
    return model_dir.name if model_dir.name != "model" else model_dir.parent.name


def _remove_empty_builds(root: Path, name: str) -> None:
    """Empty build folders of killed builds (mkdtemp's names, nothing inside to lose)."""
    for child in root.glob(f".build-{name}-*"):
        if child.is_dir() and not child.is_symlink():
            try:
                child.rmdir()
            except OSError:
                pass  # not empty: a build in progress in another process, or not ours


def _valid(entry: Path) -> bool:
    try:
        marker = json.loads((entry / MARKER).read_text(encoding="utf-8"))
        files = marker["files"]
        return bool(files) and all(file_sha256(entry / name) == sha for name, sha in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def cached_artifact(kind: str, model_dir: Path, settings: dict[str, Any],
                    build: Callable[[Path], None]) -> Path:
    """The folder of a valid cache entry for (kind, model, settings), built by
    ``build(tmp_folder)`` when missing or corrupt."""
    root = cache_root() / "embed"
    name = entry_name(kind, model_dir, settings)
    entry = root / name
    stamp = _stamp(entry)
    if stamp is not None and _CHECKED.get(entry) == stamp:
        return entry
    if _valid(entry):
        _CHECKED[entry] = stamp
        return entry
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"dataguard cache {str(root)!r} cannot be created ({exc}); set DATAGUARD_CACHE "
                      "to a writable folder") from exc
    with open_nofollow(root / f"{name}.lock", "a") as lock:  # a planted link is refused
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _valid(entry):  # another process built it while we waited
                return entry
            if entry.exists() or entry.is_symlink():
                if not (entry / MARKER).is_file():
                    raise FileExistsError(f"{str(entry)!r} exists but was not written by dataguard (no {MARKER}); "
                                          "it is left alone: remove it or set DATAGUARD_CACHE elsewhere")
                aside = Path(tempfile.mkdtemp(prefix=f".corrupt-{name}-", dir=root))
                os.replace(entry, aside / "entry")  # ours (marker), but corrupt: rebuild
                shutil.rmtree(aside, ignore_errors=True)
            _remove_empty_builds(root, name)
            tmp = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=root))
            try:
                build(tmp)
                files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
                marker = {"written_by": "dataguard", "kind": kind, "model": str(model_dir),
                          "settings": settings, "files": files}
                (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True), encoding="utf-8")
                tmp.chmod(0o755)  # mkdtemp made it private; the cache may be shared
                os.rename(tmp, entry)
            except Exception as exc:
                # a full disk shows up as whatever the exporter read back half-written (a protobuf
                # DecodeError, say): name the real cause, as every other write does
                if disk_full(exc, root):
                    raise no_space_error(root) from exc
                raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not _valid(entry):
        raise RuntimeError(f"dataguard cache entry {str(entry)!r} is not valid right after it was built")
    _CHECKED[entry] = _stamp(entry)
    return entry
