"""Cutting a conversation down to a token cap: oldest history first, the final exchange kept.

Order of removal: whole history exchanges (a user turn and the turns answering it), oldest
first; then the system prompt, if ``keep_system`` is off; then, if ``cut_final`` is on, the
final turn's text at a token boundary. ``None`` when the record cannot be brought under the
cap that way (the length stage rejects it as ``too_long_untruncatable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.records import MESSAGES_TYPE, rejected_of, set_column, with_rejected
from dataguard.tally import Tally

MAX_EXAMPLES = 20


@dataclass(frozen=True)
class Limits:
    """The length stage's fitted rule, as `plan_rows` needs it (so it never needs the stage)."""

    min_tokens: int
    cap: int | None       # None: no cap was fitted (nothing is too long)
    cap_note: str         # where the cap came from, for reject details
    action: str           # "truncate" or "drop"
    keep_system: bool
    cut_final: bool


def truncate_turns(roles: list[str], contents: list[str], counts: list[int], cap: int, tok: Any, *,
                   keep_system: bool, cut_final: bool) -> tuple[list[dict[str, str]], list[int]] | None:
    """(messages, per-message token counts) within ``cap`` tokens (template overhead
    included), or None."""
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
        if keep_sys and not keep_system:
            keep_sys = []
            continue
        if not cut_final or not final:
            return None
        # Cut the final turn's text at a token boundary.
        last = final[-1]
        over = total(sel) - cap
        allowed = counts[last] - over
        if allowed <= 0:
            return None
        text, new_count = cut_text(tok, contents[last], allowed)
        msgs = [{"role": roles[j], "content": (text if j == last else contents[j])} for j in sel]
        new_counts = [new_count if j == last else counts[j] for j in sel]
        if sum(new_counts) + tok.template_overhead(tuple(m["role"] for m in msgs)) > cap:
            return None
        return msgs, new_counts
    return [{"role": roles[j], "content": contents[j]} for j in sel], [counts[j] for j in sel]


def cut_text(tok: Any, text: str, allowed: int) -> tuple[str, int]:
    """(``text`` cut to its first ``allowed`` tokens at a token boundary, its token count)."""
    ids = tok.encode_batch([text])[0][:allowed]
    cut = tok.decode(ids).rstrip("\ufffd")
    return cut, int(tok.count_batch([cut])[0])


def truncate_pair(roles: list[str], contents: list[str], counts: list[int], rejected: str, r_count: int, cap: int,
                  tok: Any, *, keep_system: bool, cut_final: bool
                  ) -> tuple[list[dict[str, str]], list[int], str, int] | None:
    """(chosen conversation's messages and token counts, rejected response and its tokens),
    every side within ``cap``; None when the pair cannot be brought under it."""
    rejected_longer = r_count > counts[-1]
    longer = (rejected, r_count) if rejected_longer else (contents[-1], counts[-1])
    other = (contents[-1], counts[-1]) if rejected_longer else (rejected, r_count)
    result = truncate_turns(roles, contents[:-1] + [longer[0]], counts[:-1] + [longer[1]], cap, tok,
                            keep_system=keep_system, cut_final=cut_final)
    if result is None:
        return None
    msgs, new_counts = result
    longer = (msgs[-1]["content"], new_counts[-1])  # cut, when cut_final had to
    if other[1] > longer[1]:  # the longer response was cut: the other gets the same budget
        other = cut_text(tok, other[0], longer[1])
        if other[1] > longer[1]:
            return None
    chosen, rejected_side = (other, longer) if rejected_longer else (longer, other)
    msgs[-1] = {"role": msgs[-1]["role"], "content": chosen[0]}
    new_counts[-1] = chosen[1]
    return msgs, new_counts, rejected_side[0], rejected_side[1]


def plan_rows(limits: Limits, tok: Any, n_tokens: np.ndarray, content_tokens: np.ndarray, offsets: np.ndarray,
              roles: list[str], contents: list[str], msg_tokens: np.ndarray, rejected: Sequence[str | None],
              ) -> tuple[list[str | None], list[str | None], dict[int, list[dict[str, str]]], dict[int, list[int]],
                         dict[int, tuple[str, int]]]:
    """Per row: the reject reason and detail (too short, too long, untruncatable), or the
    truncated messages and their token counts (and, for a preference pair, its rejected
    response and that response's tokens: `dataguard.stages.length_pairs`); ``tok`` counts and cuts."""
    n = len(n_tokens)
    reasons: list[str | None] = [None] * n
    details: list[str | None] = [None] * n
    short = content_tokens < limits.min_tokens
    for i in np.flatnonzero(short).tolist():
        reasons[i] = "too_short"
        details[i] = f"content tokens={int(content_tokens[i])} < min_tokens={limits.min_tokens}"
    cap = limits.cap
    long_rows = np.flatnonzero(~short & (n_tokens > cap)).tolist() if cap is not None else []
    new_msgs: dict[int, list[dict[str, str]]] = {}
    new_counts: dict[int, list[int]] = {}
    new_rejected: dict[int, tuple[str, int]] = {}
    for i in long_rows:
        before = int(n_tokens[i])
        s, e = int(offsets[i]), int(offsets[i + 1])
        pair = rejected[i] is not None and e > s
        r_count = int(tok.count_batch([rejected[i]])[0]) if pair else 0
        side = "; the rejected response is the longer side" if pair and r_count > msg_tokens[e - 1] else ""
        if limits.action == "drop":
            reasons[i] = "too_long"
            details[i] = f"n_tokens={before} > cap={cap}{limits.cap_note}{side}"
            continue
        keep = {"keep_system": limits.keep_system, "cut_final": limits.cut_final}
        counts = msg_tokens[s:e].tolist()
        if pair:
            result = truncate_pair(roles[s:e], contents[s:e], counts, rejected[i] or "", r_count, cap,
                                   tok, **keep)
        else:
            result = truncate_turns(roles[s:e], contents[s:e], counts, cap, tok, **keep)
        if result is None:
            reasons[i] = "too_long_untruncatable"
            details[i] = (f"n_tokens={before} > cap={cap}{limits.cap_note}; still over after removing "
                          f"all removable history (system and final turn are protected){side}")
            continue
        if pair and " ".join(result[0][-1]["content"].split()) == " ".join(result[2].split()):
            reasons[i] = "too_long_untruncatable"
            details[i] = (f"n_tokens={before} > cap={cap}{limits.cap_note}; cutting both responses to the cap "
                          "leaves them the same, a pair that states no preference")
            continue
        new_msgs[i], new_counts[i] = result[0], result[1]
        if pair:
            new_rejected[i] = result[2], result[3]
    return reasons, details, new_msgs, new_counts, new_rejected


def rewrite_rows(tok: Any, batch: pa.Table, n_tokens: np.ndarray, offsets: np.ndarray,
                 new_msgs: dict[int, list[dict[str, str]]], new_counts: dict[int, list[int]],
                 new_rejected: dict[int, tuple[str, int]], stats: Tally,
                 examples: list[dict[str, Any]]) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
    """The batch with truncated rows rewritten and the before/after token columns (a pair's
    tokens: its longer side's); ``tok`` measures the template's overhead."""
    n = batch.num_rows
    tokens_before = n_tokens.copy()
    tokens_after = n_tokens.copy()
    truncated = np.zeros(n, dtype=bool)
    if new_msgs:
        msgs_py = batch.column("messages").to_pylist()
        per_msg_py = batch.column("message_tokens").to_pylist()
        for i, msgs in new_msgs.items():
            msgs_py[i] = msgs
            per_msg_py[i] = new_counts[i]
            longer_final = max(new_counts[i][-1], new_rejected[i][1]) if i in new_rejected else new_counts[i][-1]
            tokens_after[i] = (sum(new_counts[i][:-1]) + longer_final
                               + tok.template_overhead(tuple(m["role"] for m in msgs)))
            truncated[i] = True
            stats.add("tokens_removed_by_truncation", int(tokens_before[i] - tokens_after[i]))
            if len(examples) < MAX_EXAMPLES:
                examples.append({"id": batch.column("id")[i].as_py(), "before": int(tokens_before[i]),
                                 "after": int(tokens_after[i]), "turns_before": int(offsets[i + 1] - offsets[i]),
                                 "turns_after": len(msgs)})
        batch = set_column(batch, "messages", pa.array(msgs_py, MESSAGES_TYPE))
        batch = with_rejected(batch, {i: text for i, (text, _) in new_rejected.items()
                                      if text != rejected_of(batch.column("meta")[i].as_py())})
        batch = set_column(batch, "message_tokens", pa.array(per_msg_py, pa.list_(pa.int32())))
        batch = set_column(batch, "n_tokens", pa.array(tokens_after.astype(np.int32), pa.int32()))
    batch = set_column(batch, "truncated", pa.array(truncated, pa.bool_()))
    batch = set_column(batch, "tokens_before", pa.array(tokens_before.astype(np.int32), pa.int32()))
    batch = set_column(batch, "tokens_after", pa.array(tokens_after.astype(np.int32), pa.int32()))
    return batch, tokens_before, tokens_after, truncated
