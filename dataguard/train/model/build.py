"""Load the model to train, wrap it in LoRA with checks, and split it into parameter groups.

Why groups by module type: the seeds' stability recipe gives embeddings a small learning rate
(x0.1: they are shared by every token and drift easily), attention x1.0 and the MLP x1.5, and
takes weight decay off norms, biases and embeddings (decaying a norm's gain or a bias toward 0
changes what the layer computes, and decaying rarely-seen token rows shrinks them for no
reason). The kind of a parameter is read from its name, which covers Llama/Qwen/Mistral
(embed_tokens, self_attn, mlp, *norm, lm_head), GPT-2 (wte/wpe, attn, mlp, ln_*) and BERT
(embeddings.*, attention.*, intermediate / output.dense, LayerNorm, classifier/pooler).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dataguard.train.tasks import get_task
from dataguard.train.tasks.base import Task

log = logging.getLogger(__name__)

KINDS = ("embeddings", "attention", "mlp", "norm", "head", "other")
TINY_CAUSAL = "tiny-causal-lm"
TINY_CLASSIFIER = "tiny-classifier"
MINILM = "minilm"
SMOLLM2 = "smollm2-135m"  # SmolLM2-135M-Instruct from an installed GGUF (dataguard.train.model.pretrained)


class ModelError(ValueError):
    """A model that cannot be loaded or wrapped as configured (message says what to change)."""


# ---------------------------------------------------------------------------------- loading
def load_model(task: str, model_spec: str, *, num_labels: int | None = None,
               label_map: Any = None, vocab_size: int | None = None, seed: int = 0,
               dtype: torch.dtype = torch.float32, quantization: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a local HF folder or one of the built-in names.

    ``label_map`` (anything with ``.labels`` or a list of names) names the classes in the
    model config, so a saved classifier knows its labels. ``dtype`` / ``quantization``: how
    the base is held (`dataguard.train.model.base_dtype`).
    """
    from transformers import AutoTokenizer

    from dataguard.train.model import tiny

    kind = _task(task)
    id2label = _id2label(label_map, num_labels)
    if kind.has_classes and not id2label:
        raise ModelError(f"{task} needs num_labels or a label map")
    spec = str(model_spec)
    _check_builtin(kind, spec)
    if spec == TINY_CAUSAL:
        tok = tiny.tiny_tokenizer()
        model = tiny.tiny_causal_lm(vocab_size or len(tok), seed=seed, pad_token_id=tok.pad_token_id)
        return model.to(dtype), tok
    if spec == TINY_CLASSIFIER:
        tok = AutoTokenizer.from_pretrained(tiny.minilm_path(), local_files_only=True)
        model = tiny.tiny_classifier(len(id2label), vocab_size=len(tok), seed=seed, id2label=id2label)
        return model.to(dtype), tok
    if spec == MINILM:
        path: Path | None = Path(tiny.minilm_path())
    elif spec == SMOLLM2:
        from dataguard.train.model.pretrained import PretrainedError, pretrained_path

        try:
            path = pretrained_path(spec)  # built once into dataguard's cache, then a plain folder
        except PretrainedError as exc:
            raise ModelError(str(exc)) from None
    else:
        path = check_model(task, spec)
    assert path is not None  # built-in names returned above
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    with torch.random.fork_rng(devices=[]), quiet_transformers():  # a fresh head's init must not move the caller's RNG
        torch.manual_seed(seed)
        model = kind.from_pretrained(str(path), dtype=dtype, quantization=quantization, id2label=id2label)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    if getattr(model.config, "pad_token_id", None) is None and tok.pad_token_id is not None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


def check_model(task: str, model_spec: str) -> Path | None:
    """The model folder of ``model_spec`` (None for a built-in name), refused now if it cannot
    be a Hugging Face model: no folder, no readable ``config.json``, a tokenizer missing, or a
    built-in of the other task. Cheap, so a run checks it before reading its shards."""
    spec = str(model_spec)
    if spec in (TINY_CAUSAL, TINY_CLASSIFIER, MINILM):
        _check_builtin(_task(task), spec)
        return None
    if spec == SMOLLM2:
        from dataguard.train.model.pretrained import PretrainedError, gguf_source

        try:
            gguf_source(spec)  # its packages are installed (else the pip line); the folder is built on load
        except PretrainedError as exc:
            raise ModelError(str(exc)) from None
        return None
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelError(f"model {spec!r}: not a folder and not one of {TINY_CAUSAL}, {TINY_CLASSIFIER}, {MINILM}, "
                         f"{SMOLLM2}")
    config = path / "config.json"
    if not config.is_file():
        raise ModelError(f"model {spec!r}: no config.json in {path} (expected a Hugging Face model folder)")
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"model {spec!r}: unreadable {config} ({exc})") from None
    if not isinstance(settings, dict) or not settings.get("model_type"):
        raise ModelError(f"model {spec!r}: {config} has no model_type (expected a Hugging Face model config)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"model {spec!r}: no tokenizer in {path} (expected one of {', '.join(TOKENIZER_FILES)})")
    return path


# Any one of them lets AutoTokenizer load a folder (fast, sentencepiece, WordPiece, BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No load report / progress bar on stdout (a fresh classifier head is expected)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _task(name: str) -> Task:
    try:
        return get_task(name)
    except ValueError as exc:
        raise ModelError(str(exc)) from None


def _check_builtin(kind: Task, spec: str) -> None:
    """A built-in tiny model of the other kind is refused: the tiny LM cannot classify, and
    the tiny classifier cannot generate."""
    if spec == TINY_CAUSAL and not kind.generates:
        raise ModelError(f"{TINY_CAUSAL} is a causal LM; use {TINY_CLASSIFIER} or {MINILM} for {kind.name}")
    if spec == TINY_CLASSIFIER and kind.generates:
        raise ModelError(f"{TINY_CLASSIFIER} is a classifier; use {TINY_CAUSAL} for {kind.name}")


def _id2label(label_map: Any, num_labels: int | None) -> dict[int, str]:
    if label_map is not None:
        labels = getattr(label_map, "classes", None)
        if labels is None and isinstance(label_map, Mapping) and "classes" in label_map:
            labels = label_map["classes"]
        if labels is None and isinstance(label_map, Mapping):
            labels = [k for k, _ in sorted(label_map.items(), key=lambda kv: kv[1])]
        if labels is None:
            labels = list(label_map)
        return {i: str(name) for i, name in enumerate(labels)}
    return {i: f"LABEL_{i}" for i in range(num_labels)} if num_labels else {}


# ---------------------------------------------------------------------------- module kinds
_NORM = re.compile(r"(^|[._])(\w*norm\w*|ln_\w+|ln\d*)($|\.)", re.IGNORECASE)
_HEAD = re.compile(r"(^|\.)(lm_head|classifier|score|qa_outputs|cls)($|\.)")
_EMB = re.compile(r"(^|\.)(embed_tokens|embed_positions|wte|wpe|embeddings|word_embeddings|shared)($|\.)")
_ATTN = re.compile(r"(^|\.)(self_attn|attn|attention|self_attention|crossattention)($|\.)")
_MLP = re.compile(r"(^|\.)(mlp|ffn|feed_forward|intermediate|block_sparse_moe)($|\.)|(^|\.)output\.dense($|\.)")


def module_kind(name: str, module: nn.Module | None = None) -> str:
    """'embeddings' | 'attention' | 'mlp' | 'norm' | 'head' | 'other' for a parameter or module name.

    Norms are checked first (BERT's ``attention.output.LayerNorm`` is a norm, not attention),
    then the head, embeddings, attention, MLP. ``module`` (when given) catches norms whose
    name does not say so.
    """
    if module is not None and (isinstance(module, nn.LayerNorm | nn.GroupNorm)
                               or type(module).__name__.lower().endswith(("norm", "rmsnorm"))):
        return "norm"
    if _NORM.search(name):
        return "norm"
    if _HEAD.search(name):
        return "head"
    if _EMB.search(name):
        return "embeddings"
    if _ATTN.search(name):
        return "attention"
    if _MLP.search(name):
        return "mlp"
    return "other"


def parameter_kinds(model: nn.Module) -> dict[str, str]:
    """Trainable parameter name -> kind, looking at the owning module too."""
    owners = dict(model.named_modules())
    kinds = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            kinds[name] = module_kind(name, owners.get(name.rpartition(".")[0]))
    return kinds


def kind_params(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Kind -> trainable parameters (the layer-wise clipping rules work per kind)."""
    named = dict(model.named_parameters())
    out: dict[str, list[nn.Parameter]] = {k: [] for k in KINDS}
    for name, kind in parameter_kinds(model).items():
        out[kind].append(named[name])
    return out


def _no_decay(name: str, kind: str) -> bool:
    # Norms and biases: always. Embeddings: by choice (see the module docstring).
    return kind in ("norm", "embeddings") or name.endswith("bias")


def param_groups(model: nn.Module, cfg: Any) -> list[dict[str, Any]]:
    """AdamW parameter groups: lr = cfg.lr x multiplier of the kind (or of the first matching
    ``lr_patterns`` regex), weight decay off for norms, biases and embeddings."""
    mults = {"embeddings": 0.1, "attention": 1.0, "mlp": 1.5, "other": 1.0, "head": 1.0}
    mults.update(getattr(cfg, "lr_multipliers", None) or {})
    patterns = [(re.compile(p), float(m)) for p, m in (getattr(cfg, "lr_patterns", None) or {}).items()]
    lr, decay = float(cfg.lr), float(getattr(cfg, "weight_decay", 0.0))
    named = dict(model.named_parameters())
    groups: dict[tuple[str, bool, float, str], dict[str, Any]] = {}
    for name, kind in parameter_kinds(model).items():
        mult = float(mults.get(kind, mults.get("other", 1.0)))
        source = kind
        for rx, m in patterns:
            if rx.search(name):
                mult, source = m, f"pattern {rx.pattern}"
                break
        no_decay = _no_decay(name, kind)
        key = (kind, no_decay, mult, source)
        group = groups.setdefault(key, {"params": [], "names": [], "kind": kind, "lr": lr * mult,
                                        "lr_mult": mult, "weight_decay": 0.0 if no_decay else decay,
                                        "rule": source})
        group["params"].append(named[name])
        group["names"].append(name)
    if not groups:
        raise ModelError("the model has no trainable parameters")
    out = []
    for group in groups.values():
        group["n_params"] = sum(p.numel() for p in group["params"])
        out.append(group)
    return out


def describe_groups(groups: Iterable[Mapping[str, Any]]) -> str:
    """The parameter groups as a printable table (also recorded in the run folder)."""
    rows = [("kind", "rule", "lr", "x", "decay", "tensors", "params")]
    for g in groups:
        rows.append((g["kind"], g.get("rule", g["kind"]), f"{g['lr']:.3g}", f"{g.get('lr_mult', 1.0):g}",
                     f"{g['weight_decay']:g}", str(len(g["params"])), f"{g.get('n_params', 0):,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def groups_record(groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON-able summary of the groups (no tensors)."""
    return [{"kind": g["kind"], "rule": g.get("rule"), "lr": g["lr"], "lr_mult": g.get("lr_mult"),
             "weight_decay": g["weight_decay"], "tensors": len(g["params"]), "params": g.get("n_params"),
             "names": list(g.get("names", []))} for g in groups]


# ------------------------------------------------------------------------------------ LoRA
_DEFAULT_TARGETS = (("q_proj", "k_proj", "v_proj", "o_proj"), ("query", "key", "value"),
                    ("c_attn",), ("q_lin", "k_lin", "v_lin"))


def _linear_suffixes(model: nn.Module) -> list[str]:
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, nn.Linear | nn.Conv1d) or type(m).__name__ == "Conv1D"})


def hidden_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for attr in ("hidden_size", "n_embd", "d_model", "dim"):
        value = getattr(config, attr, None)
        if isinstance(value, int):
            return value
    return None


def apply_lora(model: nn.Module, lora: Mapping[str, Any], task: str) -> tuple[Any, dict[str, Any]]:
    """Wrap ``model`` with a peft LoRA adapter after checking the settings; returns (model, record).

    Checks, before any training: r > 0 and r <= hidden size (warn when it does not divide it),
    every target module exists (the error lists the ones that do), each A/B pair has the
    shapes (r, in) / (out, r) of the layer it wraps, and there is something to train.
    """
    from peft import LoraConfig, get_peft_model

    r = int(lora.get("r", 8))
    hidden = hidden_size(model)
    if r <= 0:
        raise ModelError(f"lora.r must be > 0, got {r}")
    if hidden is not None and r > hidden:
        raise ModelError(f"lora.r = {r} is larger than the hidden size {hidden}")
    if hidden is not None and hidden % r:
        log.warning("lora.r = %d does not divide the hidden size %d", r, hidden)
        warnings.warn(f"lora.r = {r} does not divide the hidden size {hidden}", stacklevel=2)
    available = _linear_suffixes(model)
    targets = lora.get("targets")
    if targets and tuple(targets) == _DEFAULT_TARGETS[0] and not set(targets) & set(available):
        targets = None  # the config's Llama-style default on another architecture: use its own q/k/v
    if not targets:
        targets = next((list(t) for t in _DEFAULT_TARGETS if all(x in available for x in t)), None)
        if targets is None:
            raise ModelError(f"lora.targets not set and no q/k/v projections found; linear modules: "
                             f"{', '.join(available)}")
    targets = [str(t) for t in targets]
    missing = [t for t in targets if t not in available]
    if missing:
        raise ModelError(f"lora.targets {', '.join(missing)} not in the model; its linear modules are: "
                         f"{', '.join(available)}")
    config = LoraConfig(r=r, lora_alpha=float(lora.get("alpha", 2 * r)), lora_dropout=float(lora.get("dropout", 0.0)),
                        target_modules=targets, task_type=_task(task).lora_task_type)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(lora.get("seed", 0)))
        with warnings.catch_warnings():  # peft calls a transformers API deprecated for v6
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = get_peft_model(model, config)
    n_layers = _check_lora_shapes(wrapped, r)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    if trainable <= 0:
        raise ModelError("LoRA left no trainable parameters")
    record = {"r": r, "alpha": config.lora_alpha, "dropout": config.lora_dropout, "targets": targets,
              "wrapped_layers": n_layers, "trainable_params": trainable, "total_params": total,
              "hidden_size": hidden}
    return wrapped, record


def _check_lora_shapes(model: nn.Module, r: int) -> int:
    from peft.tuners.lora import LoraLayer

    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        base = module.get_base_layer()
        in_f = getattr(base, "in_features", None)
        out_f = getattr(base, "out_features", None)
        if in_f is None and hasattr(base, "weight"):  # GPT-2 Conv1D: weight is (in, out)
            in_f, out_f = base.weight.shape
        for adapter, a in module.lora_A.items():
            b = module.lora_B[adapter]
            if tuple(a.weight.shape) != (r, in_f) or tuple(b.weight.shape) != (out_f, r):
                raise ModelError(f"LoRA shapes disagree at {name}: A {tuple(a.weight.shape)}, "
                                 f"B {tuple(b.weight.shape)}, layer in={in_f} out={out_f}, r={r}")
        count += 1
    if count == 0:
        raise ModelError("LoRA wrapped no layer")
    return count


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute activations in backward (less memory, ~30% more time)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ModelError(f"{type(base).__name__} does not support gradient checkpointing")
    enable = getattr(base, "activation_checkpointing_enable", None)  # transformers >= 5 name
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(base, "config"):
        base.config.use_cache = False
