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

from collections import Counter
from dataclasses import dataclass

from dataguard.train.data.encode import scores_a_token
from dataguard.train.data.encoded import Encoded
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


def fit_windows(chosen: Encoded, rejected: Encoded, max_length: int,
                 dropped: Counter[str]) -> tuple[Encoded, Encoded, int]:
    """Both sides fitted into ``max_length`` (`fit_pair`); a pair whose two prompts render
    differently keeps its start instead, and is dropped when that leaves a side no response
    token (``{side}_no_assistant_tokens_after_truncation``). Returns the pairs and how many
    lost the start of their prompt."""
    keep: list[int] = []
    c_ids, c_labels, r_ids, r_labels = [], [], [], []
    cut = 0
    for i in range(len(chosen)):
        c = (list(chosen.input_ids[i]), list(chosen.labels[i]))  # type: ignore[arg-type]
        r = (list(rejected.input_ids[i]), list(rejected.labels[i]))  # type: ignore[arg-type]
        window = fit_pair(c, r, max_length)
        if window is None:  # keep-start, as SFT cuts a row
            window = PairWindow(c[0][:max_length], c[1][:max_length], r[0][:max_length], r[1][:max_length], 0)
        lost = [side for side, labels in (("chosen", window.chosen_labels), ("rejected", window.rejected_labels))
                if not scores_a_token(labels)]
        if lost:
            dropped[f"{lost[0]}_no_assistant_tokens_after_truncation"] += 1
            continue
        keep.append(i)
        cut += window.prompt_cut > 0
        c_ids.append(window.chosen_ids)
        c_labels.append(window.chosen_labels)
        r_ids.append(window.rejected_ids)
        r_labels.append(window.rejected_labels)
    out = []
    for enc, ids, labels in ((chosen, c_ids, c_labels), (rejected, r_ids, r_labels)):
        assert enc.repeat is not None  # Encoded.__post_init__ fills it
        out.append(Encoded(input_ids=ids, labels=labels, row_ids=[enc.row_ids[i] for i in keep],
                           weights=enc.weights[keep], repeat=enc.repeat[keep], folded_system=enc.folded_system))
    return out[0], out[1], cut
