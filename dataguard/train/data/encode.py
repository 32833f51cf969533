"""Rows -> tokenized examples: SFT (loss on assistant tokens only, optional packing) and
classification (text + class id); `Encoded.collate` pads a micro-batch (right padding,
attention mask 0 on padding, labels -100 on padding and on every non-assistant token).

Chat templates that refuse a conversation (they call ``raise_exception``: Gemma's rejects a
system role, Mistral's wants user/assistant turns alternating) never stop a run. Where the
row starts with system turns, they are folded into its first user turn (the system text, a
blank line, the user text; what Gemma's newer template does itself) and the row is rendered
again; a row the template still refuses is left out and counted as ``template_refused`` in
``Encoded.dropped`` (run.json's ``dropped``), like the other dropped rows. Folded rows are
counted in ``Encoded.folded_system``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
from jinja2.exceptions import TemplateError

from dataguard.records import PROMPT_ROLES
from dataguard.train.data.encoded import Encoded
from dataguard.train.data.labels import LabelMap
from dataguard.train.data.shards import _ids, row_repeat, row_weights
from dataguard.train.errors import TrainDataError
from dataguard.train.optim.losses import IGNORE_INDEX

TEMPLATE_REFUSED = "template_refused"
log = logging.getLogger(__name__)


def _messages(row: Any) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": "" if m["content"] is None else str(m["content"])}
            for m in (row or [])]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and, per assistant message, the character span it adds:
    from the end of the prefix rendered with the generation prompt to the end of the prefix
    that includes the message (so the end-of-turn marker is trained too). Raises ValueError
    when the template does not render prefixes as prefixes of the whole."""
    full = _render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start_text = _render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        end_text = _render(tokenizer, messages[: i + 1])
        if not full.startswith(start_text) or not full.startswith(end_text) or len(end_text) < len(start_text):
            raise ValueError("chat template is not prefix-stable")
        spans.append((len(start_text), len(end_text)))
    return full, spans


def fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The conversation with its leading system turns folded into the first user turn
    (``system + "\n\n" + user``), or None when there is nothing to fold or it cannot be
    folded (no user turn right after them, or a system turn later in the conversation)."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n == 0 or n == len(messages) or messages[n]["role"] != "user":
        return None
    if any(m["role"] == "system" for m in messages[n:]):
        return None
    parts = [m["content"] for m in messages[: n + 1] if m["content"]]
    return [{"role": "user", "content": "\n\n".join(parts)}, *messages[n + 1:]]


def render_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]], bool]:
    """`assistant_char_spans`, with the system turns folded into the first user turn when the
    template refuses the conversation as it is; returns (text, spans, folded). Raises
    TemplateError (or TypeError) when the template refuses it folded too, ValueError when
    the template is not prefix-stable."""
    try:
        text, spans = assistant_char_spans(tokenizer, messages)
        return text, spans, False
    except (TemplateError, TypeError):
        folded = fold_system(messages)
        if folded is None:
            raise
    text, spans = assistant_char_spans(tokenizer, folded)
    return text, spans, True


def _token_labels(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and labels: the id inside an assistant span, else -100."""
    return _token_labels_batch(tokenizer, [text], [spans])[0]


TOKENIZE_BATCH = 256  # texts per tokenizer call: one Rust call instead of one per row


def _token_labels_batch(tokenizer: Any, texts: list[str], spans: list[list[tuple[int, int]]]
                        ) -> list[tuple[list[int], list[int]]]:
    """`_token_labels` for many texts. A fast tokenizer encodes them in batches and the
    labels come from its offsets with array operations: the per-token Python loop was a
    third of the encoding time on a 20M-token corpus."""
    if not getattr(tokenizer, "is_fast", False):
        return [_token_labels_slow(tokenizer, t, s) for t, s in zip(texts, spans, strict=True)]
    out: list[tuple[list[int], list[int]]] = []
    for at in range(0, len(texts), TOKENIZE_BATCH):
        enc = tokenizer(texts[at:at + TOKENIZE_BATCH], add_special_tokens=False, return_offsets_mapping=True)
        for k, (ids, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], strict=True)):
            ids_arr = np.asarray(ids, dtype=np.int64)
            off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
            inside = np.zeros(len(ids_arr), dtype=bool)
            for a, b in spans[at + k]:
                inside |= (off[:, 0] >= a) & (off[:, 0] < b)
            inside &= off[:, 1] > off[:, 0]
            out.append((ids_arr.tolist(), np.where(inside, ids_arr, IGNORE_INDEX).tolist()))
    return out


def _token_labels_slow(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """A slow tokenizer has no offsets: token counts of the span boundaries' prefixes."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    labels = [IGNORE_INDEX] * len(ids)
    for a, b in spans:
        ta = len(tokenizer(text[:a], add_special_tokens=False)["input_ids"])
        tb = len(tokenizer(text[:b], add_special_tokens=False)["input_ids"])
        for t in range(ta, min(tb, len(ids))):
            labels[t] = ids[t]
    return ids, labels


def scores_a_token(labels: list[int]) -> bool:
    """Whether a row keeps a token to learn from: label 0 is never predicted (shift by one)."""
    return labels[1:].count(IGNORE_INDEX) < len(labels) - 1


def encode_sft(table: pa.Table, tokenizer: Any, max_length: int | None, *,
               packing: bool = False, allow_empty: bool = False, final_turn_only: bool = False) -> Encoded:
    """Rows' ``messages`` -> token ids with the tokenizer's own chat template; loss only on
    assistant tokens; the start is kept when a row is longer than ``max_length``. Rows left
    without an assistant token, or that the template refuses even with the system turns
    folded into the first user turn, are dropped and counted in ``Encoded.dropped``.

    ``final_turn_only`` labels only the last assistant turn (a preference pair's response):
    the earlier assistant turns are context both sides share, and a row whose last turn the
    cut at ``max_length`` removed is dropped even if earlier assistant turns survived it."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrainDataError("the tokenizer has no chat template; SFT needs one to render conversations")
    weights, repeat, ids_all = row_weights(table), row_repeat(table), _ids(table)
    dropped: Counter[str] = Counter()
    out_ids: list[list[int]] = []
    out_labels: list[list[int]] = []
    keep: list[int] = []
    folded = 0
    refusal = ""
    rendered: list[tuple[int, str, list[tuple[int, int]]]] = []
    for i, row in enumerate(table.column("messages").to_pylist()):
        messages = _messages(row)
        if not any(m["role"] == "assistant" for m in messages):
            dropped["no_assistant_message"] += 1
            continue
        try:
            text, spans, was_folded = render_spans(tokenizer, messages)
        except (TemplateError, TypeError) as exc:  # the template's raise_exception, or its bad input
            dropped[TEMPLATE_REFUSED] += 1
            refusal = refusal or f"{type(exc).__name__}: {exc}"
            continue
        except ValueError:
            dropped["template_not_prefix_stable"] += 1
            continue
        folded += was_folded
        rendered.append((i, text, spans[-1:] if final_turn_only else spans))
    tokens = _token_labels_batch(tokenizer, [t for _, t, _ in rendered], [s for _, _, s in rendered])
    for (i, _, _), (ids, labels) in zip(rendered, tokens, strict=True):
        if max_length is not None and len(ids) > max_length:
            ids, labels = ids[:max_length], labels[:max_length]
        if not scores_a_token(labels):
            dropped["no_assistant_tokens_after_truncation"] += 1
            continue
        out_ids.append(ids)
        out_labels.append(labels)
        keep.append(i)
    if folded:
        log.info("chat template refused a system turn: folded into the first user turn in %d rows", folded)
    if dropped[TEMPLATE_REFUSED]:
        log.warning("chat template refused %d rows, left out (first: %s)", dropped[TEMPLATE_REFUSED], refusal)
    if not keep and not allow_empty:  # (a chunk of a cached encoding may keep nothing)
        hint = f"; the chat template refused them ({refusal})" if refusal else ""
        raise TrainDataError(f"no SFT row left to train on (dropped: {dict(dropped)}){hint}")
    enc = Encoded(input_ids=out_ids, labels=out_labels, row_ids=[ids_all[i] for i in keep],
                  weights=weights[keep], repeat=repeat[keep], dropped=dict(dropped), folded_system=folded)
    return pack(enc, max_length) if packing else enc


def pack(enc: Encoded, max_length: int | None) -> Encoded:
    """Greedy in-order packing: rows (expanded by repeat) are concatenated while the pack
    stays within ``max_length``. A pack's weight is the mean of its rows' weights."""
    if max_length is None:
        raise TrainDataError("packing needs max_length (or a length stage cap in the manifest)")
    order = np.repeat(np.arange(len(enc)), enc.repeat)
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order.tolist():
        n = len(enc.input_ids[i])
        if current and size + n > max_length:
            packs.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        packs.append(current)
    return Encoded(
        # (rows are lists, or numpy views of a token cache: concatenated either way)
        input_ids=[np.concatenate([np.asarray(enc.input_ids[i]) for i in p]).tolist() for p in packs],
        labels=[np.concatenate([np.asarray(enc.labels[i]) for i in p]).tolist() for p in packs],  # type: ignore[misc]
        row_ids=["+".join(enc.row_ids[i] for i in p) for p in packs],
        weights=np.array([float(np.mean(enc.weights[p])) for p in packs], dtype=np.float64),
        repeat=np.ones(len(packs), dtype=np.int64), dropped=dict(enc.dropped), folded_system=enc.folded_system,
        packed_rows=[[enc.row_ids[i] for i in p] for p in packs])


def classify_text(messages: list[dict[str, str]]) -> str:
    """The text a classifier sees: the prompt side's contents (``PROMPT_ROLES``), one per line."""
    return "\n".join(m["content"] for m in messages if m["role"] in PROMPT_ROLES)


def encode_classify(table: pa.Table, tokenizer: Any, label_map: LabelMap, max_length: int | None,
                    label_column: str = "label", *, allow_empty: bool = False) -> Encoded:
    """Rows -> token ids of their text and the class id of their label. Rows without a
    label, or with a label the map does not know, are dropped and counted."""
    if max_length is None:
        max_length = min(int(getattr(tokenizer, "model_max_length", 512) or 512), 512)
    weights, repeat, ids_all = row_weights(table), row_repeat(table), _ids(table)
    labels = table.column(label_column).to_pylist() if label_column in table.column_names else [None] * len(ids_all)
    dropped: Counter[str] = Counter()
    keep, texts, cls = [], [], []
    for i, (row, label) in enumerate(zip(table.column("messages").to_pylist(), labels, strict=True)):
        if label is None:
            dropped["no_label"] += 1
            continue
        if str(label) not in label_map.classes:
            dropped["unknown_label"] += 1
            continue
        keep.append(i)
        texts.append(classify_text(_messages(row)))
        cls.append(label_map.id(str(label)))
    if not keep and not allow_empty:
        raise TrainDataError(f"no labelled row left to train on (dropped: {dict(dropped)})")
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding=False) if texts else {"input_ids": []}
    class_ids = np.asarray(cls, dtype=np.int64)
    return Encoded(input_ids=[list(x) for x in enc["input_ids"]], labels=class_ids.tolist(),
                   row_ids=[ids_all[i] for i in keep], weights=weights[keep], class_ids=class_ids,
                   repeat=repeat[keep], dropped=dict(dropped))
