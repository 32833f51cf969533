"""Exact-duplicate detection over the whole dataset, by a 64-bit hash of the normalized content.

``score`` hashes each row (blake2b, 8 bytes -> uint64) over its turns: role and content,
with surrounding whitespace stripped from each content (trailing newlines and indentation
differences are export noise, not different training examples). ``scope="messages"``
hashes the whole conversation; ``scope="prompt"`` only the system/user/tool turns, so two
answers to the same prompt count as duplicates. In both scopes the tool definitions kept in
``meta["tools"]`` (ShareGPT ``tools``) are hashed too, because the model is trained with
them in its input: glaive_toolcall has 38 repeated conversations, of which 3 come with
different tool lists, so 35 are exact duplicates (as its SOURCE.md counts); an empty tool
list (``[]`` or ``""``) counts as none. The label is not hashed: the same text
under two labels is a duplicate here (the label-noise stage deals with the conflict).
A preference pair (the chosen response as the final assistant turn, the rejected one in
``meta["rejected"]``) is hashed, in scope ``messages``, as its prompt turns and the SET of its
two responses: two pairs that differ only in the rejected response are different examples,
and a pair repeated with its labels swapped (chosen and rejected exchanged: the same
comparison, judged both ways) is caught as a copy of the first, so preference training never
sees both.

In a pipeline run the fit is one round of hash-range tasks (`dedup_rounds`: the driver holds
no hash), with the same result as the in-memory path below.
``summarize`` keeps, per batch, each distinct hash once with the id of its first row;
``fit`` merges them in input order, so the first occurrence in the whole input wins.
``apply`` adds ``is_duplicate`` and ``duplicate_of`` (id of the first occurrence, null for
originals) and, with ``action="drop"``, rejects the later copies as ``exact_duplicate``.
Ids must be unique across the run (normalization guarantees it per source).
With 64-bit hashes the chance of any false match among 10^8 rows is ~3e-4.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import Options
from dataguard.records import PROMPT_ROLES, set_column
from dataguard.stage import Outcome, Stage, drop_or_keep
from dataguard.stages.dedup_rounds import (
    ROWS_PER_TASK,
    DedupUnitSummary,
    first_ids,
    run_first_rows,
    write_unit_hashes,
)
from dataguard.tally import Tally

if TYPE_CHECKING:
    from dataguard.rounds.tasks import RoundContext, UnitFitFiles

ACTIONS = ("flag", "drop")
SCOPES = ("messages", "prompt")
REASON = "exact_duplicate"
MAX_EXAMPLES = 20
SNIPPET_CHARS = 200


@dataclass
class DedupSummary:
    """Distinct hashes of one batch (first-occurrence order), the id of their first row, and
    which of them occur again later in the same batch (None: not recorded, so assume so)."""

    hashes: np.ndarray  # uint64
    first_ids: list[str]
    repeated: np.ndarray | None = None  # bool per hash


def content_hashes(table: pa.Table, scope: str = "messages") -> np.ndarray:
    """uint64 hash per row of the (stripped) turns in `scope`; same content -> same hash."""
    msgs = table.column("messages").combine_chunks() if table.num_rows else None
    if msgs is None:
        return np.zeros(0, dtype=np.uint64)
    flat = msgs.flatten()
    roles = flat.field("role").to_pylist()
    contents = pc.utf8_trim_whitespace(flat.field("content")).to_pylist()
    offsets = msgs.offsets.to_numpy()
    metas = table.column("meta").to_pylist() if "meta" in table.column_names else [None] * table.num_rows
    out = np.empty(table.num_rows, dtype=np.uint64)
    wanted = PROMPT_ROLES if scope == "prompt" else None
    for i in range(table.num_rows):
        h = hashlib.blake2b(digest_size=8)
        tools = tools_key(metas[i])
        if tools:
            h.update(b"tools\x1f" + tools.encode("utf-8", "surrogatepass") + b"\x1e")
        end = offsets[i + 1]
        rejected = rejected_response(metas[i]) if wanted is None else None
        pair = rejected is not None and end > offsets[i] and roles[end - 1] == "assistant"
        for j in range(offsets[i], end - 1 if pair else end):
            role = roles[j]
            if wanted is not None and role not in wanted:
                continue
            h.update(role.encode())
            h.update(b"\x1f")
            h.update((contents[j] or "").encode("utf-8", "surrogatepass"))
            h.update(b"\x1e")
        if pair:  # the two responses as a set: a pair and its copy with the labels swapped match
            for text in sorted([contents[end - 1] or "", str(rejected).strip()]):
                h.update(b"pair\x1f" + text.encode("utf-8", "surrogatepass") + b"\x1e")
        out[i] = int.from_bytes(h.digest(), "little")
    return out


class DedupStage(Stage):
    """Flags (or drops) rows whose content already appeared earlier in the input."""

    name = "dedup"
    needs_fit = True
    constraints = {"action": [Options(*ACTIONS)], "scope": [Options(*SCOPES)]}
    reasons = {REASON: "an exact copy of an earlier row (each turn stripped of surrounding whitespace; a preference "
                       "pair's two responses as a set, so a copy with chosen and rejected swapped counts)"}
    rows_per_task = ROWS_PER_TASK  # an instance may set fewer (tests: several hash ranges on small data)

    def __init__(self, *, action: str = "flag", scope: str = "messages") -> None:
        self.action = action
        self.scope = scope
        # Only contents seen more than once are kept (sorted hash -> id of the first row): a
        # hash not among them belongs to a row that is its own first occurrence. At 1M rows
        # this is what the driver holds and ships to the workers, not a table of every row.
        self._keys: np.ndarray = np.zeros(0, dtype=np.uint64)
        self._first: np.ndarray = np.zeros(0, dtype=object)
        self._distinct = 0
        self._fitted = False
        self._ranges: tuple[list[int], list[str]] | None = None  # fitted in rounds: bounds, files

    def fits_in_rounds(self) -> bool:
        """In a pipeline run the fit is one round of hash-range tasks (`dedup_rounds`)."""
        return True

    def summarize_unit(self, batch: pa.Table, files: UnitFitFiles) -> DedupUnitSummary:
        hashes = batch.column("content_hash").to_numpy() if batch.num_rows else np.zeros(0, np.uint64)
        return write_unit_hashes(files.path("hashes"), hashes, batch.column("id").to_pylist())

    def fit_rounds(self, summaries: Sequence[DedupUnitSummary], ctx: RoundContext) -> None:
        bounds, files, self._distinct = run_first_rows(summaries, ctx, self.rows_per_task)
        self._ranges = (bounds, files)
        self._keys, self._first = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=object)
        self._fitted = True

    def output_columns(self) -> dict[str, pa.DataType]:
        return {"content_hash": pa.uint64(), "is_duplicate": pa.bool_(), "duplicate_of": pa.string()}

    def apply_adds(self) -> frozenset[str] | None:
        """``flag`` keeps every row and only adds ``is_duplicate`` and ``duplicate_of``."""
        return frozenset(("is_duplicate", "duplicate_of")) if self.action == "flag" else None

    def columns_read(self) -> frozenset[str]:
        return frozenset(("id", "messages", "meta", "content_hash"))  # meta: tool definitions are content

    def score(self, batch: pa.Table) -> pa.Table:
        hashes = content_hashes(batch, self.scope)
        return set_column(batch, "content_hash", pa.array(hashes, pa.uint64()))

    def summarize(self, batch: pa.Table) -> DedupSummary:
        hashes = batch.column("content_hash").to_numpy()
        uniq, first_pos, counts = np.unique(hashes, return_index=True, return_counts=True)
        order = np.argsort(first_pos)  # keep the batch's own order (first occurrences)
        ids = batch.column("id").to_pylist()
        return DedupSummary(hashes=uniq[order].astype(np.uint64), first_ids=[ids[p] for p in first_pos[order]],
                            repeated=counts[order] > 1)

    def fit(self, summaries: Sequence[DedupSummary]) -> None:
        hashes = (np.concatenate([s.hashes for s in summaries]).astype(np.uint64) if summaries
                  else np.zeros(0, dtype=np.uint64))
        repeated = np.concatenate([s.repeated if s.repeated is not None else np.ones(len(s.hashes), bool)
                                   for s in summaries]) if summaries else np.zeros(0, bool)
        # np.unique's return_index is the index of the FIRST occurrence: input order wins.
        keys, first, inverse, counts = np.unique(hashes, return_index=True, return_inverse=True, return_counts=True)
        seen_again = counts > 1  # in another batch
        seen_again[inverse[repeated]] = True  # or later in the same batch
        self._distinct = int(len(keys))
        self._keys = keys[seen_again]
        ids = (np.concatenate([np.asarray(s.first_ids, dtype=object) for s in summaries]) if summaries
               else np.zeros(0, dtype=object))  # transient: only the repeated contents' ids are kept
        self._first = ids[first[seen_again]]
        self._fitted = True

    def apply(self, batch: pa.Table) -> Outcome:
        if not self._fitted:
            raise RuntimeError("DedupStage.apply called before fit")
        hashes = batch.column("content_hash").to_numpy() if batch.num_rows else np.zeros(0, np.uint64)
        ids = np.array(batch.column("id").to_pylist(), dtype=object)
        if self._ranges is not None:
            first = first_ids(hashes, ids, *self._ranges)
        else:
            pos = np.searchsorted(self._keys, hashes)
            found = pos < len(self._keys)
            found[found] = self._keys[pos[found]] == hashes[found]
            first = ids.copy()  # a content seen once is its own first occurrence
            first[found] = self._first[pos[found]]
        dup = first != ids
        dup_of = [f if d else None for f, d in zip(first.tolist(), dup.tolist(), strict=True)]
        out = set_column(batch, "is_duplicate", pa.array(dup, pa.bool_()))
        out = set_column(out, "duplicate_of", pa.array(dup_of, pa.string()))
        examples = [{"id": i, "duplicate_of": f, "text": _snippet(t)}
                    for i, f, t in zip(ids[dup][:MAX_EXAMPLES].tolist(), first[dup][:MAX_EXAMPLES].tolist(),
                                       _texts(batch.filter(pa.array(dup))[:MAX_EXAMPLES]), strict=True)]
        stats = Tally(counts=Counter(rows=batch.num_rows, duplicates=int(dup.sum())))
        stats.keep("examples", examples, MAX_EXAMPLES)
        return drop_or_keep(out, dup, action=self.action, stage=self.name, reason=REASON, stats=stats,
                            details=lambda: [f"same {self.scope} content as {f}" for f in first[dup].tolist()])

    def describe(self) -> dict[str, Any]:
        t = self.tally
        blocks: list[dict[str, Any]] = []
        if t.items("examples"):
            blocks.append({"type": "examples", "title": "Exact duplicates (later copies)",
                           "items": [{"id": e["id"], "label": "duplicate", "text": e["text"],
                                      "note": f"first seen as {e['duplicate_of']}"} for e in t.items("examples")]})
        return {
            "title": "Exact duplicates",
            "summary": {"rows": t.get("rows"), "duplicates": t.get("duplicates"), "distinct_contents": self._distinct,
                        "scope": self.scope, "action": self.action},
            "blocks": blocks,
        }


def rejected_response(meta: str | None) -> str | None:
    """A preference row's rejected response (``meta["rejected"]``, where the normaliser keeps
    it), None for other rows."""
    if not meta or '"rejected"' not in meta:
        return None
    rejected = json.loads(meta).get("rejected")
    if isinstance(rejected, dict):
        rejected = rejected.get("value", rejected.get("content"))
    return rejected if isinstance(rejected, str) else None


def tools_key(meta: str | None) -> str | None:
    """Canonical JSON of meta["tools"] (parsed if it is a JSON string), None when empty."""
    if not meta or '"tools"' not in meta:
        return None
    tools = json.loads(meta).get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError:
            pass  # not JSON: hash the text as given
    return json.dumps(tools, sort_keys=True, ensure_ascii=False) if tools else None


def _texts(table: pa.Table) -> list[str]:
    return ["\n".join(f"{m['role']}: {m['content']}" for m in (msgs or []))
            for msgs in table.column("messages").to_pylist()]


def _snippet(text: str) -> str:
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


