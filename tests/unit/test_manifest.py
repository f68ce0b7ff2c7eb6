"""Manifests: round trips, and refusal of anything malformed coming back from the network."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptdrain import keys
from ckptdrain.errors import IntegrityError, UnsafePath
from ckptdrain.manifest import FileEntry, WriterManifest, check_consistent

name = st.text(st.sampled_from("abcxyz019_-."), min_size=1, max_size=8).filter(
    lambda s: s not in (".", ".."))
entries = st.lists(
    st.tuples(st.lists(name, min_size=1, max_size=3).map("/".join),
              st.integers(0, 2**40), st.integers(0, 2**32 - 1)),
    min_size=1, max_size=20, unique_by=lambda t: t[0].split("/")[0])


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
    doc(format=2), doc(created="x"), doc(files=[]),
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


ONE = (FileEntry("a", 1, "0000abcd"),)


def test_consistency_needs_every_writer_once() -> None:
    ms = [WriterManifest(step=5, writer=w, writers=3, created=0.0, files=ONE) for w in range(3)]
    check_consistent(ms)
    with pytest.raises(IntegrityError):
        check_consistent(ms[:2])
    with pytest.raises(IntegrityError):
        check_consistent([*ms, ms[0]])
    other = WriterManifest(step=6, writer=2, writers=3, created=0.0, files=ONE)
    with pytest.raises(IntegrityError):
        check_consistent([ms[0], ms[1], other])


@given(st.integers(0, 10**18 - 1), st.integers(0, 99999))
def test_manifest_keys_parse_back(step: int, writer: int) -> None:
    assert keys.parse_manifest_key(keys.manifest_key(step, writer)) == (step, writer)


# -- format 2, and manifests as hostile input ------------------------------------

ATTEMPT = "0123456789abcdef"


def real_manifest() -> WriterManifest:
    """A manifest as a drain writes it: format 2, attempt and per-file part sizes."""
    files = (FileEntry("empty", 0, "00000000", 64 << 20),
             FileEntry("model.bin", 200 << 20, "0a1b2c3d", 64 << 20),
             FileEntry("shards/rank0.pt", 12345, "deadbeef", 64 << 20))
    return WriterManifest(step=1200, writer=3, writers=8, files=files, created=1.7e9,
                          part_size=64 << 20, attempt=ATTEMPT, extra={"job": "llama"})


def test_format_2_round_trips_and_names_its_attempt() -> None:
    m = real_manifest()
    doc = json.loads(m.to_json())
    assert doc["format"] == 2 and doc["attempt"] == ATTEMPT
    assert {f["path"]: f["part_size"] for f in doc["files"]}["model.bin"] == 64 << 20
    assert WriterManifest.from_json(m.to_json()) == m
    assert keys.data_key(1200, 3, "model.bin", m.attempt) == \
        f"data/{1200:020d}/00003/{ATTEMPT}/model.bin"
    legacy = WriterManifest(step=1, writer=0, writers=1, files=ONE, created=0.0)
    assert json.loads(legacy.to_json())["format"] == 1
    assert "attempt" not in json.loads(legacy.to_json())
    assert keys.data_key(1, 0, "a", None) == f"data/{1:020d}/00000/a"


def test_same_content_ignores_attempt_time_and_part_sizes() -> None:
    m = real_manifest()
    other = WriterManifest(step=m.step, writer=m.writer, writers=m.writers, created=5.0,
                           files=tuple(FileEntry(f.path, f.size, f.crc32c) for f in m.files))
    assert m.same_content(other)
    changed = (other.files[0], FileEntry("model.bin", 200 << 20, "0a1b2c3e"), other.files[2])
    assert not m.same_content(WriterManifest(step=m.step, writer=m.writer, writers=m.writers,
                                             created=5.0, files=changed))


def with_file(**change: object) -> bytes:
    doc = json.loads(real_manifest().to_json())
    doc["files"][1].update(change)
    return json.dumps(doc).encode()


def with_doc(**change: object) -> bytes:
    doc = json.loads(real_manifest().to_json())
    doc.update(change)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("data", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"format": 2, "files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    with_file(path="a\ud800"), with_doc(extra={"k": "\udc00"}),
    with_file(size=2**70), with_file(size=10**15), with_file(size=-1),
    with_file(path="d/" + "x" * 300), with_file(path="x" * 1000),
    with_file(part_size=-1), with_file(part_size=0), with_file(part_size=2**70),
    with_file(part_size=1),  # 200 MiB in 1-byte parts: far more than 10,000 parts
    with_file(part_size="64MiB"), with_file(crc32c=12345678), with_file(path=["a"]),
    with_doc(writers=10**30), with_doc(writers="8"), with_doc(step=[1200]),
    with_doc(created=None), with_doc(created=float("nan")), with_doc(extra=[]),
    with_doc(attempt="../../etc"), with_doc(attempt=ATTEMPT.upper()),
    with_doc(attempt=ATTEMPT + "\n"), with_doc(attempt=None), with_doc(format=1),
    with_doc(format=3), with_doc(format=True), with_doc(files=[None]),
    with_file(path="a\nb"), with_doc()[:-1] + b',"n":' + b"9" * 5000 + b"}",
    b"\xff\xfe{}", b"",
])
def test_hostile_manifests_are_integrity_errors(data: bytes) -> None:
    with pytest.raises(IntegrityError) as caught:
        WriterManifest.from_json(data)
    assert str(caught.value).isprintable() and len(str(caught.value)) < 1000


def test_format_2_needs_every_files_part_size() -> None:
    doc = json.loads(real_manifest().to_json())
    del doc["files"][1]["part_size"]
    with pytest.raises(IntegrityError, match="part_size"):
        WriterManifest.from_json(json.dumps(doc).encode())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document (as a path of keys and indices)."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _replace(doc: object, where: tuple, value: object) -> object:
    if not where:
        return value
    head, rest = where[0], where[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    assert isinstance(doc, list)
    return [_replace(v, rest, value) if i == head else v for i, v in enumerate(doc)]


@st.composite
def mutated_manifests(draw: st.DrawFn) -> bytes:
    """A real manifest with some places replaced, keys dropped, or bytes broken."""
    doc: object = json.loads(real_manifest().to_json())
    for _ in range(draw(st.integers(1, 3))):
        places = _paths(doc)
        where = draw(st.sampled_from(places))
        doc = _replace(doc, where, draw(json_values))
    data = json.dumps(doc).encode()
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(data)))
        junk = draw(st.binary(max_size=8))
        data = data[:cut] + junk + data[cut + draw(st.integers(0, 4)):]
    return data


@settings(max_examples=500, deadline=None)
@given(mutated_manifests())
def test_fuzzed_manifests_parse_or_raise_integrity_errors_only(data: bytes) -> None:
    try:
        m = WriterManifest.from_json(data)
    except IntegrityError:  # UnsafePath is one
        return
    # What parses is whole: it serialises and every data key can be derived.
    assert WriterManifest.from_json(m.to_json()) == m
    for f in m.files:
        assert len(keys.data_key(m.step, m.writer, f.path, m.attempt).encode()) <= 1024
