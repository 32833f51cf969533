"""The test browser's start: a Chromium that hangs before answering is killed and started once
more on a fresh profile (seen once in CI: every browser test then errored at setup)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dataguard.testing.browser import BrowserError, Chromium, chromium_path


def _wrapper(tmp_path: Path, body: str) -> str:
    script = tmp_path / "chromium-wrapper.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_start_that_hangs_is_retried_on_a_fresh_process(tmp_path: Path) -> None:
    real = chromium_path()
    assert real is not None, "chromium missing: run scripts/install_chromium.sh"
    marker = tmp_path / "hung-once"
    exe = _wrapper(tmp_path, f'if [ ! -e "{marker}" ]; then touch "{marker}"; exec sleep 600; fi\n'
                             f'exec "{real}" "$@"')
    with Chromium(executable=exe, timeout=10) as browser:  # the hung start costs this; a cold one takes ~1-3 s
        assert browser.evaluate("1 + 1") == 2
    assert marker.exists()


def test_a_start_that_always_hangs_fails_in_one_line_and_leaves_no_process(tmp_path: Path) -> None:
    exe = _wrapper(tmp_path, f'echo $$ >> "{tmp_path / "pids"}"\nexec sleep 600')
    with pytest.raises(BrowserError, match="timeout waiting for Target.createTarget"):
        Chromium(executable=exe, timeout=1)
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2  # started twice
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
