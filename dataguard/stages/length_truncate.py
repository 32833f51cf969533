"""Cutting a conversation down to a token cap: oldest history first, the final exchange kept.

Order of removal: whole history exchanges (a user turn and the turns answering it), oldest
first; then the system prompt, if ``keep_system`` is off; then, if ``cut_final`` is on, the
final turn's text at a token boundary. ``None`` when the record cannot be brought under the
cap that way (the length stage rejects it as ``too_long_untruncatable``).
"""

from __future__ import annotations

from typing import Any


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
        ids = tok.encode_batch([contents[last]])[0][:allowed]
        text = tok.decode(ids).rstrip("\ufffd")
        new_count = int(tok.count_batch([text])[0])
        msgs = [{"role": roles[j], "content": (text if j == last else contents[j])} for j in sel]
        new_counts = [new_count if j == last else counts[j] for j in sel]
        if sum(new_counts) + tok.template_overhead(tuple(m["role"] for m in msgs)) > cap:
            return None
        return msgs, new_counts
    return [{"role": roles[j], "content": contents[j]} for j in sel], [counts[j] for j in sel]
