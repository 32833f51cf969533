"""Turn a run or checkpoint into a plain Hugging Face folder (LoRA merged into the base).

``convert_checkpoint`` writes a folder (adapter merged with ``merge_and_unload``) that
``from_pretrained`` loads without peft. Key layouts (plain or PEFT-prefixed) are matched by
``dataguard.train.model.weights.load_state_into``, re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from dataguard.io.safe_files import disk_full, no_space_error
from dataguard.train.checkpoint import (
    COMPLETE,
    checkpoint_damage,
    latest_checkpoint,
    load_weights,
    newest_intact_checkpoint,
    resume_checkpoint,
)
from dataguard.train.model.base_dtype import BaseDtypeError, base_dtype, convert_dtype
from dataguard.train.model.weights import PEFT_PREFIX, ConvertError, load_state_into
from dataguard.train.tasks import get_task

__all__ = ["PEFT_PREFIX", "ConvertError", "convert_checkpoint", "find_checkpoint", "load_run_model",
           "load_state_into"]


def find_checkpoint(path: str | Path, which: str = "best") -> Path:
    """A checkpoint folder itself (refused if damaged), or one of a run folder: ``best`` (by
    eval, `best.json`; else the newest verified), or ``newest`` (the newest intact)."""
    path = Path(path)
    if (path / COMPLETE).is_file():
        damage = checkpoint_damage(path)
        if damage is not None:
            raise ConvertError(f"{path}: damaged checkpoint ({damage}); convert another one")
        return path
    if which not in ("best", "newest"):
        raise ConvertError(f"--checkpoint {which!r}: give best, newest or a checkpoint folder")
    if latest_checkpoint(path) is None:
        raise ConvertError(f"{path}: neither a checkpoint nor a run folder with a complete checkpoint")

    def warn(line: str) -> None:
        warnings.warn(line, stacklevel=2)

    if which == "best":
        best = _best_checkpoint(path)
        if best is not None:
            damage = checkpoint_damage(best)
            if damage is None:
                return best
            warn(f"the best checkpoint {best.name} is damaged ({damage}); taking the newest verified one")
        chosen, _ = resume_checkpoint(path, warn)
    else:
        chosen = newest_intact_checkpoint(path, warn)
    if chosen is None:
        raise ConvertError(f"{path}: every checkpoint is damaged; nothing to convert")
    return chosen


def _best_checkpoint(run: Path) -> Path | None:
    """The checkpoint ``best.json`` names (the best eval loss), if it is still there."""
    try:
        name = Path(str(json.loads((run / "best.json").read_text(encoding="utf-8"))["checkpoint"])).name
    except (OSError, ValueError, KeyError, TypeError):
        return None
    candidate = run / "checkpoints" / name
    return candidate if (candidate / COMPLETE).is_file() else None


def convert_checkpoint(source: str | Path, out: str | Path, which: str = "best", dtype: str | None = None) -> Path:
    """Write a plain HF model folder (LoRA merged) from a run or checkpoint folder, in the
    dtype the run's base was loaded in unless ``dtype`` says otherwise
    (`dataguard.train.model.base_dtype.convert_dtype`).

    The model is written into a temporary sibling folder and renamed to ``out`` when it is
    complete, so a failure (a full disk) leaves nothing that blocks the retry."""
    ckpt = find_checkpoint(source, which)
    out = Path(out)
    if out.is_symlink():
        raise ConvertError(f"{out}: is a link; give a new folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(f"{out}: exists and is not an empty folder")
    state = json.loads((ckpt / "state.json").read_text())
    config = state.get("config", {})
    task = config.get("task", "sft")
    try:
        target = convert_dtype(config, dtype)
    except BaseDtypeError as exc:
        raise ConvertError(str(exc)) from None
    # the base as it trained (bf16 stays bf16); a 4-bit run merges into a bf16 base
    model = load_run_model(ckpt, task=task, model_spec=config.get("model"),
                           base=base_dtype(str(config.get("precision", "fp32")), config.get("lora")))
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    model = model.to(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.convert-", dir=out.parent))
    try:
        _write_model(ckpt, model, tmp)
        tmp.chmod(0o755)  # mkdtemp made it private
        os.replace(tmp, out)  # onto a missing or empty folder only (checked above)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(exc, out.parent):
            raise no_space_error(out.parent) from exc
        raise
    return out


def _write_model(ckpt: Path, model: Any, folder: Path) -> None:
    from dataguard.train.model.build import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(str(folder))
    tok = _tokenizer(ckpt)
    if tok is not None:
        tok.save_pretrained(str(folder))
    for extra in ("label_map.json",):
        if (ckpt / extra).is_file():
            (folder / extra).write_bytes((ckpt / extra).read_bytes())


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_run_model(ckpt: str | Path, *, task: str, model_spec: str | None = None,
                   base: Any = None) -> Any:
    """The trained model of a checkpoint: the base (rebuilt from ``model_spec`` or read from the
    adapter config, in dtype ``base``, default fp32) with the adapter loaded, or the full model."""
    import torch

    from dataguard.train.model.build import apply_lora, load_model

    ckpt = Path(ckpt)
    label_map = json.loads((ckpt / "label_map.json").read_text()) if (ckpt / "label_map.json").is_file() else None
    labels = (label_map or {}).get("classes")
    if (ckpt / "adapter_config.json").is_file():
        adapter = json.loads((ckpt / "adapter_config.json").read_text())
        spec = model_spec or adapter.get("base_model_name_or_path")
        if not spec:
            raise ConvertError(f"{ckpt}: the adapter does not say which base model it belongs to")
        model, _ = load_model(task, spec, label_map=labels, num_labels=len(labels) if labels else None,
                              dtype=base if base is not None else torch.float32)
        targets = adapter.get("target_modules")
        model, _ = apply_lora(model, {"r": adapter["r"], "alpha": adapter["lora_alpha"], "dropout": 0.0,
                                      "targets": sorted(targets) if isinstance(targets, list | set) else targets},
                              task)
        load_weights(model, ckpt)
        return model
    auto = get_task(task).auto_model_class()
    return auto.from_pretrained(str(ckpt), local_files_only=True, dtype=torch.float32)
