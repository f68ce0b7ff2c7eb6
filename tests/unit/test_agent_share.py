"""The bandwidth share: the file's value, or the default with a warning, never unlimited."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from ckptdrain.agent.share import Share, ShareWatcher, resolve_share


@pytest.mark.parametrize(("content", "rate", "source"), [
    ("50000000", 50e6, "file"),
    ("50000000\n", 50e6, "file"),
    ("20MB/s", 20e6, "file"),
    ("", 7e6, "default"),
    ("fast", 7e6, "default"),
    ("0", 7e6, "default"),
    ("-5", 7e6, "default"),
    ("inf", 7e6, "default"),
])
def test_resolve_share(tmp_path: Path, content: str, rate: float, source: str) -> None:
    path = tmp_path / "bandwidth"
    path.write_text(content)
    share = resolve_share(path, 7e6)
    assert (share.rate, share.source) == (rate, source)
    assert (share.problem is None) == (source == "file")


def test_missing_file_uses_default(tmp_path: Path) -> None:
    share = resolve_share(tmp_path / "nope", 7e6)
    assert share.rate == 7e6 and "does not exist" in (share.problem or "")


def test_watcher_applies_changes_within_two_seconds(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bandwidth"
    path.write_text("1000000")
    seen: list[Share] = []
    watcher = ShareWatcher(path, 5e6, seen.append, poll_seconds=0.05)
    assert seen[-1].rate == 1e6
    watcher.start()
    try:
        path.write_text("3000000")
        deadline = time.monotonic() + 2
        while seen[-1].rate != 3e6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen[-1].rate == 3e6
        with caplog.at_level(logging.WARNING):
            path.write_text("garbage")
            deadline = time.monotonic() + 2
            while seen[-1].rate != 5e6 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert seen[-1] == Share(5e6, "default", seen[-1].problem)
        assert "using default" in caplog.text
        # An unchanged problem is not re-applied (nor re-warned) every poll.
        count = len(seen)
        time.sleep(0.3)
        assert len(seen) == count
    finally:
        watcher.stop()
