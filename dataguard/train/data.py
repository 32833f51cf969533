"""Shards -> tokenized training examples, reading only what a pipeline wrote.

`RunShards.open(folder)` reads ``manifest.json`` and the data shards it lists (sha256
checked), `encode_sft` / `encode_classify` turn rows into token ids and labels, and
`Encoded.collate` pads a micro-batch (right padding, attention mask 0 on padding, labels
-100 on padding and on every non-assistant token for SFT).

THE WEIGHT RULE (how the pipeline's per-row columns become what the optimizer sees):

* ``sample_weight`` (longtail stage; default 1) and ``drift_weight`` (drift stage's
  importance weights; default 1) *multiply*: a row's base weight is
  ``sample_weight * drift_weight``. It scales the row's loss (`dataguard.train.losses`
  normalises by the batch's weight sum).
* ``repeat`` (resampling; int, default 1) is how many times the row is *drawn* per epoch:
  the sampler expands indices (row i appears ``repeat[i]`` times in the epoch's shuffled
  order); it never multiplies the weight, so a resampled row is not counted twice over.
  ``repeat = 0`` means the row is kept but never drawn.
* the curriculum multiplier of the row's class in the active phase (the manifest's
  ``phase_multipliers``; 0 = not yet admitted, ``tail_boost`` for the tail in the last phase)
  multiplies the base weight at collate time; rows at multiplier 0 are not drawn at all
  (`dataguard.train.sampler.CurriculumSampler`).
* null = the default (1): a stage writes null for rows it did not score. NaN, infinite or
  negative weights, and negative or fractional repeats, are errors at load
  (`TrainDataError` naming the row id): the run would otherwise train on garbage silently.

With ``packing`` (SFT only) rows are first expanded by ``repeat`` and packed in order; a pack
is one sample whose weight is the mean of its rows' weights (exact only when weights are
uniform) and whose rows attend to each other (no per-row attention reset).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from dataguard.io.readers import file_sha256
from dataguard.io.writer import read_table

IGNORE_INDEX = -100
WEIGHT_COLUMNS = ("sample_weight", "drift_weight")
REPEAT_COLUMN = "repeat"


class TrainDataError(ValueError):
    """The run folder cannot be trained on; the message says what to fix."""


# ------------------------------------------------------------------ reading a run
@dataclass
class RunShards:
    """A pipeline's output folder, loaded: its manifest and the kept rows as one table."""

    folder: Path
    manifest: dict[str, Any]
    table: pa.Table

    @property
    def training(self) -> dict[str, Any]:
        """The manifest's ``training`` section (per stage: priors, offsets, curriculum...)."""
        return self.manifest.get("training") or {}

    @property
    def ids(self) -> list[str]:
        return [str(i) for i in self.table.column("id").to_pylist()]

    @classmethod
    def open(cls, folder: str | Path, task: str | None = None) -> RunShards:
        """Load and check a run folder. ``task`` ("sft" / "classify") adds the task's column
        checks (messages with an assistant turn / labels)."""
        folder = Path(folder)
        if not folder.is_dir():
            raise TrainDataError(f"{folder}: no such run folder (run the pipeline first: dataguard run CONFIG)")
        path = folder / "manifest.json"
        if not path.is_file():
            raise TrainDataError(f"{folder}: no manifest.json; not a finished pipeline run "
                                 "(an interrupted run writes none)")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TrainDataError(f"{path}: unreadable manifest: {exc}") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
            raise TrainDataError(f"{path}: not a dataguard manifest (no outputs section)")
        counts = manifest.get("counts") or {}
        if counts.get("balanced") is False:
            raise TrainDataError(f"{path}: the run is unbalanced (rows in != kept + rejected); "
                                 "its outputs are not trustworthy, rerun the pipeline")
        shards = manifest["outputs"].get("data")
        if not isinstance(shards, list) or not shards:
            raise TrainDataError(f"{path}: lists no data shards")
        tables = []
        for entry in shards:
            shard = folder / str(entry.get("path", ""))
            if not shard.is_file():
                raise TrainDataError(f"{shard}: data shard listed in the manifest is missing")
            if entry.get("sha256") and file_sha256(shard) != entry["sha256"]:
                raise TrainDataError(f"{shard}: sha256 does not match the manifest (file changed or corrupt)")
            try:
                tables.append(read_table(shard))
            except (OSError, pa.ArrowInvalid) as exc:
                raise TrainDataError(f"{shard}: unreadable Arrow shard: {exc}") from None
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except pa.ArrowInvalid as exc:
            raise TrainDataError(f"{folder}: shards have incompatible schemas: {exc}") from None
        if table.num_rows == 0:
            raise TrainDataError(f"{folder}: the run kept no rows; nothing to train on")
        for column in ("id", "messages"):
            if column not in table.column_names:
                raise TrainDataError(f"{folder}: the shards have no {column!r} column")
        run = cls(folder=folder, manifest=manifest, table=table)
        row_weights(table)  # the weight rule's checks, at load
        row_repeat(table)
        if task == "classify":
            if "label" not in table.column_names or table.column("label").null_count == table.num_rows:
                raise TrainDataError(f"{folder}: task classify needs a 'label' column with values "
                                     "(input format labelled_text, or aliases: {{your_column: label}})")
        elif task is not None and task != "sft":
            raise TrainDataError(f"unknown task {task!r}")
        return run


def _ids(table: pa.Table) -> list[str]:
    return [str(i) for i in table.column("id").to_pylist()]


def row_weights(table: pa.Table) -> np.ndarray:
    """Base weight per row = sample_weight x drift_weight (null -> 1). See THE WEIGHT RULE."""
    w = np.ones(table.num_rows, dtype=np.float64)
    for name in WEIGHT_COLUMNS:
        if name not in table.column_names:
            continue
        col = np.asarray(table.column(name).cast(pa.float64()).fill_null(1.0).to_numpy(), dtype=np.float64)
        bad = ~np.isfinite(col) | (col < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TrainDataError(f"row {_ids(table)[i]!r}: {name} = {col[i]} (must be a finite number >= 0; "
                                 f"{int(bad.sum())} such rows)")
        w *= col
    return w


def row_repeat(table: pa.Table) -> np.ndarray:
    """Draws per epoch per row (``repeat``; null -> 1). See THE WEIGHT RULE."""
    if REPEAT_COLUMN not in table.column_names:
        return np.ones(table.num_rows, dtype=np.int64)
    col = np.asarray(table.column(REPEAT_COLUMN).cast(pa.float64()).fill_null(1.0).to_numpy(), dtype=np.float64)
    bad = ~np.isfinite(col) | (col < 0) | (col != np.round(col))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TrainDataError(f"row {_ids(table)[i]!r}: repeat = {col[i]} (must be an integer >= 0)")
    return col.astype(np.int64)


def length_cap(manifest: dict[str, Any]) -> tuple[int | None, str | None]:
    """(cap, tokenizer that counted it) of the run's length stage, or (None, None).

    Read from ``training.length`` when the pipeline writes one, else from the length stage's
    description summary (the last length stage wins: it is the cap the rows were cut to)."""
    section = (manifest.get("training") or {}).get("length")
    if isinstance(section, dict) and section.get("cap") is not None:
        return int(section["cap"]), section.get("tokenizer")
    found: tuple[int | None, str | None] = (None, None)
    for stage in manifest.get("stages") or []:
        if stage.get("name") != "length":
            continue
        summary = (stage.get("description") or {}).get("summary") or {}
        if summary.get("cap") is not None:
            found = (int(summary["cap"]), summary.get("tokenizer"))
    return found


def tokenizer_mismatch(counted_by: str | None, tokenizer: Any) -> str | None:
    """A warning when the tokenizer that counted the length cap is not the model's (the cap
    is then only approximate), else None."""
    if not counted_by:
        return None
    name = str(getattr(tokenizer, "name_or_path", "") or "")
    a, b = counted_by.lower().rstrip("/"), name.lower().rstrip("/")
    same = bool(b) and (a == b or Path(a).name == Path(b).name or (not Path(a).exists() and a in b))
    if same:
        return None
    return (f"the length cap was counted with tokenizer {counted_by!r} but the model's tokenizer is "
            f"{name or type(tokenizer).__name__!r}; max_length is approximate (set max_length, or run the "
            "length stage with this model's tokenizer)")


# ------------------------------------------------------------------ labels
@dataclass
class LabelMap:
    """Stable label <-> id map, saved next to every checkpoint."""

    classes: list[str]

    def __post_init__(self) -> None:
        if len(set(self.classes)) != len(self.classes):
            raise TrainDataError("duplicate class names in the label map")
        self._ids = {c: i for i, c in enumerate(self.classes)}

    @classmethod
    def from_run(cls, table: pa.Table, training: dict[str, Any] | None = None,
                 label_column: str = "label") -> LabelMap:
        """Classes in the longtail stage's order when the manifest has it (so the manifest's
        priors/offsets line up with the ids), then any other labels sorted."""
        ordered: list[str] = []
        for state in (training or {}).values():
            if isinstance(state, dict) and isinstance(state.get("classes"), list):
                ordered = [str(c) for c in state["classes"]]
                break
        seen = set(ordered)
        labels = table.column(label_column).drop_null().unique().to_pylist() if table.num_rows else []
        extra = sorted(str(x) for x in labels if str(x) not in seen)
        return cls(ordered + extra)

    def __len__(self) -> int:
        return len(self.classes)

    def id(self, label: str) -> int:
        return self._ids[label]

    def label(self, i: int) -> str:
        return self.classes[i]

    def to_json(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "id2label": dict(enumerate(self.classes)),
                "label2id": dict(self._ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> LabelMap:
        if isinstance(data, str):
            data = json.loads(data)
        return cls([str(c) for c in data["classes"]])

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> LabelMap:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def _longtail_state(training: dict[str, Any]) -> dict[str, Any] | None:
    for state in training.values():
        if isinstance(state, dict) and "logit_offsets" in state and "classes" in state:
            return state
    return None


def class_vector(training: dict[str, Any], label_map: LabelMap, key: str) -> list[float | None] | None:
    """A per-class list of the longtail state (``logit_offsets``, ``class_weights``,
    ``priors``) in label_map order; classes the state does not know get None."""
    state = _longtail_state(training)
    if state is None or not isinstance(state.get(key), list):
        return None
    by_class = dict(zip(state["classes"], state[key], strict=False))
    return [by_class.get(c) for c in label_map.classes]


def curriculum_schedule(training: dict[str, Any], label_map: LabelMap
                        ) -> tuple[list[list[float]], list[float]] | None:
    """(phase_multipliers in label_map order, boundaries) for the sampler, or None.
    A class unknown to the curriculum is admitted from the start (multiplier 1)."""
    state = _longtail_state(training)
    cur = (state or {}).get("curriculum")
    if not isinstance(cur, dict) or not cur.get("phase_multipliers"):
        return None
    index = {c: i for i, c in enumerate(state["classes"])}  # type: ignore[index]
    mult = [[float(phase[index[c]]) if c in index else 1.0 for c in label_map.classes]
            for phase in cur["phase_multipliers"]]
    return mult, [float(b) for b in cur.get("boundaries", [])]


def curriculum_unit(training: dict[str, Any]) -> str:
    """What the manifest's schedule boundaries count: ``steps`` (default) or ``epochs``."""
    cur = (_longtail_state(training) or {}).get("curriculum")
    unit = cur.get("unit") if isinstance(cur, dict) else None
    return unit if unit in ("steps", "epochs") else "steps"


# ------------------------------------------------------------------ encoded examples
@dataclass
class Encoded:
    """Tokenized rows ready for batching (one entry per kept row, or per pack)."""

    input_ids: list[list[int]]
    labels: list[list[int]] | list[int]
    row_ids: list[str]
    weights: np.ndarray
    class_ids: np.ndarray | None = None
    repeat: np.ndarray | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    packed_rows: list[list[str]] | None = None

    def __post_init__(self) -> None:
        if self.repeat is None:
            self.repeat = np.ones(len(self.input_ids), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def task(self) -> str:
        return "sft" if self.labels and isinstance(self.labels[0], list) else "classify"

    def n_tokens(self, indices: Sequence[int] | None = None) -> int:
        idx = range(len(self)) if indices is None else indices
        return sum(len(self.input_ids[i]) for i in idx)

    def collate(self, indices: Sequence[int], pad_id: int,
                multipliers: Sequence[float] | np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """Right-padded tensors for rows ``indices``: input_ids, attention_mask (0 on padding),
        labels (-100 on padding for SFT) and sample_weight (= weight x curriculum multiplier)."""
        idx = list(indices)
        if not idx:
            raise ValueError("collate needs at least one row")
        width = max(len(self.input_ids[i]) for i in idx)
        ids = torch.full((len(idx), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        sft = self.task == "sft"
        labels = torch.full((len(idx), width), IGNORE_INDEX, dtype=torch.long) if sft else None
        for r, i in enumerate(idx):
            seq = self.input_ids[i]
            ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[r, : len(seq)] = 1
            if labels is not None:
                labels[r, : len(seq)] = torch.tensor(self.labels[i], dtype=torch.long)
        if not sft:
            labels = torch.tensor([self.labels[i] for i in idx], dtype=torch.long)
        w = self.weights[idx].astype(np.float64)
        if multipliers is not None:
            w = w * np.asarray(multipliers, dtype=np.float64)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels,
                "sample_weight": torch.tensor(w, dtype=torch.float32)}


def _messages(row: Any) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": "" if m["content"] is None else str(m["content"])}
            for m in (row or [])]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and, per assistant message, the character span it adds:
    from the end of the prefix rendered with the generation prompt to the end of the prefix
    that includes the message (so the end-of-turn marker is trained too). Raises ValueError
    when the template does not render prefixes as prefixes of the whole."""
    full = _render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start_text = _render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        end_text = _render(tokenizer, messages[: i + 1])
        if not full.startswith(start_text) or not full.startswith(end_text) or len(end_text) < len(start_text):
            raise ValueError("chat template is not prefix-stable")
        spans.append((len(start_text), len(end_text)))
    return full, spans


def _token_labels(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and labels: the id inside an assistant span, else -100."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        labels = []
        for tok, (s, e) in zip(ids, enc["offset_mapping"], strict=True):
            inside = any(a <= s < b for a, b in spans) and e > s
            labels.append(tok if inside else IGNORE_INDEX)
        return ids, labels
    # slow tokenizer: token counts of the span boundaries' prefixes
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    labels = [IGNORE_INDEX] * len(ids)
    for a, b in spans:
        ta = len(tokenizer(text[:a], add_special_tokens=False)["input_ids"])
        tb = len(tokenizer(text[:b], add_special_tokens=False)["input_ids"])
        for t in range(ta, min(tb, len(ids))):
            labels[t] = ids[t]
    return ids, labels


def encode_sft(table: pa.Table, tokenizer: Any, max_length: int | None, *,
               packing: bool = False) -> Encoded:
    """Rows' ``messages`` -> token ids with the tokenizer's own chat template; loss only on
    assistant tokens; the start is kept when a row is longer than ``max_length``. Rows left
    without an assistant token are dropped and counted in ``Encoded.dropped``."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrainDataError("the tokenizer has no chat template; SFT needs one to render conversations")
    weights, repeat, ids_all = row_weights(table), row_repeat(table), _ids(table)
    dropped: Counter[str] = Counter()
    out_ids: list[list[int]] = []
    out_labels: list[list[int]] = []
    keep: list[int] = []
    for i, row in enumerate(table.column("messages").to_pylist()):
        messages = _messages(row)
        if not any(m["role"] == "assistant" for m in messages):
            dropped["no_assistant_message"] += 1
            continue
        try:
            text, spans = assistant_char_spans(tokenizer, messages)
        except ValueError:
            dropped["template_not_prefix_stable"] += 1
            continue
        ids, labels = _token_labels(tokenizer, text, spans)
        if max_length is not None and len(ids) > max_length:
            ids, labels = ids[:max_length], labels[:max_length]
        if all(x == IGNORE_INDEX for x in labels[1:]):  # label 0 is never predicted (shift by one)
            dropped["no_assistant_tokens_after_truncation"] += 1
            continue
        out_ids.append(ids)
        out_labels.append(labels)
        keep.append(i)
    if not keep:
        raise TrainDataError(f"no SFT row left to train on (dropped: {dict(dropped)})")
    enc = Encoded(input_ids=out_ids, labels=out_labels, row_ids=[ids_all[i] for i in keep],
                  weights=weights[keep], repeat=repeat[keep], dropped=dict(dropped))
    return pack(enc, max_length) if packing else enc


def pack(enc: Encoded, max_length: int | None) -> Encoded:
    """Greedy in-order packing: rows (expanded by repeat) are concatenated while the pack
    stays within ``max_length``. A pack's weight is the mean of its rows' weights."""
    if max_length is None:
        raise TrainDataError("packing needs max_length (or a length stage cap in the manifest)")
    order = np.repeat(np.arange(len(enc)), enc.repeat)
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order.tolist():
        n = len(enc.input_ids[i])
        if current and size + n > max_length:
            packs.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        packs.append(current)
    return Encoded(
        input_ids=[[t for i in p for t in enc.input_ids[i]] for p in packs],
        labels=[[t for i in p for t in enc.labels[i]] for p in packs],  # type: ignore[misc]
        row_ids=["+".join(enc.row_ids[i] for i in p) for p in packs],
        weights=np.array([float(np.mean(enc.weights[p])) for p in packs], dtype=np.float64),
        repeat=np.ones(len(packs), dtype=np.int64), dropped=dict(enc.dropped),
        packed_rows=[[enc.row_ids[i] for i in p] for p in packs])


def classify_text(messages: list[dict[str, str]]) -> str:
    """The text a classifier sees: the non-assistant contents, one per line."""
    return "\n".join(m["content"] for m in messages if m["role"] != "assistant")


def encode_classify(table: pa.Table, tokenizer: Any, label_map: LabelMap, max_length: int | None,
                    label_column: str = "label") -> Encoded:
    """Rows -> token ids of their text and the class id of their label. Rows without a
    label, or with a label the map does not know, are dropped and counted."""
    if max_length is None:
        max_length = min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)
    weights, repeat, ids_all = row_weights(table), row_repeat(table), _ids(table)
    labels = table.column(label_column).to_pylist() if label_column in table.column_names else [None] * len(ids_all)
    dropped: Counter[str] = Counter()
    keep, texts, cls = [], [], []
    for i, (row, label) in enumerate(zip(table.column("messages").to_pylist(), labels, strict=True)):
        if label is None:
            dropped["no_label"] += 1
            continue
        if str(label) not in label_map.classes:
            dropped["unknown_label"] += 1
            continue
        keep.append(i)
        texts.append(classify_text(_messages(row)))
        cls.append(label_map.id(str(label)))
    if not keep:
        raise TrainDataError(f"no labelled row left to train on (dropped: {dict(dropped)})")
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding=False)
    class_ids = np.asarray(cls, dtype=np.int64)
    return Encoded(input_ids=[list(x) for x in enc["input_ids"]], labels=class_ids.tolist(),
                   row_ids=[ids_all[i] for i in keep], weights=weights[keep], class_ids=class_ids,
                   repeat=repeat[keep], dropped=dict(dropped))


# ------------------------------------------------------------------ validation split
def split_validation(n_rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded held-out split: (train indices, validation indices), both sorted. At least one
    validation row when fraction > 0 and n_rows >= 2; never every row."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n_val = 0 if fraction == 0 or n_rows < 2 else min(max(1, math.floor(n_rows * fraction + 0.5)), n_rows - 1)
    perm = np.random.default_rng([seed, 0x5A11]).permutation(n_rows)
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


def validation_sources(manifest: dict[str, Any]) -> list[str]:
    """Input (source) names the pipeline set aside for validation: a ``splits.validation``
    list in any training section, or an overlap stage's ``validation_sources``."""
    names: list[str] = []
    for state in (manifest.get("training") or {}).values():
        splits = state.get("splits") if isinstance(state, dict) else None
        if isinstance(splits, dict) and isinstance(splits.get("validation"), list):
            names += [str(s) for s in splits["validation"]]
    for stage in (manifest.get("config") or {}).get("stages") or []:
        params = stage.get("overlap") if isinstance(stage, dict) else None
        if isinstance(params, dict):
            vs = params.get("validation_sources") or []
            names += [vs] if isinstance(vs, str) else [str(s) for s in vs]
    return sorted(set(names))


def run_split(run: RunShards, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Row indices (train, validation) of a run and where the split came from: the
    pipeline's own validation sources when the manifest names some, else a seeded fraction."""
    names = validation_sources(run.manifest)
    if names and "source" in run.table.column_names:
        src = np.array([str(s) for s in run.table.column("source").to_pylist()], dtype=object)
        is_val = np.isin(src, names)
        if is_val.any() and not is_val.all():
            return (np.flatnonzero(~is_val).astype(np.int64), np.flatnonzero(is_val).astype(np.int64),
                    f"pipeline validation sources {names}")
    train, val = split_validation(run.table.num_rows, fraction, seed)
    return train, val, f"seeded held-out fraction {fraction:g} (seed {seed})"


# ------------------------------------------------------------------ everything a run needs
@dataclass
class PreparedData:
    """A run's data, ready for the loop: encoded train/validation sets and, for classify,
    the label map and the manifest's per-class vectors in label-map order."""

    task: str
    train: Encoded
    val: Encoded | None
    max_length: int | None
    split: str
    label_map: LabelMap | None = None
    logit_offsets: list[float | None] | None = None
    class_weights: list[float | None] | None = None
    curriculum: tuple[list[list[float]], list[float]] | None = None
    warnings: list[str] = field(default_factory=list)

    def sampler(self, *, total_steps: int | None, batch_size: int, seed: int, grad_accum: int = 1,
                unit: str = "steps", epochs: int | None = None, curriculum: bool = True) -> Any:
        """The training sampler: repeat always, the curriculum when present and wanted."""
        from dataguard.train.sampler import CurriculumSampler

        use = self.curriculum if curriculum and self.train.class_ids is not None else None
        return CurriculumSampler(len(self.train), self.train.repeat, self.train.class_ids,
                                 use[0] if use else None, use[1] if use else None, total_steps,
                                 batch_size, seed, unit, grad_accum=grad_accum, epochs=epochs)


def _encode_val(encode: Any, table: pa.Table, warnings: list[str]) -> Encoded | None:
    """The validation set, or None (with a warning) when none of its rows is usable."""
    if table.num_rows == 0:
        return None
    try:
        return encode()
    except TrainDataError as exc:
        warnings.append(f"no validation set: {exc}")
        return None


def prepare_data(run: RunShards, tokenizer: Any, *, task: str, max_length: int | None = None,
                 eval_fraction: float = 0.1, seed: int = 0, packing: bool = False,
                 curriculum_boundaries: Sequence[float] | None = None) -> PreparedData:
    """Split, encode and collect the manifest's training state. ``max_length`` None takes
    the length stage's cap (SFT), with a warning when another tokenizer counted it."""
    warnings: list[str] = []
    if task == "sft" and max_length is None:
        max_length, counted_by = length_cap(run.manifest)
        if max_length is not None:
            message = tokenizer_mismatch(counted_by, tokenizer)
            if message:
                warnings.append(message)
    train_idx, val_idx, how = run_split(run, eval_fraction, seed)
    train_t, val_t = run.table.take(pa.array(train_idx)), run.table.take(pa.array(val_idx))
    if task == "sft":
        train = encode_sft(train_t, tokenizer, max_length, packing=packing)
        val = _encode_val(lambda: encode_sft(val_t, tokenizer, max_length), val_t, warnings)
        return PreparedData(task, train, val, max_length, how, warnings=warnings)
    if task != "classify":
        raise TrainDataError(f"unknown task {task!r}")
    label_map = LabelMap.from_run(run.table, run.training)
    train = encode_classify(train_t, tokenizer, label_map, max_length)
    val = _encode_val(lambda: encode_classify(val_t, tokenizer, label_map, max_length), val_t, warnings)
    schedule = curriculum_schedule(run.training, label_map)
    if schedule is not None and curriculum_boundaries is not None:
        schedule = (schedule[0], [float(b) for b in curriculum_boundaries])
    return PreparedData(task, train, val, max_length, how,
                        label_map=label_map, logit_offsets=class_vector(run.training, label_map, "logit_offsets"),
                        class_weights=class_vector(run.training, label_map, "class_weights"),
                        curriculum=schedule, warnings=warnings)
