"""The tokenizer interface every token-counting stage uses: batched, cached (one cache per
process, see ``token_cache``) and picklable; subclasses only run their tokenizer.

Record-level counts are ``sum(content tokens) + template_overhead(roles)``: message contents
are tokenized once, and the tokens the chat template adds around them are measured once per
role sequence by rendering the template with empty contents. That keeps the hot path free of
per-record Jinja; the price is that BPE merges across a template/content boundary are not seen
(off by at most a token or two per message).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataguard.text.token_cache import cache_for


class Tokenizer(ABC):
    """Batched, cached tokenization. Subclasses implement ``_encode_lists`` (the tokenizer call)."""

    name: str

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids (uint32 arrays) of each text, without special tokens or template."""
        cache = cache_for(self.name)
        out: list[np.ndarray | None] = [cache.get(t) for t in texts]
        missing = [i for i, ids in enumerate(out) if ids is None]
        if missing:
            # Duplicate texts inside one batch are encoded once.
            pending = list(dict.fromkeys(texts[i] for i in missing))
            fresh = dict(zip(pending, self._encode_uncached(pending), strict=True))
            if cache.enabled:
                for text, ids in fresh.items():
                    # A copy: a cached view would keep its whole batch's flat array alive.
                    cache.put(text, ids.copy())
            for i in missing:
                out[i] = fresh[texts[i]]
        return out  # type: ignore[return-value]

    def count_batch(self, texts: Sequence[str], *, keep_ids: bool = False) -> np.ndarray:
        """Number of tokens of each text (int64). The hot path of the length stage: token
        lists are counted, never turned into arrays. ``keep_ids``: also cache the ids of the
        texts tokenized here, for a caller that will ask ``encode_batch`` for them next."""
        cache = cache_for(self.name)
        if not cache.enabled:
            return np.array(self._count_uncached(texts), dtype=np.int64).reshape(len(texts))
        out = np.zeros(len(texts), dtype=np.int64)
        missing = []
        for i, t in enumerate(texts):
            c = cache.count(t)
            if c is None:
                missing.append(i)
            else:
                out[i] = c
        if missing:
            pending = list(dict.fromkeys(texts[i] for i in missing))
            if keep_ids:
                lists = self._encode_lists(pending)
                counts = dict(zip(pending, map(len, lists), strict=True))
                for text, ids in zip(pending, _split_flat(lists), strict=True):
                    cache.put(text, ids.copy())
            else:
                counts = dict(zip(pending, self._count_uncached(pending), strict=True))
            for text, c in counts.items():
                cache.put_count(text, c)
            for i in missing:
                out[i] = counts[texts[i]]
        return out

    def _encode_uncached(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode distinct texts to uint32 arrays."""
        return _split_flat(self._encode_lists(texts))

    @abstractmethod
    def _encode_lists(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text as Python lists: the tokenizer call itself."""

    def _count_uncached(self, texts: Sequence[str]) -> list[int]:
        """Token counts of each text (subclasses may avoid holding every id list at once)."""
        return [len(ids) for ids in self._encode_lists(texts)]

    @abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of token ids (invalid UTF-8 fragments replaced)."""

    @abstractmethod
    def template_overhead(self, roles: Sequence[str]) -> int:
        """Tokens the chat template adds to a conversation with these roles, beyond contents."""

    def message_overheads(self, roles: Sequence[str]) -> np.ndarray | None:
        """Per-message template tokens when the template is additive per message (else None)."""
        return None

    def count_records(self, messages: Sequence[Sequence[dict[str, Any]]]) -> tuple[list[np.ndarray], np.ndarray]:
        """Per-message content token counts and per-record totals (contents + template)."""
        flat = [m.get("content") or "" for msgs in messages for m in (msgs or [])]
        counts = self.count_batch(flat)
        per_msg: list[np.ndarray] = []
        totals = np.zeros(len(messages), dtype=np.int64)
        pos = 0
        for i, msgs in enumerate(messages):
            k = len(msgs or [])
            c = counts[pos:pos + k]
            per_msg.append(c)
            totals[i] = int(c.sum()) + self.template_overhead(tuple(m.get("role") or "" for m in (msgs or [])))
            pos += k
        return per_msg, totals

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _split_flat(lists: list[list[int]]) -> list[np.ndarray]:
    """Lists of ids -> uint32 views of one flat array (one conversion instead of one per text:
    measured 4.8 vs 7.5 us/row on Alpaca rows, against ~25-50 us/row for the BPE itself)."""
    lens = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    flat = np.array(list(itertools.chain.from_iterable(lists)), dtype=np.uint32)
    ends = np.cumsum(lens)
    return [flat[s:e] for s, e in zip((ends - lens).tolist(), ends.tolist(), strict=True)]
