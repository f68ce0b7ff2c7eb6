"""The store contract, continued: what the commit protocol needs of a store
(unfinished uploads listed and aborted, listings with times, the CRC32C a
store keeps), against real stores: file://, SeaweedFS and MinIO."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from ckptdrain import checksum
from ckptdrain.store.base import Store
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.commit import composite_crc32c
from ckptdrain.transfer.journal import PartRecord

pytestmark = pytest.mark.integration
DAY = 86400.0


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def test_unfinished_uploads_are_listed_by_prefix_until_completed_or_aborted(
        store: Store) -> None:
    size = max(store.min_part_size, 64 * 1024)
    first = store.create_multipart("mpl/a/one")
    second = store.create_multipart("mpl/a/two")
    other = store.create_multipart("mpl/b/three")
    store.upload_part("mpl/a/one", first, 1, payload(size, 1))

    listed = store.list_multipart_uploads("mpl/a/")
    assert [(u.key, u.upload_id) for u in listed] == [("mpl/a/one", first),
                                                      ("mpl/a/two", second)]
    assert all(u.initiated is not None and abs(u.initiated - time.time()) < DAY
               for u in listed)
    assert store.list_multipart_uploads("mpl/c/") == []

    store.abort_multipart("mpl/a/two", second)
    crc = checksum.crc32c(payload(size, 1))
    parts = store.list_parts("mpl/a/one", first)
    assert parts is not None
    store.complete_multipart("mpl/a/one", first,
                             [type(parts[0])(parts[0].number, parts[0].etag, crc)])
    assert store.list_multipart_uploads("mpl/a/") == []
    assert [u.upload_id for u in store.list_multipart_uploads("mpl/")] == [other]
    store.abort_multipart("mpl/b/three", other)
    assert store.list_multipart_uploads("mpl/") == []


def test_listings_say_when_an_object_was_written(store: Store) -> None:
    store.put_bytes("when/x", b"x")
    (info,) = list(store.list("when/"))
    assert info.modified is not None and abs(info.modified - time.time()) < DAY


def test_the_crc32c_a_store_keeps_is_the_objects(store: Store) -> None:
    """Whole objects: their CRC32C or nothing. Multipart: the whole CRC32C, the
    composite one of its parts ("<crc of part crcs>-N", S3), or nothing."""
    crc_of = store.object_crc32c  # type: ignore[attr-defined]
    assert crc_of("crc/missing") is None
    store.put_bytes("crc/small", b"hello")
    assert crc_of("crc/small") in (None, checksum.to_hex(checksum.crc32c(b"hello")))

    size = max(store.min_part_size, 64 * 1024)
    chunks = [payload(size, 3), payload(777, 4)]
    upload = store.create_multipart("crc/big")
    sent = [store.upload_part("crc/big", upload, n, c) for n, c in enumerate(chunks, 1)]
    store.complete_multipart("crc/big", upload, sent)
    records = [PartRecord(p.number, p.etag, checksum.crc32c(c), len(c))
               for p, c in zip(sent, chunks, strict=True)]
    whole = checksum.to_hex(checksum.crc32c(b"".join(chunks)))
    held = crc_of("crc/big")
    assert held in (None, whole, composite_crc32c(records))
    if isinstance(store, LocalStore):
        assert held == whole  # the file store can always compute it


def test_file_store_lists_uploads_of_a_new_process(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    upload = store.create_multipart("data/k")
    assert [u.upload_id for u in LocalStore(tmp_path / "s").list_multipart_uploads("")] == [upload]
