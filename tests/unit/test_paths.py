"""Paths from manifests are hostile until proven otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import paths
from ckptdrain.errors import UnsafePath

HOSTILE = ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "./a", "..",
           "a\x00b", "a\\..\\b", "C:\\x", "x" * 5000]


@pytest.mark.parametrize("bad", HOSTILE)
def test_hostile_paths_refused(bad: str) -> None:
    with pytest.raises(UnsafePath):
        paths.check_relative_path(bad)


@pytest.mark.parametrize("bad", [None, 3, b"a"])
def test_non_strings_refused(bad: object) -> None:
    with pytest.raises(UnsafePath):
        paths.check_relative_path(bad)


component = st.text(st.characters(blacklist_characters="/\\\x00", blacklist_categories=("Cs",)),
                    min_size=1, max_size=12).filter(lambda c: c not in (".", ".."))


@given(st.lists(component, min_size=1, max_size=6))
def test_safe_paths_round_trip_and_stay_inside(tmp_path_factory: pytest.TempPathFactory,
                                               parts: list[str]) -> None:
    root = tmp_path_factory.mktemp("root")
    rel = "/".join(parts)
    assert paths.check_relative_path(rel) == rel
    target = paths.resolve_under(root, rel)
    assert target.relative_to(root.resolve()).parts == tuple(parts)


@given(st.lists(st.sampled_from(["..", ".", "", "a", "b"]), min_size=1, max_size=6))
def test_any_dot_or_empty_component_is_refused(parts: list[str]) -> None:
    rel = "/".join(parts)
    if any(p in ("..", ".", "") for p in parts):
        with pytest.raises(UnsafePath):
            paths.check_relative_path(rel)
    else:
        assert paths.check_relative_path(rel) == rel


def test_symlink_in_destination_cannot_redirect(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "sub")
    with pytest.raises(UnsafePath):
        paths.resolve_under(root, "sub/file")
    os.symlink(outside / "f", root / "f")
    with pytest.raises(UnsafePath):
        paths.resolve_under(root, "f")


def test_duplicates_and_file_dir_clashes_refused() -> None:
    with pytest.raises(UnsafePath):
        paths.check_path_set(["a", "a"])
    with pytest.raises(UnsafePath):
        paths.check_path_set(["a", "a/b"])
    paths.check_path_set(["a/b", "a/c", "b"])


# Object keys: the same rule, with S3's length limit and the reserved names ------------
@pytest.mark.parametrize("bad", [*HOSTILE[:-1], "\ud800", "a/\udcff.bin"])
def test_keys_and_paths_refuse_the_same_hostile_names(bad: str) -> None:
    for check in (paths.check_relative_path, paths.check_key):
        with pytest.raises(UnsafePath):
            check(bad)


def test_keys_add_the_length_limit_and_reserved_names() -> None:
    for name in ("x" * 1025, ".ckptdrain-tmp-1", "a/.ckptdrain-multipart/b"):
        assert paths.check_relative_path(name) == name
        with pytest.raises(UnsafePath):
            paths.check_key(name)
    assert paths.check_key("x" * 1024) == "x" * 1024


@given(st.text(min_size=1, max_size=40))
def test_every_safe_key_is_a_safe_path(text: str) -> None:
    try:
        paths.check_key(text)
    except UnsafePath:
        return
    assert paths.check_relative_path(text) == text
