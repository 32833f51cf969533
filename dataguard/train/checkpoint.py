"""Atomic, complete, rotated checkpoints that resume a run exactly.

A checkpoint is a folder ``run_dir/checkpoints/step-000123/``: the weights as a Hugging Face
folder (``save_pretrained``: safetensors; only the adapter for LoRA) plus the tokenizer, and
next to them everything else a resumed run needs: optimizer / scheduler / scaler state and
every RNG state (``trainer_state.pt``, tensors and plain values only, read back with
``weights_only=True``), the data position, loss history and config (``state.json``) and the
label map. It is written under ``step-000123.tmp-<pid>`` and renamed into place after the
``COMPLETE`` marker (written last, fsynced): a folder without the marker is never read.

Every file's sha256 goes to ``checksums.json`` just before ``COMPLETE``; reading a checkpoint
verifies them first, so a truncated, emptied or bit-flipped file is detected, never trusted:
`newest_intact_checkpoint` falls back to the previous intact checkpoint and says so.

Rotation keeps the last ``keep`` complete checkpoints and never deletes the newest complete
one nor the best one (a run killed during a save still has its last good checkpoint). A
rotated checkpoint loses its ``COMPLETE`` marker before any other file, so a kill during
rotation never leaves a "complete" checkpoint with files missing.
A checkpoint with a non-finite weight or optimizer value is refused, not written. A full disk
during a save removes the partial folder and raises the ``ENOSPC`` error every command reports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dataguard.io.readers import file_sha256
from dataguard.io.safe_files import disk_full, no_space_error, write_atomic
from dataguard.train.model.weights import load_state_into
from dataguard.train.rng import capture_rng, restore_rng  # noqa: F401 - restore_rng: callers import it here

COMPLETE = "COMPLETE"
CHECKSUMS = "checksums.json"
VERIFIED = "VERIFIED"  # written once the guard verified the checkpoint's state (dataguard.train.stability.snapshots)
GUARD_SNAPSHOT = "guard_snapshot.safetensors"  # the guard's snapshots (dataguard.train.stability.guard_resume), not weights
SAVING = ".saving"  # the name of the temp folder a save is writing, written before the folder
_NAME = re.compile(r"^step-(\d{6,})$")
_TMP_NAME = re.compile(r"^step-\d{6,}\.tmp-\d+$")
OWNER = ".dataguard-checkpoint"
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read (the message names the file or key)."""


@dataclass
class LoadedCheckpoint:
    """What `load_checkpoint` restored or read back for the caller."""

    path: Path
    step: int
    sampler_state: dict[str, Any] | None
    rng: dict[str, Any]
    history: list[dict[str, Any]]
    label_map: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- saving
def _nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    for name, value in named:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
            return name
    return None


def _optimizer_tensors(state: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for pid, slots in state.get("state", {}).items():
        for key, value in slots.items():
            yield f"optimizer.state[{pid}].{key}", value


def _fsync_write(path: Path, data: bytes) -> None:
    with _new_file(path) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _new_file(path: Path) -> Any:
    """A new file inside a checkpoint being written (never an existing file or a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, "wb")


def _torch_save(value: Any, path: Path) -> None:
    """torch.save through our own file handle: a full disk is an OSError, not torch's C++ error."""
    with _new_file(path) as fh:
        torch.save(value, fh)
        fh.flush()
        os.fsync(fh.fileno())


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, step: int, model: Any, optimizer: Any, scheduler: Any = None,
                    scaler: Any = None, sampler_state: Mapping[str, Any] | None = None,
                    rng: Mapping[str, Any] | None = None, history: list[dict[str, Any]] | None = None,
                    label_map: Mapping[str, Any] | None = None, cfg: Mapping[str, Any] | None = None, *,
                    tokenizer: Any = None, extra: Mapping[str, Any] | None = None, keep: int | None = None,
                    protect: Iterable[str] = (), weight_bound: float | None = None,
                    tensor_files: Mapping[str, Mapping[str, torch.Tensor]] | None = None) -> Path:
    """Write ``step-<step>/`` atomically; rotate to ``keep`` (never the newest nor ``protect``)."""
    bad = _nonfinite(model.state_dict().items())
    opt_state = optimizer.state_dict()
    bad = bad or _nonfinite(_optimizer_tensors(opt_state))
    if bad:
        raise CheckpointError(f"refusing to write checkpoint step {step}: {bad} is not finite")
    if weight_bound is not None:
        for name, value in model.state_dict().items():
            if value.is_floating_point() and value.numel() and float(value.abs().max()) > weight_bound:
                raise CheckpointError(f"refusing to write checkpoint step {step}: max |{name}| "
                                      f"{float(value.abs().max()):.4g} is above the weight bound {weight_bound:g}")
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp-{os.getpid()}"
    if tmp.exists():
        _remove_ours(tmp)
    try:
        write_atomic(root / SAVING, tmp.name)  # names the folder before it exists: an empty one is ours
        tmp.mkdir()
        _fsync_write(tmp / OWNER, b"written by dataguard train\n")  # first file: proves the folder is ours
        from dataguard.train.model.build import quiet_transformers

        with quiet_transformers():
            model.save_pretrained(str(tmp))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp))
        _torch_save(opt_state, tmp / "optimizer.pt")
        _torch_save({"scheduler": scheduler.state_dict() if scheduler is not None else None,
                     "scaler": scaler.state_dict() if scaler is not None else None,
                     "rng": dict(rng) if rng is not None else capture_rng()}, tmp / "trainer_state.pt")
        state = {"step": int(step), "sampler": dict(sampler_state) if sampler_state is not None else None,
                 "history": list(history or []), "config": dict(cfg or {}), "extra": dict(extra or {}),
                 "lora": bool(hasattr(model, "peft_config"))}
        _fsync_write(tmp / "state.json", json.dumps(state, indent=1, default=str).encode())
        if label_map is not None:
            _fsync_write(tmp / "label_map.json", json.dumps(dict(label_map), indent=1).encode())
        for name, tensors in (tensor_files or {}).items():  # e.g. the guard's rollback target
            from safetensors.torch import save_file

            save_file(dict(tensors), str(tmp / name))
        sums = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file() and not p.is_symlink()}
        _fsync_write(tmp / CHECKSUMS, json.dumps({"sha256": sums}, indent=1, sort_keys=True).encode())
        _fsync_write(tmp / COMPLETE, b"ok\n")
    except Exception as exc:
        if tmp.is_dir() and not tmp.is_symlink() and (tmp / OWNER).is_file():
            shutil.rmtree(tmp, ignore_errors=True)  # ours (owner file first), and never complete
        if disk_full(exc, root):
            raise no_space_error(root) from exc
        if isinstance(exc, OSError):
            raise
        raise CheckpointError(f"cannot write checkpoint step {step}: {' '.join(str(exc).split())}") from exc
    if final.exists():  # the same step saved again (e.g. a resumed run): replace it
        _remove_ours(final)
    os.replace(tmp, final)
    (root / SAVING).unlink(missing_ok=True)
    _fsync_dir(root)
    if keep is not None:
        rotate(run_dir, keep, protect=protect)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _NAME.match(child.name)
        if m and child.is_dir() and (child / COMPLETE).is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None (not verified: see `newest_intact_checkpoint`)."""
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def checkpoint_damage(path: str | Path) -> str | None:
    """Why a complete checkpoint cannot be trusted (a file missing, changed or added), or None."""
    path = Path(path)
    try:
        sums = json.loads((path / CHECKSUMS).read_text(encoding="utf-8"))["sha256"]
        if not isinstance(sums, dict) or not sums:
            raise ValueError("no sums")
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKSUMS} is missing or unreadable"
    for name, expected in sorted(sums.items()):
        file = path / str(name)
        if Path(str(name)).name != name or file.is_symlink() or not file.is_file():
            return f"{name} is missing"
        try:
            if file_sha256(file) != expected:
                return f"{name} does not match its sha256 (damaged or changed)"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
    for extra in WEIGHT_FILES + ("optimizer.pt", "trainer_state.pt", "state.json"):
        if (path / extra).exists() and extra not in sums:
            return f"{extra} was not written with the checkpoint"
    return None


def is_verified(path: str | Path) -> bool:
    return (Path(path) / VERIFIED).is_file()


def mark_verified(run_dir: str | Path, step: int, detail: str) -> Path | None:
    """Mark the checkpoint of ``step`` (if there is one) as a verified state."""
    path = checkpoint_dir(run_dir) / f"step-{step:06d}"
    if not (path / COMPLETE).is_file():
        return None
    write_atomic(path / VERIFIED, detail.strip() + "\n")
    return path


def resume_checkpoint(run_dir: str | Path, warn: Any = None) -> tuple[Path | None, bool]:
    """(the checkpoint a resume takes, whether it is verified): the newest intact verified
    one, else the newest intact one (a run stopped before any state was verified)."""
    intact = []
    for path in reversed(complete_checkpoints(run_dir)):  # each hashed once
        damage = checkpoint_damage(path)
        if damage is None:
            intact.append(path)
        elif warn is not None:
            warn(f"checkpoint {path.name} is damaged ({damage}); using the previous intact checkpoint")
    for path in intact:
        if is_verified(path):
            return path, True
    return (intact[0], False) if intact else (None, False)


def newest_intact_checkpoint(run_dir: str | Path, warn: Any = None) -> Path | None:
    """The newest complete checkpoint whose files match their sha256 sums; each newer damaged
    one is named through ``warn`` (a callable taking one line) and skipped."""
    for path in reversed(complete_checkpoints(run_dir)):
        damage = checkpoint_damage(path)
        if damage is None:
            return path
        if warn is not None:
            warn(f"checkpoint {path.name} is damaged ({damage}); using the previous intact checkpoint")
    return None


def rotate(run_dir: str | Path, keep: int, *, protect: Iterable[str] = ()) -> list[Path]:
    """Delete complete checkpoints beyond the last ``keep`` (except the newest and ``protect``),
    and leftovers of interrupted saves; returns what was deleted."""
    keep = max(int(keep), 1)
    done = complete_checkpoints(run_dir)
    keep_names = {p.name for p in done[-keep:]} | {Path(p).name for p in protect if p}
    if done:
        keep_names.add(done[-1].name)
    verified = [p for p in done if is_verified(p)]
    if verified:  # the state a resume or a rollback would go back to
        keep_names.add(verified[-1].name)
    removed = [p for p in done if p.name not in keep_names]
    root = checkpoint_dir(run_dir)
    for child in root.iterdir() if root.is_dir() else ():
        interrupted = _TMP_NAME.match(child.name) and child.name.rsplit("-", 1)[-1] != str(os.getpid())
        if interrupted and _owned(child):
            removed.append(child)
    removed = [p for p in removed if _owned(p)]
    for path in removed:
        if (path / COMPLETE).is_file():  # first: a kill from here on leaves an incomplete folder
            (path / COMPLETE).unlink()
            _fsync_dir(path)
        shutil.rmtree(path, ignore_errors=True)
    saving = _saving_folder(root)
    if saving is not None and saving.rsplit("-", 1)[-1] != str(os.getpid()):
        child = root / saving  # a save killed between mkdir and its owner file: empty, and named ours
        if child.is_dir() and not child.is_symlink() and not any(child.iterdir()):
            child.rmdir()
            removed.append(child)
    return removed


def _saving_folder(root: Path) -> str | None:
    """The temp folder the last save named in ``.saving`` (only a name of ours, never a path)."""
    try:
        name = (root / SAVING).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _TMP_NAME.match(name) else None


def _owned(path: Path) -> bool:
    """A checkpoint folder dataguard wrote: its owner file (written first) or COMPLETE marker."""
    return path.is_dir() and not path.is_symlink() and ((path / OWNER).is_file() or (path / COMPLETE).is_file())


def _remove_ours(path: Path) -> None:
    """Delete a checkpoint folder only if it carries dataguard's marker; refuse anything else."""
    if not _owned(path):
        raise CheckpointError(f"{path} exists and was not written by dataguard (no {OWNER} or {COMPLETE}); "
                              "move it away or choose another output")
    shutil.rmtree(path)


# --------------------------------------------------------------------------------- loading
def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor in the folder's safetensors files (model or adapter, sharded or not)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    # the model's own files only (model.safetensors, model-00001-of-00002.safetensors,
    # adapter_model.safetensors): a checkpoint also holds other tensors (guard snapshots,
    # training dynamics) that are not weights
    files = [f for f in sorted(folder.glob("*.safetensors"))
             if f.name.startswith(("model", "adapter_model")) and f.name != GUARD_SNAPSHOT]
    if not files:
        raise CheckpointError(f"{folder}: no safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def load_weights(model: Any, folder: str | Path) -> None:
    """Load a checkpoint's weights into ``model`` in place (adapter for a peft model)."""
    folder = Path(folder)
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        path = folder / "adapter_model.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{folder}: no adapter_model.safetensors (the run uses LoRA)")
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(str(path)))
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise CheckpointError(f"{path}: keys not in the model: {', '.join(unexpected[:10])}")
        return
    load_state_into(model, read_weights(folder), source=str(folder))


def load_checkpoint(path: str | Path, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                    scaler: Any = None) -> LoadedCheckpoint:
    """Restore weights/optimizer/scheduler/scaler in place (those given); RNG is returned, not
    applied: call `restore_rng` once everything else is built."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise CheckpointError(f"{path}: not a complete checkpoint (no {COMPLETE} marker)")
    damage = checkpoint_damage(path)
    if damage is not None:
        raise CheckpointError(f"{path}: damaged checkpoint: {damage}")
    try:
        state = json.loads((path / "state.json").read_text())
        # map_location: a run saved on GPUs resumes on another layout or on the CPU (the
        # optimizer moves its state onto each parameter's device as it loads)
        trainer = torch.load(path / "trainer_state.pt", weights_only=True, map_location="cpu")
        if model is not None:
            load_weights(model, path)
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a checkpoint whose sums match but does not load
        raise CheckpointError(f"{path}: unreadable checkpoint ({' '.join(str(exc).split())[:300]})") from None
    if scheduler is not None and trainer.get("scheduler") is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    if scaler is not None and trainer.get("scaler"):
        scaler.load_state_dict(trainer["scaler"])
    label_map = None
    if (path / "label_map.json").is_file():
        label_map = json.loads((path / "label_map.json").read_text())
    return LoadedCheckpoint(path=path, step=int(state["step"]), sampler_state=state.get("sampler"),
                            rng=trainer["rng"], history=state.get("history", []), label_map=label_map,
                            extra=state.get("extra", {}))
