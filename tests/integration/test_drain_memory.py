"""Drain memory does not grow with the largest file, against real stores.

A file too big for S3's 10,000 parts gets larger parts; each worker's buffer
still stays at the configured part size, and a larger part is checksummed
through it and sent streamed from the file. Here S3's part limit is lowered
(to 2) so that a 40 MiB file needs parts of 20 MiB with a 5 MiB part size.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import BinaryIO

import pytest
from tests.support.faults import FaultyStore

from ckptdrain import checksum, keys
from ckptdrain.errors import IntegrityError
from ckptdrain.store.base import Store, UploadedPart
from ckptdrain.transfer import drain as drain_mod
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20
PART = 5 * MiB
SIZE = 40 * MiB + 123


@pytest.fixture
def big_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(drain_mod, "MAX_PARTS", 2)
    src = tmp_path / "src"
    src.mkdir()
    with (src / "huge.bin").open("wb") as f:
        for _ in range(SIZE // MiB):
            f.write(os.urandom(MiB))
        f.write(os.urandom(SIZE % MiB))
    (src / "small.bin").write_bytes(os.urandom(1000))
    return src


def test_a_file_with_grown_parts_drains_in_part_size_buffers(
        store: Store, tmp_path: Path, big_file: Path) -> None:
    counted = FaultyStore(store)
    drainer = Drainer(counted, part_size=PART, concurrency=2)
    assert drainer.part_size_for(SIZE) == 21 * MiB  # grown past the part size
    manifest = build_manifest(big_file, 3, 0, 1, created=time.time())
    # An S3 store builds botocore's client on its first write (its reads need
    # none): built now, that one-time set-up is not among the drain's buffers.
    getattr(store, "_client", None)
    tracemalloc.start()
    try:
        drainer.drain(big_file, manifest, journal_path=tmp_path / "journal")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Two workers' 5 MiB buffers and the stores' 1 MiB blocks; 2 x 21 MiB before.
    assert peak < 2 * PART + 6 * MiB, peak
    assert counted.calls["upload_part_from"] == 2 and counted.calls["upload_part"] == 0
    got = fetch(store, tmp_path / "dest")
    assert got.step == 3
    for name in ("huge.bin", "small.bin"):
        assert checksum.crc32c_file(tmp_path / "dest" / name) == checksum.crc32c_file(
            big_file / name)


class ChangesTheFile(FaultyStore):
    """Flips a byte of the source file just before a streamed part is sent:
    after its CRC32C was computed, as a trainer writing in place would."""

    def __init__(self, inner: Store, source: Path) -> None:
        super().__init__(inner)
        self.source = source

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        with self.source.open("r+b") as f:
            f.seek(stream.tell())
            byte = f.read(1)
            f.seek(stream.tell())
            f.write(bytes([byte[0] ^ 0xFF]))
        return super().upload_part_from(key, upload_id, number, stream, size, crc32c)


def test_a_file_changed_between_checksum_and_send_is_refused(
        store: Store, tmp_path: Path, big_file: Path) -> None:
    changing = ChangesTheFile(store, big_file / "huge.bin")
    manifest = build_manifest(big_file, 4, 0, 1, created=time.time())
    with pytest.raises(IntegrityError):
        Drainer(changing, part_size=PART, concurrency=1, attempts=1).drain(
            big_file, manifest, journal_path=tmp_path / "journal")
    assert store.head(keys.manifest_key(4, 0)) is None
