"""Sentence embeddings for the consistency, semantic-dedup, noise and drift stages.

One `Embedder` interface, four backends (``backend:`` in a stage's config):

* ``torch`` - sentence-transformers, the reference: fp32 on the CPU, fp16 with batches of
  at least 256 on CUDA;
* ``torch-bf16`` - the same transformer in bfloat16 on the CPU (pooling and norm in fp32):
  1.2x ``onnx-int8`` for one process on a CPU with AMX, no faster with two busy workers;
* ``onnx`` / ``onnx-int8`` - ONNX Runtime on the CPU, the model exported once from its local
  folder (int8: dynamically quantized weights); the default, ``onnx-int8``, was picked from
  ``benchmarks/bench_consistency.py``'s backend table;
* ``static`` - a model2vec static model distilled once from the same folder: a token table
  lookup plus mean pooling, ~50x faster than the transformer and much less precise.

Exports and distillations go to the dataguard cache (`dataguard.embed.cache`), keyed by a
hash of the model's files and the build settings. Every backend reads at most
``max_seq_length`` tokens per text: by default the length the model was trained with (128
for all-MiniLM-L6-v2; sentence-transformers' own config for it says 256). Output is
L2-normalised float32, so a dot product is the cosine similarity; identical texts in one
call are embedded once. Models load lazily in the process that uses them and are dropped
when the embedder is pickled.
"""

from dataguard.embed.arrow import (
    MODEL_METADATA_KEY,
    embedding_field,
    embedding_type,
    embeddings_for,
    to_arrow,
    to_numpy,
)
from dataguard.embed.embedder import Embedder, stage_embedder
from dataguard.embed.settings import (
    BACKENDS,
    DEFAULT_BACKEND,
    EmbedderConfigError,
    check_device,
    check_model_path,
    default_model_path,
)

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "MODEL_METADATA_KEY", "Embedder", "EmbedderConfigError", "check_device",
           "check_model_path", "default_model_path", "embedding_field", "embedding_type", "embeddings_for",
           "stage_embedder", "to_arrow", "to_numpy"]
