"""Token-length percentile truncation.

``score`` counts tokens per message (``message_tokens``) and per record (``n_tokens``:
contents plus the chat template's framing) with the shared tokenizer; ``summarize`` keeps an
exact histogram of ``n_tokens``; ``fit`` merges the histograms and sets the cap
``ceil(percentile(p) * factor)`` (defaults p=90, factor=1.5), a fixed ``max_tokens``, or the
smaller of both. ``apply`` rejects records under ``min_tokens`` content tokens
(``too_short``) and handles over-long ones:

* ``action="drop"``: reject them (``too_long``);
* ``action="truncate"``: remove the oldest history exchanges (a user turn with the replies
  that follow it), never the system prompt or the final exchange; then, only if allowed,
  the system prompt (``keep_system=False``) and a cut of the final turn's text at a token
  boundary (``keep_final_assistant=False`` or ``cut_final=True``). A record that still does
  not fit is rejected as ``too_long_untruncatable``. Kept rows get ``truncated``,
  ``tokens_before`` and ``tokens_after`` (and updated ``message_tokens``/``n_tokens``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.records import MESSAGES_TYPE, flat_messages, reject_rows, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.text.histogram import IntHistogram, report_edges
from dataguard.text.tokenizers import Tokenizer, check_tokenizer_spec, get_tokenizer

ACTIONS = ("truncate", "drop")
MAX_EXAMPLES = 20


@dataclass
class LengthStats:
    """Per-batch outcome counts (mergeable by summing; histogram by merging)."""

    rows_in: int = 0
    too_short: int = 0
    dropped: int = 0
    untruncatable: int = 0
    truncated: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_removed_by_truncation: int = 0
    after: IntHistogram = field(default_factory=IntHistogram)
    examples: list[dict[str, Any]] = field(default_factory=list)


def _messages_arrays(batch: pa.Table) -> tuple[np.ndarray, list[str], list[str]]:
    """(row offsets into the flat message list, roles, contents) of a batch."""
    if batch.num_rows == 0:
        return np.zeros(1, dtype=np.int64), [], []
    lengths, flat = flat_messages(batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    roles = [r or "" for r in flat.field("role").to_pylist()]
    contents = [c or "" for c in flat.field("content").to_pylist()]
    return offsets, roles, contents



class LengthStage(Stage):
    """Caps record length in tokens at a percentile-derived or fixed maximum."""

    name = "length"
    needs_fit = True

    def __init__(self, *, tokenizer: str | None = None, percentile: float | None = 90.0,
                 factor: float = 1.5, max_tokens: int | None = None, min_tokens: int = 4,
                 action: str = "truncate", keep_system: bool = True, keep_final_assistant: bool = True,
                 cut_final: bool = False) -> None:
        try:
            check_tokenizer_spec(tokenizer)  # a missing tokenizer is a config error, not a worker's crash
        except ValueError as exc:
            raise StageConfigError(str(exc)) from None
        if percentile is not None and not (isinstance(percentile, int | float) and 0 < percentile <= 100):
            raise StageConfigError(f"percentile must be in (0, 100] or null, got {percentile!r}")
        if not (isinstance(factor, int | float) and factor > 0):
            raise StageConfigError(f"factor must be > 0, got {factor!r}")
        if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens > 0):
            raise StageConfigError(f"max_tokens must be a positive integer or null, got {max_tokens!r}")
        if not (isinstance(min_tokens, int) and min_tokens >= 0):
            raise StageConfigError(f"min_tokens must be a non-negative integer, got {min_tokens!r}")
        if action not in ACTIONS:
            raise StageConfigError(f"action must be one of {ACTIONS}, got {action!r}")
        for flag, value in (("keep_system", keep_system), ("keep_final_assistant", keep_final_assistant),
                            ("cut_final", cut_final)):
            if not isinstance(value, bool):
                raise StageConfigError(f"{flag} must be true or false, got {value!r}")
        self.tokenizer_spec = tokenizer
        self.percentile = float(percentile) if percentile is not None else None
        self.factor = float(factor)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.action = action
        self.keep_system = keep_system
        self.keep_final_assistant = keep_final_assistant
        self.cut_final = cut_final or not keep_final_assistant
        self.cap: int | None = max_tokens if percentile is None else None
        self.percentile_value: float | None = None
        self.before = IntHistogram()
        self.stats = LengthStats()
        self._fitted = percentile is None
        self._tok: Tokenizer | None = None

    # -- pickling: never ship the tokenizer ------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tok"] = None
        return state

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tok is None:
            self._tok = get_tokenizer(self.tokenizer_spec)
        return self._tok

    def output_columns(self) -> dict[str, pa.DataType]:
        return {
            "message_tokens": pa.list_(pa.int32()),
            "n_tokens": pa.int32(),
            "truncated": pa.bool_(),
            "tokens_before": pa.int32(),
            "tokens_after": pa.int32(),
        }

    # -- score -----------------------------------------------------------------------------
    def _count(self, offsets: np.ndarray, roles: pa.Array, contents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        tok = self.tokenizer
        counts = tok.count_batch(contents) if contents else np.zeros(0, dtype=np.int64)
        csum = np.concatenate([[0], np.cumsum(counts)])
        totals = csum[offsets[1:]] - csum[offsets[:-1]]
        # Template overhead per message, looked up once per distinct role.
        coded = pc.fill_null(roles, "").dictionary_encode()
        per_role = tok.message_overheads(coded.dictionary.to_pylist())
        if per_role is not None:  # additive template (ChatML): vectorised
            per_message = per_role[coded.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
            osum = np.concatenate([[0], np.cumsum(per_message)])
            overhead = osum[offsets[1:]] - osum[offsets[:-1]]
        else:  # whole-conversation template: measured once per distinct role sequence
            names = [r or "" for r in roles.to_pylist()]
            overhead = np.fromiter(
                (tok.template_overhead(tuple(names[s:e]))
                 for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)),
                dtype=np.int64, count=len(offsets) - 1,
            )
        return counts, totals + overhead

    def score(self, batch: pa.Table) -> pa.Table:
        if batch.num_rows == 0:
            offsets, roles, contents = np.zeros(1, dtype=np.int64), pa.array([], pa.string()), []
        else:
            lengths, flat = flat_messages(batch)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            roles = flat.field("role")
            content = flat.field("content")
            contents = (pc.fill_null(content, "") if content.null_count else content).to_pylist()
        counts, totals = self._count(offsets, roles, contents)
        per_msg = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(counts.astype(np.int32)))
        batch = set_column(batch, "message_tokens", per_msg)
        return set_column(batch, "n_tokens", pa.array(totals.astype(np.int32), pa.int32()))

    # -- fit -------------------------------------------------------------------------------
    def summarize(self, batch: pa.Table) -> IntHistogram:
        return IntHistogram.of(batch.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64))

    def fit(self, summaries: Sequence[IntHistogram]) -> None:
        self.before = IntHistogram.merge(summaries)
        caps = [] if self.max_tokens is None else [self.max_tokens]
        if self.percentile is not None and self.before.total:
            self.percentile_value = self.before.percentile(self.percentile)
            caps.append(max(1, math.ceil(self.percentile_value * self.factor)))
        self.cap = min(caps) if caps else None
        self._fitted = True

    # -- apply -----------------------------------------------------------------------------
    def apply(self, batch: pa.Table) -> Outcome:
        if not self._fitted:
            raise RuntimeError("LengthStage.apply called before fit()")
        if "n_tokens" not in batch.column_names:
            batch = self.score(batch)
        n = batch.num_rows
        offsets, roles, contents = _messages_arrays(batch)
        n_tokens = batch.column("n_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
        msg_tokens = (batch.column("message_tokens").combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
                      if n else np.zeros(0, dtype=np.int64))
        csum = np.concatenate([[0], np.cumsum(msg_tokens)])
        content_tokens = csum[offsets[1:]] - csum[offsets[:-1]]
        stats = LengthStats(rows_in=n, tokens_in=int(n_tokens.sum()))

        reasons: list[str | None] = [None] * n
        details: list[str | None] = [None] * n
        short = content_tokens < self.min_tokens
        for i in np.flatnonzero(short).tolist():
            reasons[i] = "too_short"
            details[i] = f"content tokens={int(content_tokens[i])} < min_tokens={self.min_tokens}"
        cap = self.cap
        long_rows = np.flatnonzero(~short & (n_tokens > cap)).tolist() if cap is not None else []
        new_msgs: dict[int, list[dict[str, str]]] = {}
        new_counts: dict[int, list[int]] = {}
        for i in long_rows:
            before = int(n_tokens[i])
            if self.action == "drop":
                reasons[i] = "too_long"
                details[i] = f"n_tokens={before} > cap={cap}{self._cap_note()}"
                continue
            s, e = int(offsets[i]), int(offsets[i + 1])
            result = self._truncate(roles[s:e], contents[s:e], msg_tokens[s:e].tolist(), cap)
            if result is None:
                reasons[i] = "too_long_untruncatable"
                details[i] = (f"n_tokens={before} > cap={cap}{self._cap_note()}; still over after removing "
                              f"all removable history (system and final turn are protected)")
                continue
            new_msgs[i], new_counts[i] = result

        tokens_before = n_tokens.copy()
        tokens_after = n_tokens.copy()
        truncated = np.zeros(n, dtype=bool)
        if new_msgs:
            tok = self.tokenizer
            msgs_py = batch.column("messages").to_pylist()
            per_msg_py = batch.column("message_tokens").to_pylist()
            for i, msgs in new_msgs.items():
                msgs_py[i] = msgs
                per_msg_py[i] = new_counts[i]
                tokens_after[i] = sum(new_counts[i]) + tok.template_overhead(tuple(m["role"] for m in msgs))
                truncated[i] = True
                stats.tokens_removed_by_truncation += int(tokens_before[i] - tokens_after[i])
                if len(stats.examples) < MAX_EXAMPLES:
                    stats.examples.append({"id": batch.column("id")[i].as_py(), "before": int(tokens_before[i]),
                                           "after": int(tokens_after[i]), "turns_before": int(offsets[i + 1] - offsets[i]),
                                           "turns_after": len(msgs)})
            batch = set_column(batch, "messages", pa.array(msgs_py, MESSAGES_TYPE))
            batch = set_column(batch, "message_tokens", pa.array(per_msg_py, pa.list_(pa.int32())))
            batch = set_column(batch, "n_tokens", pa.array(tokens_after.astype(np.int32), pa.int32()))
        batch = set_column(batch, "truncated", pa.array(truncated, pa.bool_()))
        batch = set_column(batch, "tokens_before", pa.array(tokens_before.astype(np.int32), pa.int32()))
        batch = set_column(batch, "tokens_after", pa.array(tokens_after.astype(np.int32), pa.int32()))

        reject_mask = np.array([r is not None for r in reasons], dtype=bool)
        rej_idx = np.flatnonzero(reject_mask)
        rejected = reject_rows(batch, reject_mask, self.name, [reasons[i] for i in rej_idx],
                               [details[i] for i in rej_idx])
        kept = batch.filter(pa.array(~reject_mask))
        stats.too_short = int(sum(1 for r in reasons if r == "too_short"))
        stats.dropped = int(sum(1 for r in reasons if r == "too_long"))
        stats.untruncatable = int(sum(1 for r in reasons if r == "too_long_untruncatable"))
        stats.truncated = int(truncated.sum())
        stats.tokens_out = int(tokens_after[~reject_mask].sum())
        stats.after = IntHistogram.of(tokens_after[~reject_mask])
        for i in rej_idx.tolist():
            if reasons[i] != "too_short" and len(stats.examples) < MAX_EXAMPLES:
                stats.examples.append({"id": batch.column("id")[i].as_py(), "before": int(tokens_before[i]),
                                       "after": None, "turns_before": int(offsets[i + 1] - offsets[i]),
                                       "turns_after": None, "reason": reasons[i]})
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def _cap_note(self) -> str:
        if self.percentile_value is None:
            return " (max_tokens)"
        return f" (p{self.percentile:g}={self.percentile_value:g} x {self.factor:g}" + (
            f", max_tokens={self.max_tokens})" if self.max_tokens is not None else ")")

    def _truncate(self, roles: list[str], contents: list[str], counts: list[int],
                  cap: int) -> tuple[list[dict[str, str]], list[int]] | None:
        """Drop oldest history exchanges (then what configuration allows) until <= cap."""
        tok = self.tokenizer
        idx = list(range(len(roles)))
        sys_idx = [j for j in idx if roles[j] == "system"]
        rest = [j for j in idx if roles[j] != "system"]
        # The final exchange: the last user turn and everything after it (or the last turn).
        last_user = max((k for k, j in enumerate(rest) if roles[j] == "user"), default=max(len(rest) - 1, 0))
        final = rest[last_user:]
        history = rest[:last_user]
        # History units: a user turn plus the non-user turns that follow it.
        units: list[list[int]] = []
        for j in history:
            if roles[j] == "user" or not units:
                units.append([j])
            else:
                units[-1].append(j)

        def total(sel: list[int]) -> int:
            return sum(counts[j] for j in sel) + tok.template_overhead(tuple(roles[j] for j in sel))

        keep_sys = list(sys_idx)
        while True:
            sel = sorted(keep_sys + [j for u in units for j in u] + final)
            if total(sel) <= cap:
                break
            if units:
                units.pop(0)
                continue
            if keep_sys and not self.keep_system:
                keep_sys = []
                continue
            if not self.cut_final or not final:
                return None
            # Cut the final turn's text at a token boundary.
            last = final[-1]
            over = total(sel) - cap
            allowed = counts[last] - over
            if allowed <= 0:
                return None
            ids = tok.encode_batch([contents[last]])[0][:allowed]
            text = tok.decode(ids).rstrip("\ufffd")
            new_count = int(tok.count_batch([text])[0])
            msgs = [{"role": roles[j], "content": (text if j == last else contents[j])} for j in sel]
            new_counts = [new_count if j == last else counts[j] for j in sel]
            if sum(new_counts) + tok.template_overhead(tuple(m["role"] for m in msgs)) > cap:
                return None
            return msgs, new_counts
        return [{"role": roles[j], "content": contents[j]} for j in sel], [counts[j] for j in sel]

    # -- report ----------------------------------------------------------------------------
    def absorb(self, stats: Sequence[Any]) -> None:
        total = LengthStats()
        for s in stats:
            if s is None:
                continue
            total.rows_in += s.rows_in
            total.too_short += s.too_short
            total.dropped += s.dropped
            total.untruncatable += s.untruncatable
            total.truncated += s.truncated
            total.tokens_in += s.tokens_in
            total.tokens_out += s.tokens_out
            total.tokens_removed_by_truncation += s.tokens_removed_by_truncation
            total.examples.extend(s.examples[: max(0, MAX_EXAMPLES - len(total.examples))])
        total.after = IntHistogram.merge([s.after for s in stats if s is not None])
        self.stats = total

    def training_state(self) -> dict[str, Any]:
        """What a training run needs: the cap as its ``max_length`` and which tokenizer counted it
        (with the chat-template overhead included), so a runner can warn when its own differs."""
        return {"cap": self.cap, "tokenizer": self.tokenizer_spec or "qwen2.5", "includes_template": True,
                "action": self.action}

    def describe(self) -> dict[str, Any]:
        st = self.stats
        removed = st.tokens_in - st.tokens_out
        summary = {
            "tokenizer": self.tokenizer_spec or "qwen2.5",
            "cap": self.cap,
            "percentile": self.percentile,
            "percentile_value": self.percentile_value,
            "factor": self.factor,
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "action": self.action,
            "rows_in": st.rows_in,
            "rows_too_short": st.too_short,
            "rows_dropped_too_long": st.dropped,
            "rows_untruncatable": st.untruncatable,
            "rows_truncated": st.truncated,
            "tokens_in": st.tokens_in,
            "tokens_out": st.tokens_out,
            "share_tokens_removed": round(removed / st.tokens_in, 6) if st.tokens_in else 0.0,
            "share_tokens_removed_by_truncation": (round(st.tokens_removed_by_truncation / st.tokens_in, 6)
                                                   if st.tokens_in else 0.0),
        }
        blocks: list[dict[str, Any]] = []
        if self.before.total:
            top = int(self.before.values.max())
            edges = report_edges(top)
            markers = [{"label": "cap", "value": self.cap}] if self.cap is not None else []
            if self.percentile_value is not None:
                markers.append({"label": f"p{self.percentile:g}", "value": self.percentile_value})
            blocks.append({
                "type": "histogram", "title": "Tokens per record", "edges": edges.tolist(),
                "series": {"before": self.before.binned(edges), "after": st.after.binned(edges)},
                "markers": markers, "x_label": "tokens",
            })
        blocks.append({
            "type": "bar", "title": "Rows by outcome",
            "labels": ["kept unchanged", "truncated", "too_short", "too_long", "too_long_untruncatable"],
            "series": {"rows": [st.rows_in - st.truncated - st.too_short - st.dropped - st.untruncatable,
                                st.truncated, st.too_short, st.dropped, st.untruncatable]},
        })
        if st.examples:
            blocks.append({
                "type": "table", "title": "Truncated or dropped records (first 20)",
                "columns": ["id", "tokens before", "tokens after", "turns before", "turns after", "outcome"],
                "rows": [[e["id"], e["before"], e["after"], e["turns_before"], e["turns_after"],
                          e.get("reason", "truncated")] for e in st.examples],
            })
        return {"title": "Length percentile truncation", "summary": summary, "blocks": blocks}
