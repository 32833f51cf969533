"""Per-process token cache: several stages of one process tokenize the same message texts of
a batch (length counts them, overlap scans their ids); this makes that happen once.

Keyed by (tokenizer name, text) and bounded by the total number of cached token ids
(``DATAGUARD_TOKEN_CACHE_TOKENS``, default 4M). Ids and counts are cached separately: counting
needs no ids, and turning ids into arrays costs ~15% of the tokenization itself, so a count
keeps ids only when its caller asks for them (``Tokenizer.count_batch(keep_ids=True)``).
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np

_CACHE_MAX_TOKENS = int(os.environ.get("DATAGUARD_TOKEN_CACHE_TOKENS", 4_000_000))


class TokenCache:
    """One tokenizer's caches: text -> token ids (LRU, bounded by total tokens) and text ->
    token count (FIFO, bounded by total characters of the cached texts)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.max_count_chars = 4 * max_tokens
        self.tokens = 0
        self.count_chars = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[str, np.ndarray] = OrderedDict()
        self._counts: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def get(self, text: str) -> np.ndarray | None:
        ids = self._data.get(text)
        if ids is not None:
            self._data.move_to_end(text)
            self.hits += 1
        else:
            self.misses += 1
        return ids

    def count(self, text: str) -> int | None:
        c = self._counts.get(text)
        if c is None:
            ids = self._data.get(text)
            if ids is None:
                self.misses += 1
                return None
            c = len(ids)
        self.hits += 1
        return c

    def put(self, text: str, ids: np.ndarray) -> None:
        if self.max_tokens <= 0 or len(ids) > self.max_tokens:
            return
        if text in self._data:
            return
        self._data[text] = ids
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            _, old = self._data.popitem(last=False)
            self.tokens -= len(old)

    def put_count(self, text: str, count: int) -> None:
        if self.max_tokens <= 0 or len(text) > self.max_count_chars or text in self._counts:
            return
        self._counts[text] = count
        self.count_chars += len(text)
        while self.count_chars > self.max_count_chars:  # dicts keep insertion order: FIFO
            old = next(iter(self._counts))
            del self._counts[old]
            self.count_chars -= len(old)

    def clear(self) -> None:
        self._data.clear()
        self._counts.clear()
        self.tokens = self.count_chars = self.hits = self.misses = 0


_CACHES: dict[str, TokenCache] = {}


def cache_for(name: str) -> TokenCache:
    cache = _CACHES.get(name)
    if cache is None:
        cache = _CACHES[name] = TokenCache(_CACHE_MAX_TOKENS)
    return cache


def token_cache_info() -> dict[str, dict[str, int]]:
    """Hits, misses and cached tokens per tokenizer name (for tests and benchmarks)."""
    return {
        name: {"hits": c.hits, "misses": c.misses, "tokens": c.tokens, "texts": len(c._data),
               "counted_texts": len(c._counts)}
        for name, c in _CACHES.items()
    }


def clear_token_cache(max_tokens: int | None = None) -> None:
    """Empty every cache; optionally change the bound (0 disables caching)."""
    global _CACHE_MAX_TOKENS
    if max_tokens is not None:
        _CACHE_MAX_TOKENS = max_tokens
    for cache in _CACHES.values():
        cache.clear()
        cache.max_tokens = _CACHE_MAX_TOKENS
        cache.max_count_chars = 4 * _CACHE_MAX_TOKENS
