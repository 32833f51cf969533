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

A preference pair is as long as its longer side (prompt + chosen, or prompt + rejected), and
both sides are truncated with one prompt: `dataguard.stages.length_pairs`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import FLAG, OPTIONAL_NAME, Interval, Options
from dataguard.records import flat_messages, reject_rows, rejected_texts, set_column
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.length_pairs import pair_totals
from dataguard.stages.length_report import describe_length
from dataguard.stages.length_truncate import MAX_EXAMPLES, Limits, plan_rows, rewrite_rows
from dataguard.tally import Tally
from dataguard.text.histogram import IntHistogram
from dataguard.text.tokenizers import Tokenizer, check_tokenizer_spec, get_tokenizer

ACTIONS = ("truncate", "drop")


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
    constraints = {
        "tokenizer": OPTIONAL_NAME,
        "percentile": [Interval(float, 0, 100, closed="right"), None],
        "factor": [Interval(float, 0, closed="neither")],
        "max_tokens": [Interval(int, 1), None],
        "min_tokens": [Interval(int, 0)],
        "action": [Options(*ACTIONS)],
        "keep_system": FLAG,
        "keep_final_assistant": FLAG,
        "cut_final": FLAG,
    }
    reasons = {
        "too_short": "fewer tokens than min_tokens",
        "too_long": "more tokens than the cap, with action: drop",
        "too_long_untruncatable": "over the cap even after removing all removable history (protected turns alone exceed it), or a pair whose cut leaves both responses the same",
    }

    def __init__(self, *, tokenizer: str | None = None, percentile: float | None = 90.0,
                 factor: float = 1.5, max_tokens: int | None = None, min_tokens: int = 4,
                 action: str = "truncate", keep_system: bool = True, keep_final_assistant: bool = True,
                 cut_final: bool = False) -> None:
        try:
            check_tokenizer_spec(tokenizer)  # a missing tokenizer is a config error, not a worker's crash
        except ValueError as exc:
            raise StageConfigError(str(exc), param="tokenizer") from None
        if max_tokens is not None and min_tokens > max_tokens:  # every row would be dropped as too short or long
            raise StageConfigError(f"min_tokens: must not exceed max_tokens ({max_tokens}), got {min_tokens}",
                                   param="min_tokens")
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
        totals = pair_totals(self.tokenizer, totals, counts, offsets, rejected_texts(batch))
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
        stats = Tally(counts=Counter(rows_in=n, tokens_in=int(n_tokens.sum())))
        examples: list[dict[str, Any]] = []

        tok = self.tokenizer
        reasons, details, new_msgs, new_counts, new_rejected = plan_rows(
            self._limits(), tok, n_tokens, content_tokens, offsets, roles, contents, msg_tokens,
            rejected_texts(batch))
        batch, tokens_before, tokens_after, truncated = rewrite_rows(tok, batch, n_tokens, offsets, new_msgs,
                                                                     new_counts, new_rejected, stats, examples)
        reject_mask = np.array([r is not None for r in reasons], dtype=bool)
        rej_idx = np.flatnonzero(reject_mask)
        rejected = reject_rows(batch, reject_mask, self.name, [reasons[i] for i in rej_idx],
                               [details[i] for i in rej_idx])
        kept = batch.filter(pa.array(~reject_mask))
        stats.add("too_short", sum(1 for r in reasons if r == "too_short"))
        stats.add("dropped", sum(1 for r in reasons if r == "too_long"))
        stats.add("untruncatable", sum(1 for r in reasons if r == "too_long_untruncatable"))
        stats.add("truncated", int(truncated.sum()))
        stats.add("tokens_out", int(tokens_after[~reject_mask].sum()))
        stats.put("after", IntHistogram.of(tokens_after[~reject_mask]))
        for i in rej_idx.tolist():
            if reasons[i] != "too_short" and len(examples) < MAX_EXAMPLES:
                examples.append({"id": batch.column("id")[i].as_py(), "before": int(tokens_before[i]),
                                 "after": None, "turns_before": int(offsets[i + 1] - offsets[i]),
                                 "turns_after": None, "reason": reasons[i]})
        stats.keep("examples", examples, MAX_EXAMPLES)
        return Outcome(kept=kept, rejected=rejected, stats=stats)

    def _limits(self) -> Limits:
        """The fitted rule `plan_rows` applies, with the cap's origin for reject details."""
        if self.percentile_value is None:
            note = " (max_tokens)"
        else:
            note = f" (p{self.percentile:g}={self.percentile_value:g} x {self.factor:g}" + (
                f", max_tokens={self.max_tokens})" if self.max_tokens is not None else ")")
        return Limits(min_tokens=self.min_tokens, cap=self.cap, cap_note=note, action=self.action,
                      keep_system=self.keep_system, cut_final=self.cut_final)

    # -- report ----------------------------------------------------------------------------
    def training_state(self) -> dict[str, Any]:
        """What a training run needs: the cap as its ``max_length`` and which tokenizer counted it
        (with the chat-template overhead included), so a runner can warn when its own differs."""
        return {"cap": self.cap, "tokenizer": self.tokenizer_spec or "qwen2.5", "includes_template": True,
                "action": self.action}

    def describe(self) -> dict[str, Any]:
        return describe_length(self)
