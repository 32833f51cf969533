"""Chat templates that refuse a conversation (issue #24) never stop an SFT run.

Real tokenizers with real templates, offline: the tiny byte-level tokenizer given Gemma's
template (``raise_exception('System role not supported')``) and Mistral's (user/assistant
must alternate, no system role). A refused system turn is folded into the first user turn;
a row still refused is left out and counted as ``template_refused``; the rest encodes.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from dataguard.train.data.encode import IGNORE_INDEX, TEMPLATE_REFUSED, encode_sft, fold_system
from dataguard.train.errors import TrainDataError
from dataguard.train.model.tiny import tiny_tokenizer

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

SYSTEM_ROW = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
              {"role": "assistant", "content": "Blue."}]
PLAIN_ROW = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
TWO_USERS_ROW = [{"role": "user", "content": "One"}, {"role": "user", "content": "Two"},
                 {"role": "assistant", "content": "Three"}]
FOLDED = "Be brief.\n\nName a colour."


def _table(messages) -> pa.Table:
    n = len(messages)
    return pa.table({"id": [f"r{i}" for i in range(n)], "source": ["s"] * n, "messages": messages})


def _tok(template: str):
    tok = tiny_tokenizer()
    tok.chat_template = template
    return tok


def _prompt_and_trained(tok, ids, labels) -> tuple[str, str]:
    prompt = tok.decode([t for t, lab in zip(ids, labels, strict=True) if lab == IGNORE_INDEX])
    trained = tok.decode([lab for lab in labels if lab != IGNORE_INDEX])
    return prompt, trained


def test_the_templates_really_refuse():
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="System role not supported"):
        _tok(GEMMA_TEMPLATE).apply_chat_template(SYSTEM_ROW, tokenize=False)
    with pytest.raises(TemplateError, match="alternate"):
        _tok(MISTRAL_TEMPLATE).apply_chat_template(TWO_USERS_ROW, tokenize=False)


def test_fold_system_rules():
    assert fold_system(SYSTEM_ROW) == [{"role": "user", "content": FOLDED}, SYSTEM_ROW[2]]
    assert fold_system(PLAIN_ROW) is None  # nothing to fold
    assert fold_system([SYSTEM_ROW[0], SYSTEM_ROW[2]]) is None  # no user turn to fold into
    assert fold_system([*PLAIN_ROW, SYSTEM_ROW[0], *PLAIN_ROW]) is None  # a system turn later on
    two = fold_system([{"role": "system", "content": "A."}, {"role": "system", "content": ""}, *SYSTEM_ROW[1:]])
    assert two is not None and two[0]["content"] == "A.\n\nName a colour."


def test_gemma_style_system_turn_is_folded_into_the_first_user_turn():
    tok = _tok(GEMMA_TEMPLATE)
    enc = encode_sft(_table([SYSTEM_ROW, PLAIN_ROW]), tok, None)
    assert len(enc) == 2 and enc.dropped == {} and enc.folded_system == 1
    prompt, trained = _prompt_and_trained(tok, enc.input_ids[0], enc.labels[0])
    # the first user turn's tokens carry the system text, none of it is trained
    assert f"<start_of_turn>user\n{FOLDED}<end_of_turn>\n" in prompt
    assert tok.decode(enc.input_ids[0]).startswith(f"<start_of_turn>user\n{FOLDED}<end_of_turn>\n")
    assert trained == "Blue.<end_of_turn>\n"
    # a row without a system turn is rendered as before
    assert tok.decode(enc.input_ids[1]) == tok.apply_chat_template(PLAIN_ROW, tokenize=False)


def test_mistral_style_alternation_drops_the_row_with_a_reason_and_encodes_the_rest():
    tok = _tok(MISTRAL_TEMPLATE)
    enc = encode_sft(_table([PLAIN_ROW, TWO_USERS_ROW, SYSTEM_ROW]), tok, None)
    assert enc.dropped == {TEMPLATE_REFUSED: 1}
    assert enc.row_ids == ["r0", "r2"] and enc.folded_system == 1
    prompt, trained = _prompt_and_trained(tok, enc.input_ids[1], enc.labels[1])
    assert prompt == f"[INST] {FOLDED} [/INST]"
    assert trained == "Blue.<|im_end|> "
    batch = enc.collate([0, 1], tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 2 and (batch["labels"] != IGNORE_INDEX).any()


def test_refusals_survive_packing_and_a_fully_refused_set_is_a_clean_data_error():
    tok = _tok(MISTRAL_TEMPLATE)
    packed = encode_sft(_table([PLAIN_ROW, TWO_USERS_ROW, SYSTEM_ROW]), tok, 256, packing=True)
    assert packed.dropped == {TEMPLATE_REFUSED: 1} and packed.folded_system == 1
    with pytest.raises(TrainDataError, match=TEMPLATE_REFUSED) as err:
        encode_sft(_table([TWO_USERS_ROW, [SYSTEM_ROW[0], SYSTEM_ROW[2]]]), tok, None)
    assert "alternate" in str(err.value)


def test_a_mid_conversation_system_turn_is_not_moved():
    tok = _tok(GEMMA_TEMPLATE)
    row = [*PLAIN_ROW, {"role": "system", "content": "Now be formal."}, *PLAIN_ROW]
    enc = encode_sft(_table([row, PLAIN_ROW]), tok, None)
    assert enc.dropped == {TEMPLATE_REFUSED: 1} and enc.row_ids == ["r1"]
