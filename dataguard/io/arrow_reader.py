"""Parquet and Hugging Face dataset readers: Arrow rows become plain records, sized and
depth-checked from the Arrow data so no oversized or deeply nested row is built in Python.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dataguard.io.bounded import InputError, Row, oversize, preview
from dataguard.io.input_spec import InputSpec
from dataguard.io.jsonscan import MAX_DEPTH

# Arrow rows are converted to Python in batches of about this many bytes.
ARROW_BATCH_BYTES = 64 << 20


def _type_depth(t: Any) -> int:
    """Nesting of lists/structs/maps in an Arrow type (0 for a scalar), without recursion."""
    import pyarrow as pa

    deepest, stack = 0, [(t, 0)]
    while stack:
        typ, depth = stack.pop()
        if isinstance(typ, pa.ExtensionType):
            typ = typ.storage_type
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        if pa.types.is_map(typ):
            stack += [(typ.key_type, depth + 1), (typ.item_type, depth + 1)]
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
            stack.append((typ.value_type, depth + 1))
        elif pa.types.is_struct(typ):
            stack += [(typ.field(i).type, depth + 1) for i in range(typ.num_fields)]
        deepest = max(deepest, depth)
    return deepest


def _value_nbytes(arr: Any) -> np.ndarray:
    """Approximate bytes of each value of an Arrow array (text/binary lengths summed through
    lists and structs), vectorised: the size check needs no Python objects."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    typ = arr.type
    if pa.types.is_dictionary(typ):
        arr = arr.dictionary_decode()
        typ = arr.type
    n = len(arr)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) \
            or pa.types.is_large_binary(typ):
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_map(typ):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        child = arr.values  # the whole child: `offsets` index into it even when `arr` is a slice
        sums = np.concatenate([[0], np.cumsum(_value_nbytes(child))])
        return sums[offsets[1:]] - sums[offsets[:-1]] + 8
    if pa.types.is_fixed_size_list(typ):
        per = _value_nbytes(arr.flatten())
        return per.reshape(n, typ.list_size).sum(axis=1) if n else np.zeros(0, np.int64)
    if pa.types.is_struct(typ):
        total = np.full(n, 2, np.int64)
        for child in arr.flatten():
            total += _value_nbytes(child)
        return total
    width = typ.bit_width // 8 if hasattr(typ, "bit_width") and typ.bit_width >= 8 else 8
    return np.full(n, width, np.int64)


def _row_nbytes(table: Any) -> np.ndarray:
    try:
        total = np.zeros(table.num_rows, np.int64)
        for column in table.columns:
            total += _value_nbytes(column)
        return total
    except Exception:  # noqa: BLE001 - an exotic type: measure the rows one by one instead
        return np.array([len(_dump_row(table.slice(i, 1))) for i in range(table.num_rows)], np.int64)


def _dump_row(one_row: Any) -> bytes:
    """One Arrow row as JSON bytes (for a preview and a hash); text that is not UTF-8 escaped."""
    try:
        rows = one_row.to_pylist()
    except (UnicodeDecodeError, ValueError):
        try:
            rows = _binary_view(one_row).to_pylist()
        except (UnicodeDecodeError, ValueError):  # bad text nested in a list or struct
            return b"[a row holding nested text that is not UTF-8]"
        except Exception:  # noqa: BLE001 - see _arrow_rows: a value Python cannot hold
            return b"[a row holding a value Python cannot hold]"
    except Exception:  # noqa: BLE001 - see _arrow_rows
        return b"[a row holding a value Python cannot hold]"
    return json.dumps(_plain(rows[0]), ensure_ascii=False, sort_keys=True, default=str).encode("utf-8", "replace")


def _binary_view(table: Any) -> Any:
    """The table with text columns as binary, for rows whose text is not valid UTF-8."""
    import pyarrow as pa

    cols = []
    for column in table.columns:
        if pa.types.is_string(column.type):
            column = column.cast(pa.binary())
        elif pa.types.is_large_string(column.type):
            column = column.cast(pa.large_binary())
        cols.append(column)
    return pa.Table.from_arrays(cols, names=table.column_names)


def _arrow_rows(table: Any, position: int, max_bytes: int) -> Iterator[Row]:
    """Rows of an Arrow table as plain records; an oversized row is rejected from its Arrow
    size (the record itself is only serialised to keep a preview and a hash), a row with
    invalid UTF-8 text is ``invalid_utf8``, a row holding a value Python cannot represent
    (a date past year 9999, as pandas may write) is ``wrong_type``."""
    sizes = _row_nbytes(table)
    big = sizes > max_bytes
    good_rows: list[Any] | None = None
    if not big.any():
        try:
            good_rows = table.to_pylist()
        except Exception:  # noqa: BLE001 - some row cannot be converted: find it row by row below
            good_rows = None
    for i in range(table.num_rows):
        where = f"row {position + i}"
        if big[i]:
            data = _dump_row(table.slice(i, 1))
            info = oversize(data)
            detail = (f"{where} is about {int(sizes[i]):,} bytes (limit {max_bytes:,}); "
                      f"sha256 of its JSON {info.sha256}")
            yield position + i, None, "record_too_large", detail, info.raw()
            continue
        if good_rows is not None:
            yield position + i, _plain(good_rows[i]), None, None, None
            continue
        one = table.slice(i, 1)
        try:
            yield position + i, _plain(one.to_pylist()[0]), None, None, None
        except (UnicodeDecodeError, ValueError) as exc:
            yield (position + i, None, "invalid_utf8", f"{where}: text that is not UTF-8 ({exc})",
                   preview(_dump_row(one)))
        except Exception as exc:  # noqa: BLE001 - OverflowError and kin: pyarrow's types outrun Python's
            yield (position + i, None, "wrong_type", f"{where}: a value cannot be read into Python "
                   f"({type(exc).__name__}: {exc})", preview(_dump_row(one)))


def _too_deep_rows(position: int, n: int, depth: int) -> Iterator[Row]:
    for i in range(n):
        yield (position + i, None, "too_deep",
               f"row {position + i}: the schema nests lists/structs {depth} levels (limit {MAX_DEPTH})", "")


def parquet_plan(parquet: Any, batch_rows: int) -> tuple[int, int]:
    """(schema nesting depth, rows converted at a time) of a Parquet file, from its footer:
    shared by the whole-file reader and the worker splits so both cut the same chunks."""
    depth = 1 + max((_type_depth(f.type) for f in parquet.schema_arrow), default=0)
    meta = parquet.metadata
    avg = max(1, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) // max(1, meta.num_rows))
    return depth, max(1, min(batch_rows, ARROW_BATCH_BYTES // avg))


def read_parquet(path: Path, source: str, batch_rows: int, max_bytes: int) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        depth, rows_per_batch = parquet_plan(parquet, batch_rows)
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means "not a readable parquet file"
        yield (0, None, "unreadable_file", f"not a readable Parquet file: {exc}", "")
        return
    if depth > MAX_DEPTH:
        yield from _too_deep_rows(0, parquet.metadata.num_rows, depth)
        return
    position = 0
    batches = parquet.iter_batches(batch_size=rows_per_batch)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - a damaged row group: keep what was read, report the rest
            yield (position, None, "unreadable_file",
                   f"Parquet data unreadable after {position} rows ({type(exc).__name__}: {exc}); the rest is lost", "")
            return
        yield from _arrow_rows(pa.Table.from_batches([batch]), position, max_bytes)
        position += batch.num_rows


def _load_dataset(spec: InputSpec, source: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise InputError(f"input {source!r}: reading a dataset folder or .arrow file needs `datasets`") from None
    path = Path(spec.path)
    if path.is_dir() and not any((path / name).is_file() for name in _DATASET_FILES):
        raise InputError(f"input {source!r}: {path} is a folder but not a saved Hugging Face dataset "
                         f"(no {', '.join(_DATASET_FILES)}); give a data file or a dataset saved with save_to_disk")
    try:
        if path.is_file():
            return _ipc_file_dataset(datasets, path) if _is_ipc_file(path) else datasets.Dataset.from_file(str(path))
        return datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - whatever `datasets` raises, the user gets one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "an Arrow file" if path.is_file() else "a Hugging Face dataset"
        raise InputError(f"input {source!r}: {path} cannot be read as {kind} ({type(exc).__name__}: {reason})") \
            from None


_DATASET_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")
IPC_FILE_MAGIC = b"ARROW1"


def _is_ipc_file(path: Path) -> bool:
    """An Arrow IPC *file* (Feather v2: what ``pyarrow.feather.write_feather`` writes) starts
    with ``ARROW1``; ``datasets`` reads only the IPC *stream* format, which does not."""
    with open(path, "rb") as f:
        return f.read(len(IPC_FILE_MAGIC)) == IPC_FILE_MAGIC


def _ipc_file_dataset(datasets: Any, path: Path) -> Any:
    """An Arrow IPC file as a `datasets.Dataset` (memory-mapped where not compressed). Its
    fingerprint is the file's stamp, so a worker refuses a file rewritten during the run as
    it does a saved dataset (`dataguard.io.hf_split`)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    from datasets.table import InMemoryTable

    st = path.stat()
    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode()
    return datasets.Dataset(InMemoryTable(table), fingerprint=hashlib.sha256(stamp).hexdigest()[:16])


def open_dataset(spec: InputSpec, source: str) -> Any:
    """The input's `datasets.Dataset` (loaded from its path unless given in memory); a
    DatasetDict or anything else is one InputError."""
    dataset = spec.dataset if spec.dataset is not None else _load_dataset(spec, source)
    if isinstance(dataset, dict):  # a DatasetDict (a dict of splits; it has column_names too)
        splits = ", ".join(map(str, dataset)) or "none"
        raise InputError(f"input {source!r} is a DatasetDict with splits {splits}; name one split "
                         f"(e.g. {spec.path}/{next(iter(dataset), 'train')})")
    if not hasattr(dataset, "with_format") or not hasattr(dataset, "__len__"):
        raise InputError(f"input {source!r}: expected a datasets.Dataset, got {type(dataset).__name__}")
    return dataset


def dataset_plan(dataset: Any, batch_rows: int) -> tuple[int, int]:
    """(schema nesting depth, rows converted at a time) of a non-empty dataset: shared by
    the whole reader and the worker splits."""
    first = dataset.with_format("arrow")[0:1]
    depth = 1 + max((_type_depth(f.type) for f in first.schema), default=0)
    avg = max(1, int(_row_nbytes(first).sum()))
    try:
        avg = max(avg, dataset.data.nbytes // max(1, dataset.data.num_rows))
    except Exception:  # noqa: BLE001 - only a batch-size hint
        pass
    return depth, max(1, min(batch_rows, ARROW_BATCH_BYTES // avg))


def read_hf(spec: InputSpec, source: str, batch_rows: int, max_bytes: int) -> Iterator[Row]:
    dataset = open_dataset(spec, source)
    arrow = dataset.with_format("arrow")
    n = len(dataset)
    if not n:
        return
    depth, step = dataset_plan(dataset, batch_rows)
    if depth > MAX_DEPTH:
        yield from _too_deep_rows(0, n, depth)
        return
    for start in range(0, n, step):
        yield from _arrow_rows(arrow[start: start + step], start, max_bytes)


def _plain(value: Any) -> Any:
    """Make Parquet/Arrow values JSON-like (NaN floats become null; bytes become text)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
