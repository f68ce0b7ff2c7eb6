"""Manifests: round trips, and refusal of anything malformed coming back from the network."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import keys
from ckptdrain.errors import IntegrityError, UnsafePath
from ckptdrain.manifest import FileEntry, WriterManifest, check_consistent

name = st.text(st.sampled_from("abcxyz019_-."), min_size=1, max_size=8).filter(
    lambda s: s not in (".", ".."))
entries = st.lists(
    st.tuples(st.lists(name, min_size=1, max_size=3).map("/".join),
              st.integers(0, 2**40), st.integers(0, 2**32 - 1)),
    max_size=20, unique_by=lambda t: t[0].split("/")[0])


@given(step=st.integers(0, 10**18 - 1), writers=st.integers(1, 1000), files=entries,
       part=st.one_of(st.none(), st.integers(1, 2**32)))
def test_round_trip(step: int, writers: int, files: list[tuple[str, int, int]],
                    part: int | None) -> None:
    m = WriterManifest(step=step, writer=writers - 1, writers=writers, created=1.5,
                       part_size=part,
                       files=tuple(FileEntry(p, s, f"{c:08x}") for p, s, c in files))
    again = WriterManifest.from_json(m.to_json())
    assert again.to_json() == m.to_json()
    assert {f.path for f in again.files} == {f.path for f in m.files}
    assert again.total_bytes == sum(s for _, s, _ in files)


def doc(**change: object) -> bytes:
    base = {"format": 1, "step": 3, "writer": 0, "writers": 1, "created": 1.0,
            "files": [{"path": "a", "size": 1, "crc32c": "0000abcd"}]}
    base.update(change)
    return json.dumps(base).encode()


@pytest.mark.parametrize("data", [
    b"not json", b"[]", doc(step=-1), doc(step="3"), doc(writer=1), doc(writers=0),
    doc(format=2), doc(created="x"),
    doc(files={}), doc(files=[{"path": "a", "size": -1, "crc32c": "00000000"}]),
    doc(files=[{"path": "a", "size": 1, "crc32c": "XYZ"}]),
    doc(files=[{"path": "a", "size": True, "crc32c": "00000000"}]),
    doc(part_size=0), doc(extra={"a": 1}),
])
def test_malformed_refused(data: bytes) -> None:
    with pytest.raises(IntegrityError):
        WriterManifest.from_json(data)


@pytest.mark.parametrize("path", ["../x", "/x", "a/../b", "a//b", "a\\b"])
def test_unsafe_paths_refused(path: str) -> None:
    with pytest.raises(UnsafePath):
        WriterManifest.from_json(doc(files=[{"path": path, "size": 1, "crc32c": "00000000"}]))


def test_duplicate_paths_refused() -> None:
    twice = [{"path": "a", "size": 1, "crc32c": "00000000"}] * 2
    with pytest.raises(UnsafePath):
        WriterManifest.from_json(doc(files=twice))


def test_consistency_needs_every_writer_once() -> None:
    ms = [WriterManifest(step=5, writer=w, writers=3, created=0.0, files=()) for w in range(3)]
    check_consistent(ms)
    with pytest.raises(IntegrityError):
        check_consistent(ms[:2])
    with pytest.raises(IntegrityError):
        check_consistent([*ms, ms[0]])
    other = WriterManifest(step=6, writer=2, writers=3, created=0.0, files=())
    with pytest.raises(IntegrityError):
        check_consistent([ms[0], ms[1], other])


@given(st.integers(0, 10**18 - 1), st.integers(0, 99999))
def test_manifest_keys_parse_back(step: int, writer: int) -> None:
    assert keys.parse_manifest_key(keys.manifest_key(step, writer)) == (step, writer)
