"""The shared modes of the work dir: whoever creates, the group may use."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckptdrain import group_access


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_make_dir_is_setgid_and_group_writable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        made = group_access.make_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert _mode(made) == 0o2775
    assert _mode(tmp_path / "a") == 0o2775  # a missing parent is shared too


def test_share_tree_opens_files_and_directories_to_the_group(tmp_path: Path) -> None:
    root = tmp_path / "step-3"
    (root / "sub").mkdir(parents=True, mode=0o700)
    (root / "sub" / "shard").write_bytes(b"x")
    os.chmod(root / "sub" / "shard", 0o600)
    (root / "keep").write_bytes(b"y")
    os.chmod(root / "keep", 0o640)
    group_access.share_tree(root)
    assert _mode(root / "sub") == 0o2775
    assert _mode(root / "sub" / "shard") == 0o664
    assert _mode(root / "keep") == 0o664


def test_share_tree_never_follows_or_changes_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    os.chmod(outside, 0o600)
    root = tmp_path / "step-1"
    root.mkdir()
    (root / "link").symlink_to(outside)
    group_access.share_tree(root)
    assert _mode(outside) == 0o600
