"""Ranged, verified reads of a committed step (the DCP reader's tiers), on real S3 servers.

A file drained in three parts is committed with its parts' CRC32Cs; a read of
a range fetches only the part under it, verified against that part's CRC32C.
A byte flipped in the stored object is refused when a read touches its part
(and only then: the other parts still verify and serve), a manifest from
before part CRC32Cs were kept makes the reader verify the whole file (and
refuse the same damage), a manifest whose part CRC32Cs contradict its file
CRC32C is refused, and the tier order is a list a peer tier can join.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.s3servers import S3Server

from ckptdrain import keys
from ckptdrain.dcp.sources import GlobalSource, Provided, Want
from ckptdrain.dcp.verified import VerifiedFiles
from ckptdrain.errors import IntegrityError
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import load_checkpoint
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

STEP = 9


@pytest.fixture
def committed(s3server: S3Server, tmp_path: Path) -> Iterator[tuple[Store, bytes, int]]:
    """A step whose `big.bin` (2.5 parts) and `small.bin` are drained into a fresh prefix."""
    bucket, prefix = s3server.create_bucket(), f"t-{uuid.uuid4().hex[:12]}"
    store = s3server.open_store(bucket, prefix)
    part = store.min_part_size
    source = tmp_path / "src"
    source.mkdir()
    big = os.urandom(part * 5 // 2)
    (source / "big.bin").write_bytes(big)
    (source / "small.bin").write_bytes(b"small")
    manifest = build_manifest(source, STEP, 0, 1, created=time.time())
    Drainer(store, part_size=part).drain(source, manifest, journal_path=tmp_path / "journal",
                                         cancel=threading.Event())
    yield store, big, part
    s3server.delete_prefix(bucket, prefix + "/")


def _files(store: Store, root: Path, **options: object) -> VerifiedFiles:
    root.mkdir(parents=True, exist_ok=True)
    return VerifiedFiles(store, load_checkpoint(store, STEP), root, **options)  # type: ignore[arg-type]


def _data_key(store: Store, path: str) -> str:
    m = load_checkpoint(store, STEP).manifests[0]
    return keys.data_key(STEP, 0, path, m.attempt)


def _flip(store: Store, key: str, offset: int) -> None:
    data = bytearray(store.get_bytes(key))
    data[offset] ^= 0x01
    store.put_bytes(key, bytes(data))


def _rewrite_manifest(store: Store, change: object) -> None:
    key = keys.manifest_key(STEP, 0)
    doc = json.loads(store.get_bytes(key))
    big = next(f for f in doc["files"] if f["path"] == "big.bin")
    change(big)  # type: ignore[operator]
    store.put_bytes(key, json.dumps(doc).encode())


def _read(root: Path, offset: int, length: int) -> bytes:
    with open(root / "big.bin", "rb") as f:
        f.seek(offset)
        return f.read(length)


def test_the_drain_commits_part_crcs_and_a_range_fetches_only_its_part(
        committed: tuple[Store, bytes, int], tmp_path: Path) -> None:
    store, big, part = committed
    entries = {f.path: f for f in load_checkpoint(store, STEP).manifests[0].files}
    assert entries["big.bin"].part_crc32c is not None
    assert len(entries["big.bin"].part_crc32c) == 3
    assert entries["small.bin"].part_crc32c == (entries["small.bin"].crc32c,)
    files = _files(store, tmp_path / "r")
    files.ensure_ranges({"big.bin": [(part + 10, 100)]})
    assert files.stats.global_bytes == part and files.stats.parts == 1
    assert _read(tmp_path / "r", part + 10, 100) == big[part + 10:part + 110]
    # A range straddling parts 2 and 3 adds part 3 only.
    files.ensure_ranges({"big.bin": [(2 * part - 5, 10)]})
    assert files.stats.global_bytes == part + len(big) - 2 * part
    assert _read(tmp_path / "r", part, len(big) - part) == big[part:]


def test_a_corrupted_range_is_refused_and_the_rest_still_serves(
        committed: tuple[Store, bytes, int], tmp_path: Path) -> None:
    store, big, part = committed
    _flip(store, _data_key(store, "big.bin"), 2 * part + 7)  # in part 3
    files = _files(store, tmp_path / "r")
    files.ensure_ranges({"big.bin": [(10, 100)]})  # part 1: intact
    assert _read(tmp_path / "r", 10, 100) == big[10:110]
    with pytest.raises(IntegrityError, match=r"part 3 .*CRC32C \w+ does not match the "
                                             r"manifest's \w+; refusing its bytes"):
        files.ensure_ranges({"big.bin": [(2 * part, 100)]})
    with pytest.raises(IntegrityError, match="part 3"):  # asked again: refused again
        files.ensure_ranges({"big.bin": [(2 * part, 100)]})


def test_a_manifest_without_part_crcs_verifies_the_whole_file(
        committed: tuple[Store, bytes, int], tmp_path: Path) -> None:
    store, big, part = committed
    _rewrite_manifest(store, lambda f: f.pop("part_crc32c"))
    files = _files(store, tmp_path / "r")
    files.ensure_ranges({"big.bin": [(10, 100)]})
    assert files.stats.global_bytes == len(big)  # the file is the unit
    assert (tmp_path / "r" / "big.bin").read_bytes() == big
    _flip(store, _data_key(store, "big.bin"), 2 * part + 7)
    with pytest.raises(IntegrityError, match=r"CRC32C \w+ does not match the manifest's"):
        _files(store, tmp_path / "r2").ensure_ranges({"big.bin": [(10, 100)]})
    assert not (tmp_path / "r2" / "big.bin").exists()


def test_part_crcs_that_contradict_the_file_crc_are_refused(
        committed: tuple[Store, bytes, int], tmp_path: Path) -> None:
    store, _, _ = committed

    def swap(f: dict[str, list[str]]) -> None:
        f["part_crc32c"][0], f["part_crc32c"][1] = f["part_crc32c"][1], f["part_crc32c"][0]

    _rewrite_manifest(store, swap)
    with pytest.raises(IntegrityError, match="contradicts itself"):
        _files(store, tmp_path / "r").ensure_ranges({"big.bin": [(10, 100)]})
    with pytest.raises(IntegrityError, match="contradicts itself"):  # the whole file too
        _files(store, tmp_path / "r2").ensure(["big.bin"])


class _Declining:
    """A tier that has nothing (as a peer that lost the step would)."""

    name = "peer"

    def __init__(self) -> None:
        self.asked: list[tuple[str, frozenset[int] | None]] = []

    def provide(self, want: Want) -> Provided | None:
        self.asked.append((want.entry.path, want.parts))
        return None


def test_tiers_are_asked_in_order_and_the_next_serves_what_one_declines(
        committed: tuple[Store, bytes, int], tmp_path: Path) -> None:
    store, _, part = committed
    peer = _Declining()
    files = _files(store, tmp_path / "r", sources=[peer, GlobalSource(store)])
    files.ensure_ranges({"big.bin": [(part, 1)], "small.bin": None})
    assert sorted(peer.asked) == [("big.bin", frozenset({1})), ("small.bin", None)]
    assert files.stats.files == {"big.bin": "global", "small.bin": "global"}
    assert (tmp_path / "r" / "small.bin").read_bytes() == b"small"
