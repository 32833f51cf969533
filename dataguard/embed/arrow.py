"""Kept embeddings as Arrow columns, and their reuse by later stages.

A stage that embeds texts can keep the vectors as a ``fixed_size_list<float32>[dim]``
column (`to_arrow`); a later stage calls `embeddings_for`, which reads that column back as
a numpy matrix (`to_numpy`, zero-copy) when it was made by the same model, backend and
length (`Embedder.model_id`, stored in the field metadata) and has the right size, and
only otherwise runs the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from dataguard.embed.embedder import Embedder

MODEL_METADATA_KEY = b"dataguard.embedding_model"


def embedding_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def to_arrow(matrix: np.ndarray, valid: np.ndarray | None = None) -> pa.FixedSizeListArray:
    """(n, dim) float32 -> fixed_size_list<float32>[dim]; rows where ``valid`` is False are null."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    n, dim = matrix.shape
    values = pa.array(matrix.reshape(-1), pa.float32())
    mask = None if valid is None else pa.array(~np.asarray(valid, dtype=bool))
    return pa.FixedSizeListArray.from_arrays(values, dim, mask=mask)


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """fixed_size_list<float32>[dim] -> (n, dim) float32; null rows become NaN rows."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    dim = column.type.list_size
    n = len(column)
    if n == 0:
        return np.zeros((0, dim), dtype=np.float32)
    start = column.offset * dim  # .values ignores slicing: cut the child to this slice
    values = column.values.slice(start, n * dim).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    matrix = values.reshape(n, dim)
    if column.null_count:
        matrix = matrix.copy()
        matrix[~np.asarray(column.is_valid())] = np.nan
    return matrix


def embeddings_for(table: pa.Table, column: str, texts: Sequence[str], embedder: Embedder) -> np.ndarray:
    """Reuse ``table[column]`` if a stage already stored embeddings from this setup, else encode."""
    if column in table.column_names:
        field = table.schema.field(column)
        made_by = (field.metadata or {}).get(MODEL_METADATA_KEY)
        if (pa.types.is_fixed_size_list(field.type) and field.type.list_size == embedder.dimension
                and (made_by is None or made_by.decode() == embedder.model_id)):
            return to_numpy(table.column(column))
    return embedder.encode(texts)


def embedding_field(name: str, dim: int, model_id: str) -> pa.Field:
    """The schema field for a kept embedding column, tagged with the model that made it."""
    return pa.field(name, embedding_type(dim), metadata={MODEL_METADATA_KEY: model_id.encode()})
