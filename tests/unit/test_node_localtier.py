"""The local tier: durable capture, verification, retention, and nothing half-published."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptdrain.errors import IntegrityError, UnsafeSource
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier


def _checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    d = root / f"step-{step}"
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


FILES = {"model.bin": os.urandom(3 << 20), "opt/adam.bin": b"m" * 1000, "empty": b""}


def test_capture_copies_checksums_and_publishes(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work", 4, FILES)
    tier = LocalTier(tmp_path / "local")
    captured = tier.capture(src, 4, writer=0, writers=1)
    assert tier.steps() == [4]
    assert {f.path for f in captured.manifest.files} == set(FILES)
    for rel, data in FILES.items():
        assert (tier.data_dir(4) / rel).read_bytes() == data
    assert tier.verify(4) == captured.manifest == tier.manifest(4)
    assert captured.manifest.total_bytes == sum(map(len, FILES.values()))


def test_verify_detects_a_flipped_byte_and_a_missing_file(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    tier.capture(_checkpoint(tmp_path / "work", 1, FILES), 1, writer=0, writers=1)
    target = tier.data_dir(1) / "model.bin"
    data = bytearray(target.read_bytes())
    data[12345] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.bin"):
        tier.verify(1)
    target.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        tier.verify(1)


def test_aborted_capture_publishes_nothing_and_leaves_no_temp(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    src = _checkpoint(tmp_path / "work", 9, FILES)
    with pytest.raises(CopyAborted):
        tier.capture(src, 9, writer=0, writers=1, should_stop=lambda: True)
    assert tier.steps() == []
    assert os.listdir(tmp_path / "local") == []


def test_leftover_temp_from_a_killed_capture_is_removed(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    (tmp_path / "local" / ".capture-step-3-999" / "data").mkdir(parents=True)
    assert len(tier.remove_temps()) == 1
    assert tier.steps() == []


def test_symlinks_are_refused(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "work", 2, {"a": b"1"})
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeSource, match="symlink"):
        LocalTier(tmp_path / "local").capture(src, 2, writer=0, writers=1)


def test_capture_is_idempotent(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    src = _checkpoint(tmp_path / "work", 5, {"a": b"1"})
    first = tier.capture(src, 5, writer=0, writers=1)
    again = tier.capture(src, 5, writer=0, writers=1)
    assert again.manifest == first.manifest and again.seconds == 0.0


def test_apply_retention_deletes_on_disk(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    for step in (1, 2, 3):
        tier.capture(_checkpoint(tmp_path / "work", step, {"a": b"x"}), step, writer=0, writers=1)
        tier.mark_global(step, "file:///x")
    assert tier.apply_retention(1, protected=[]) == [1, 2]
    assert tier.steps() == [3]
    assert sorted(os.listdir(tmp_path / "local")) == ["step-3"]
