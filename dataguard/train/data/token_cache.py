"""Token ids encoded once into Arrow beside the run, memory-mapped by every start after.

Why: encoding renders every conversation through the chat template and tokenizes it, ~580k
tokens per CPU-second, and Python lists of ids cost 40+ bytes per token. A run that resumes,
and every process of a multi-GPU run, paid both again. The cache is paid once and held as
4 bytes per token id plus 1 byte of loss mask, in pages the kernel shares and reclaims
(a memory map), not in the process's own heap.

Layout: ``RUN/token_cache/<key>/<split>.arrow`` (an Arrow IPC file: ``input_ids``
list<int32>; ``loss_mask`` list<uint8> for SFT, an id's label being the id where the mask is
1 and -100 elsewhere; ``class_id`` int64 for classify; ``row_id``, ``weight``, ``repeat``)
and ``<split>.json`` (what encoding dropped and why, rows, tokens, the Arrow file's sha256),
written last: a split without its JSON is incomplete and rebuilt, and so is one whose JSON
is unreadable or whose Arrow file no longer matches its sha256 (a damaged cache is never
trained on: bad ids would train silently, a torn file would stop the run; it can always be
encoded again). The key hashes everything the ids depend on: the
shards' manifest (their sha256 sums), the rows of the split, the tokenizer (its full
serialisation, special tokens and chat template), ``max_length``, the task and label map, and
``ENCODER_VERSION`` (raised whenever `dataguard.train.data.encode` changes its output).

Building streams ``CHUNK_ROWS`` rows at a time into the file, so encoding never holds the
whole run's ids as lists. Concurrent processes take a lock per key: one builds, the others
wait and map the result. Packing (``packing: true``) packs the mapped rows into lists.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.io.readers import file_sha256
from dataguard.io.safe_files import LinkRefused, atomic_writer, open_nofollow, write_atomic
from dataguard.train.data.encode import IGNORE_INDEX
from dataguard.train.data.encoded import Encoded
from dataguard.train.tasks import get_task

ENCODER_VERSION = 1
CHUNK_ROWS = 2048
FOLDER = "token_cache"


class TokenRows(Sequence):
    """Row ``i`` of a list<int> column as a read-only numpy view into the mapped file (no
    copy); the file's record batches stay separate (joining them would copy them all)."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.chunks = chunks  # (values, offsets) per record batch
        self.starts = np.cumsum([0] + [len(off) - 1 for _, off in chunks])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _span(self, i: int) -> tuple[int, int, int]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        c = int(np.searchsorted(self.starts, i, side="right")) - 1
        offsets = self.chunks[c][1]
        local = i - int(self.starts[c])
        return c, int(offsets[local]), int(offsets[local + 1])

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        c, a, b = self._span(int(i))
        return self.chunks[c][0][a:b]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


class MaskedLabels(TokenRows):
    """SFT labels rebuilt per row from the ids and the loss mask: id where 1, -100 where 0."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray]], masks: list[np.ndarray]) -> None:
        super().__init__(chunks)
        self.masks = masks

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        c, a, b = self._span(int(i))
        return np.where(self.masks[c][a:b] != 0, self.chunks[c][0][a:b], IGNORE_INDEX).astype(np.int64)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of what decides the ids: the tokenizer's full serialisation (fast) or vocabulary
    (slow), its special tokens and its chat template."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode("utf-8"))
    h.update(json.dumps([type(tokenizer).__name__, str(getattr(tokenizer, "chat_template", None)),
                         tokenizer.all_special_tokens, getattr(tokenizer, "padding_side", None)]).encode("utf-8"))
    return h.hexdigest()


def cache_key(*, task: str, manifest: dict[str, Any], indices: np.ndarray, tokenizer: Any,
              max_length: int | None, classes: Sequence[str] | None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"version": ENCODER_VERSION, "task": task, "max_length": max_length,
                         "classes": list(classes) if classes is not None else None,
                         "shards": [(e.get("path"), e.get("sha256"), e.get("rows"))
                                    for e in manifest["outputs"]["data"]]}, sort_keys=True).encode("utf-8"))
    h.update(np.ascontiguousarray(indices, dtype=np.int64).tobytes())
    h.update(tokenizer_fingerprint(tokenizer).encode("ascii"))
    return h.hexdigest()[:24]


def cached_encoding(folder: Path, split: str, make_table: Callable[[], pa.Table],
                    encode: Callable[[pa.Table], Encoded], task: str,
                    note: Callable[[str], None] | None = None) -> Encoded:
    """The split's encoding from ``folder``, built first when missing from ``make_table()``
    (called only then) with ``encode``, which must accept chunks that keep no row."""
    folder.mkdir(parents=True, exist_ok=True)

    def trusted() -> tuple[bool, str | None]:
        present = (folder / f"{split}.json").is_file()
        damage = _damage(folder, split) if present else None
        return present and damage is None, damage

    with open_nofollow(folder / f".{split}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_SH)  # every process checks the sums at once
        try:
            ok, damage = trusted()
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        if not ok:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # one process builds; the others wait, then map
            try:
                ok, damage = trusted()  # another process may have built it meanwhile
                if not ok:
                    _build(folder, split, make_table(), encode, task)
                    if note is not None:
                        note(f"token cache: {split} not trusted ({damage}); encoded it again into {folder}"
                             if damage else f"token cache: encoded {split} into {folder}")
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        if ok and note is not None:
            note(f"token cache: reusing {folder / split}.arrow")
    return load(folder, split)


def _damage(folder: Path, split: str) -> str | None:
    """Why the split's cache cannot be trusted (None: its Arrow file matches the sha256 its
    JSON recorded). A link planted for the Arrow file is refused, not rebuilt over."""
    arrow = folder / f"{split}.arrow"
    if arrow.is_symlink():
        raise LinkRefused(arrow)
    try:
        meta = json.loads((folder / f"{split}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable {split}.json: {exc}"
    want = meta.get("sha256") if isinstance(meta, dict) else None
    if not isinstance(want, str):
        return f"built by an older dataguard: {split}.json records no sha256"
    try:
        got = file_sha256(arrow)
    except OSError as exc:
        return f"unreadable {split}.arrow: {exc}"
    return None if got == want else f"{split}.arrow does not match its sha256"


def _batches(source: Any) -> list[pa.RecordBatch]:
    reader = pa.ipc.open_file(source)
    return [b for b in (reader.get_batch(i) for i in range(reader.num_record_batches)) if b.num_rows]


def _per_token(task: str) -> bool:
    """Labels per token (a loss mask is stored) or one class id per row."""
    return not get_task(task).has_classes


def _schema(task: str) -> pa.Schema:
    fields = [pa.field("input_ids", pa.list_(pa.int32()))]
    fields.append(pa.field("loss_mask", pa.list_(pa.uint8())) if _per_token(task) else pa.field("class_id", pa.int64()))
    return pa.schema(fields + [pa.field("row_id", pa.string()), pa.field("weight", pa.float64()),
                               pa.field("repeat", pa.int64())])


def _batch(enc: Encoded, task: str, schema: pa.Schema) -> pa.RecordBatch:
    ids = pa.array(enc.input_ids, type=pa.list_(pa.int32()))
    if _per_token(task):  # the mask from the flattened labels in one array operation
        labels = pa.array(enc.labels, type=pa.list_(pa.int64()))
        flags = pc.cast(pc.not_equal(labels.flatten(), IGNORE_INDEX), pa.uint8())
        second = pa.ListArray.from_arrays(labels.offsets, flags)
    else:
        second = pa.array(np.asarray(enc.class_ids, dtype=np.int64))
    return pa.record_batch([ids, second, pa.array(enc.row_ids, pa.string()),
                            pa.array(np.asarray(enc.weights, dtype=np.float64)),
                            pa.array(np.asarray(enc.repeat, dtype=np.int64))], schema=schema)


def _build(folder: Path, split: str, table: pa.Table, encode: Callable[[pa.Table], Encoded], task: str) -> None:
    schema = _schema(task)
    dropped: dict[str, int] = {}
    rows = tokens = folded = 0
    with atomic_writer(folder / f"{split}.arrow") as handle, pa.ipc.new_file(handle, schema) as writer:
        for start in range(0, max(table.num_rows, 1), CHUNK_ROWS):
            enc = encode(table.slice(start, CHUNK_ROWS))
            for reason, n in enc.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + int(n)
            folded += enc.folded_system
            if len(enc):
                writer.write_batch(_batch(enc, task, schema))
                rows += len(enc)
                tokens += enc.n_tokens()
    write_atomic(folder / f"{split}.json", json.dumps({"rows": rows, "tokens": tokens, "dropped": dropped,
                                                       "folded_system": folded, "task": task,
                                                       "sha256": file_sha256(folder / f"{split}.arrow")},
                                                      sort_keys=True) + "\n")


def load(folder: Path, split: str) -> Encoded:
    """The split's encoding, memory-mapped (an empty split gives an Encoded of no rows)."""
    meta = json.loads((folder / f"{split}.json").read_text(encoding="utf-8"))
    try:  # refuse a link planted in the cache
        os.close(os.open(folder / f"{split}.arrow", os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefused(folder / f"{split}.arrow") from None
        raise
    source = pa.memory_map(str(folder / f"{split}.arrow"), "r")
    batches = _batches(source)
    task = meta["task"]
    chunks, masks = [], []
    for batch in batches:
        ids = batch.column("input_ids")
        chunks.append((ids.values.to_numpy(zero_copy_only=True), ids.offsets.to_numpy()))
        if _per_token(task):
            masks.append(batch.column("loss_mask").values.to_numpy(zero_copy_only=True))
    input_ids = TokenRows(chunks)
    table = pa.Table.from_batches(batches, schema=_schema(task))
    if _per_token(task):
        labels: Any = MaskedLabels(chunks, masks)
        class_ids = None
    else:
        class_ids = np.asarray(table.column("class_id").to_numpy(), dtype=np.int64)
        labels = class_ids.tolist()
    return Encoded(input_ids=input_ids, labels=labels,  # type: ignore[arg-type]
                   row_ids=[str(x) for x in table.column("row_id").to_pylist()],
                   weights=np.asarray(table.column("weight").to_numpy(), dtype=np.float64),
                   class_ids=class_ids, repeat=np.asarray(table.column("repeat").to_numpy(), dtype=np.int64),
                   dropped={k: int(v) for k, v in meta["dropped"].items()}, folded_system=int(meta["folded_system"]))
