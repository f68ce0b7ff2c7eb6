"""The one walker of checkpoint directories: regular files only, the same
refusal (UnsafeSource, exit 2) for `push` and for the agent's capture."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdrain.errors import InvalidInput, UnsafePath, UnsafeSource
from ckptdrain.localfs import fsync_dir, regular_files
from ckptdrain.node.durable import list_files
from ckptdrain.transfer.scan import build_manifest


def _tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a")
    (root / "sub" / "b.bin").write_bytes(b"bb")
    (root / "sub" / "deeper" / "c.bin").write_bytes(b"ccc")
    (root / "empty-dir").mkdir()
    return root


def _scan(root: Path) -> object:
    return build_manifest(root, 1, 0, 1, created=0.0)


WALKERS: list[Callable[[Path], object]] = [regular_files, list_files, _scan]


def test_lists_regular_files_sorted_with_relative_paths(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    assert [rel for rel, _ in regular_files(root)] == ["a.bin", "sub/b.bin", "sub/deeper/c.bin"]
    assert all(full.read_bytes() for _, full in regular_files(root))
    assert list_files(root) == ["a.bin", "sub/b.bin", "sub/deeper/c.bin"]


@pytest.mark.parametrize("walk", WALKERS)
def test_a_symlink_below_the_root_is_refused(walk: Callable[[Path], object],
                                             tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    (root / "sub" / "link").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeSource, match="symlink"):
        walk(root)


@pytest.mark.parametrize("walk", WALKERS)
def test_a_symlinked_directory_is_refused_not_followed(walk: Callable[[Path], object],
                                                       tmp_path: Path) -> None:
    real = _tree(tmp_path / "real")
    root = tmp_path / "src"
    root.mkdir()
    (root / "d").symlink_to(real, target_is_directory=True)
    with pytest.raises(UnsafeSource, match="symlink"):
        walk(root)


@pytest.mark.parametrize("walk", WALKERS)
def test_a_symlinked_root_is_refused(walk: Callable[[Path], object], tmp_path: Path) -> None:
    real = _tree(tmp_path / "real")
    (tmp_path / "step-3").symlink_to(real, target_is_directory=True)
    with pytest.raises(UnsafeSource, match="symlink"):
        walk(tmp_path / "step-3")


@pytest.mark.parametrize("walk", WALKERS)
def test_a_missing_root_is_refused_never_empty(walk: Callable[[Path], object],
                                               tmp_path: Path) -> None:
    with pytest.raises(UnsafeSource, match="missing"):
        walk(tmp_path / "nothing-here")


@pytest.mark.parametrize("walk", WALKERS)
def test_a_fifo_is_refused(walk: Callable[[Path], object], tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    os.mkfifo(root / "sub" / "pipe")
    with pytest.raises(UnsafeSource, match=r"special file \(a FIFO\)"):
        walk(root)


def test_a_file_as_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(UnsafeSource, match="regular file"):
        regular_files(tmp_path / "f")


def test_one_error_class_and_exit_code_for_every_walker() -> None:
    assert issubclass(UnsafeSource, InvalidInput) and UnsafeSource.exit_code == 2


@pytest.mark.parametrize(("name", "said"), [
    ("back\\slash", "backslash"), ("new\nline", "control character"),
    (os.fsdecode(b"latin\xe9"), "not UTF-8")])
def test_a_name_a_manifest_cannot_carry_is_bad_input_naming_the_file(
        name: str, said: str, tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / name).write_bytes(b"x")
    with pytest.raises(UnsafeSource, match=said) as caught:
        regular_files(root)
    assert isinstance(caught.value, InvalidInput) and not isinstance(caught.value, UnsafePath)
    assert "\\udc" not in str(caught.value) and "\n" not in str(caught.value)


def test_an_empty_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UnsafeSource, match="at least one file"):
        build_manifest(tmp_path, 1, 0, 1, created=0.0)


def test_fsync_dir_accepts_a_directory_and_refuses_a_missing_one(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "gone")
