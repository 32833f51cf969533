"""Fit a preference pair into ``max_length`` without losing its preference.

SFT keeps the start of a long row, which is right for a conversation whose every assistant
turn is trained on. A preference pair is different: only the final response differs between
its two sides, so keeping the start of a long multi-turn prompt cuts the response away, and
the pair is left with a margin of zero. On the DPO demo at 256 tokens that was 96 of 270
pairs. Preference trainers (TRL's DPO ``truncation_mode="keep_end"`` for the prompt) keep the
response and cut the prompt from the left instead; so does this, with the same cut for both
sides, so that the two responses are always compared after the same context.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataguard.train.optim.losses import IGNORE_INDEX


@dataclass(frozen=True)
class PairWindow:
    """One pair fitted into the window: both sides' ids and labels, and the prompt tokens
    cut from the left (0 when the pair fitted as it was)."""

    chosen_ids: list[int]
    chosen_labels: list[int]
    rejected_ids: list[int]
    rejected_labels: list[int]
    prompt_cut: int


def response_start(labels: list[int]) -> int:
    """Index of the first scored token: where the final response begins."""
    return next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))


def fit_pair(chosen: tuple[list[int], list[int]], rejected: tuple[list[int], list[int]],
             max_length: int) -> PairWindow | None:
    """Both sides cut to ``max_length`` tokens, or None when their prompts differ (a template
    that renders the shared turns differently per response; the caller keeps the start then).

    The prompt keeps as many of its last tokens as leave room for the longer response, but
    never fewer than half the window (or all of it, if it is shorter): a very long answer is
    cut at its end rather than leave the model no context to answer."""
    (c_ids, c_labels), (r_ids, r_labels) = chosen, rejected
    start = response_start(c_labels)
    if start != response_start(r_labels) or c_ids[:start] != r_ids[:start]:
        return None
    longest = max(len(c_ids), len(r_ids)) - start
    if start + longest <= max_length:
        return PairWindow(c_ids, c_labels, r_ids, r_labels, 0)
    kept = min(start, max(max_length - longest, max_length // 2))
    lo, hi = start - kept, start - kept + max_length
    return PairWindow(c_ids[lo:hi], c_labels[lo:hi], r_ids[lo:hi], r_labels[lo:hi], start - kept)
