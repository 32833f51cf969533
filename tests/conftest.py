"""Shared test fixtures: where the real public data lives, and offline settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
TEST_DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public data in ../shared/data (present on dev machines and in CI)."""
    assert SHARED_DATA.is_dir(), f"real test data missing: {SHARED_DATA}"
    return SHARED_DATA


@pytest.fixture(scope="session")
def test_data() -> Path:
    return TEST_DATA
