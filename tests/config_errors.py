"""The shared check that each config mistake is one line naming the file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataguard.config import ConfigError, load_config


def assert_one_line_errors(folder: Path, base: str, cases: dict[str, str]) -> None:
    """Each ``stages`` block of ``cases`` after ``base`` fails to load with one line matching
    its pattern."""
    for stages, message in cases.items():
        (folder / "p.yaml").write_text(base + stages)
        with pytest.raises(ConfigError, match=message) as err:
            load_config(folder / "p.yaml")
        assert "\n" not in str(err.value)
