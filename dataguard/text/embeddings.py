"""Kept for imports: the embedding code lives in `dataguard.embed` (one module per backend)."""

from dataguard.embed import (  # noqa: F401
    BACKENDS,
    DEFAULT_BACKEND,
    MODEL_METADATA_KEY,
    Embedder,
    EmbedderConfigError,
    check_device,
    check_model_path,
    default_model_path,
    embedding_field,
    embedding_type,
    embeddings_for,
    stage_embedder,
    to_arrow,
    to_numpy,
)
