"""The store contract, against real stores: file://, SeaweedFS and MinIO.

Every test taking `store` runs once per kind: whole objects, listings,
multipart uploads, threads. Checksums the servers verify are in
test_store_checksums.py; refusals (credentials, endpoints, buckets) in
test_store_refusals.py.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.support.faults import FaultyStore
from tests.support.s3servers import S3Server
from tests.support.store_contract import part_size, payload, reopen

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError, ObjectMissing, StoreUnreachable
from ckptdrain.store.base import Store, UploadedPart
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store

pytestmark = pytest.mark.integration
MiB = 1024 * 1024


# Whole objects -----------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 4097, 3 * MiB + 7])
def test_put_get_is_byte_exact(store: Store, size: int) -> None:
    data = payload(size, seed=size)
    store.put_bytes("obj/data.bin", data)
    assert store.get_bytes("obj/data.bin") == data
    info = store.head("obj/data.bin")
    assert info is not None and info.size == size and info.key == "obj/data.bin"


def test_put_overwrites(store: Store) -> None:
    store.put_bytes("k", b"first version")
    store.put_bytes("k", b"second")
    assert store.get_bytes("k") == b"second"


def test_put_stream_takes_exactly_size_bytes_from_where_the_stream_is(store: Store) -> None:
    data = payload(2 * MiB + 3, seed=1)
    stream = io.BytesIO(b"HEADER" + data + b"TRAILER")
    stream.seek(6)
    store.put_stream("s/obj", stream, len(data))
    assert store.get_bytes("s/obj") == data
    assert store.head("s/obj").size == len(data)  # type: ignore[union-attr]


def test_put_stream_of_empty_object(store: Store) -> None:
    store.put_stream("s/empty", io.BytesIO(b""), 0)
    assert store.get_bytes("s/empty") == b""


def test_get_range_reads_the_asked_bytes(store: Store) -> None:
    data = payload(1 * MiB + 11, seed=2)
    store.put_bytes("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 12345, 54321) == data[12345 : 12345 + 54321]
    assert store.get_range("r", len(data) - 5, 100) == data[-5:]  # clipped at the end
    assert store.get_range("r", len(data), 10) == b""  # at the end: nothing left
    assert store.get_range("r", 7, 0) == b""


def test_get_range_into_reads_into_the_callers_buffer(store: Store) -> None:
    data = payload(3 * MiB + 11, seed=3)
    store.put_bytes("ri", data)
    into = store.get_range_into  # type: ignore[attr-defined]
    buffer = memoryview(bytearray(2 * MiB))
    # Many reads in a row: each leaves its connection reusable.
    for start in range(0, 20 * 4096, 4096):
        assert into("ri", start, buffer[:MiB]) == MiB
        assert buffer[:MiB] == data[start : start + MiB]
    assert into("ri", len(data) - 5, buffer[:100]) == 5  # clipped at the end
    assert buffer[:5] == data[-5:]
    assert into("ri", len(data), buffer[:10]) == 0  # at the end: nothing left
    assert into("ri", 7, buffer[:0]) == 0
    assert into("ri", 1, buffer) == 2 * MiB and buffer == data[1 : 1 + 2 * MiB]
    with pytest.raises(ObjectMissing):
        into("no/such/key", 0, buffer[:10])
    with pytest.raises(ObjectMissing):
        into("no/such/key", 0, buffer[:0])


def test_missing_objects(store: Store) -> None:
    assert store.head("no/such/key") is None
    with pytest.raises(ObjectMissing) as excinfo:
        store.get_bytes("no/such/key")
    assert "no/such/key" in str(excinfo.value)
    with pytest.raises(ObjectMissing):
        store.get_range("no/such/key", 0, 10)
    with pytest.raises(ObjectMissing):
        store.get_range("no/such/key", 0, 0)


def test_delete_is_idempotent(store: Store) -> None:
    store.put_bytes("d/x", b"1")
    store.delete("d/x")
    assert store.head("d/x") is None
    store.delete("d/x")
    store.delete("never/existed")
    assert list(store.list("")) == []


# Listing ---------------------------------------------------------------------------
def test_list_by_prefix_is_sorted_and_exact(store: Store) -> None:
    keys = [
        "ckpt/000010/rank1",
        "ckpt/000010/rank0",
        "ckpt/000009/rank0",
        "ckpt/0000100/manifest",
        "ckptx",
        "other/a",
    ]
    for i, key in enumerate(keys):
        store.put_bytes(key, b"x" * i)
    everything = list(store.list(""))
    assert [o.key for o in everything] == sorted(keys)
    assert {o.key: o.size for o in everything} == {k: i for i, k in enumerate(keys)}
    assert [o.key for o in store.list("ckpt/")] == [
        "ckpt/000009/rank0",
        "ckpt/000010/rank0",
        "ckpt/000010/rank1",
        "ckpt/0000100/manifest",
    ]
    # A prefix that stops inside a path component matches like a string.
    assert [o.key for o in store.list("ckpt/00001")] == [
        "ckpt/000010/rank0",
        "ckpt/000010/rank1",
        "ckpt/0000100/manifest",
    ]
    assert [o.key for o in store.list("ckp")][-1] == "ckptx"
    assert list(store.list("nothing/")) == []


def test_list_hides_unfinished_uploads_and_temp_files(store: Store) -> None:
    upload = store.create_multipart("big/obj")
    store.upload_part("big/obj", upload, 1, b"x" * 10)
    store.put_bytes("big/visible", b"v")
    assert [o.key for o in store.list("")] == ["big/visible"]
    store.abort_multipart("big/obj", upload)


def test_list_paginates(s3server: S3Server, s3area: tuple[str, str]) -> None:
    store = s3server.open_store(*s3area, list_page_size=7)
    keys = [f"k/{i:03d}" for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put_bytes(k, b""), keys))
    assert [o.key for o in store.list("k/")] == keys


def test_list_more_than_1000_keys(seaweedfs: S3Server, tmp_path: Path) -> None:
    """Past S3's 1000-key page, on a real server and on file://."""
    bucket = seaweedfs.create_bucket()
    try:
        stores: list[Store] = [seaweedfs.open_store(bucket), LocalStore(tmp_path / "many")]
        keys = [f"many/{i:05d}" for i in range(1234)]
        for store in stores:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda k, s=store: s.put_bytes(k, b"."), keys))
            assert [o.key for o in store.list("many/")] == keys
    finally:
        seaweedfs.delete_bucket(bucket)


# Multipart -------------------------------------------------------------------------
def test_multipart_assembles_parts_in_order(store: Store, tmp_path: Path) -> None:
    size = part_size(store)
    chunks = [payload(size, 11), payload(size, 12), payload(1234, 13)]
    upload = store.create_multipart("mp/obj")
    uploaded = {n: store.upload_part("mp/obj", upload, n, chunks[n - 1]) for n in (3, 1, 2)}
    listed = store.list_parts("mp/obj", upload)
    assert listed == [uploaded[1], uploaded[2], uploaded[3]]
    assert all(p.crc32c == checksum.crc32c(chunks[p.number - 1]) for p in uploaded.values())
    assert store.head("mp/obj") is None  # nothing visible before completion
    # Completed from a fresh store object, as a resumed drain would: the
    # etags the store lists, the CRC32Cs from the journal (SeaweedFS does not
    # list them).
    journal = {n: checksum.crc32c(chunks[n - 1]) for n in (1, 2, 3)}
    assert listed is not None
    parts = [UploadedPart(p.number, p.etag, journal[p.number]) for p in listed]
    reopen(store, tmp_path).complete_multipart("mp/obj", upload, parts)
    assert store.get_bytes("mp/obj") == b"".join(chunks)
    assert store.list_parts("mp/obj", upload) is None


def test_multipart_part_sent_twice_keeps_the_last(store: Store) -> None:
    size = part_size(store)
    upload = store.create_multipart("mp/twice")
    first = store.upload_part("mp/twice", upload, 1, payload(size, 1))
    second = store.upload_part("mp/twice", upload, 1, payload(size, 2))
    last = store.upload_part("mp/twice", upload, 2, b"end")
    listed = store.list_parts("mp/twice", upload)
    assert listed is not None and [p.number for p in listed] == [1, 2]
    # SeaweedFS keeps both versions of part 1 (S3 and file:// keep the last),
    # and lists them in no defined order within a second: either is whole.
    assert listed[0] in (first, second) and listed[1] == last
    store.complete_multipart("mp/twice", upload, [second, last])
    assert store.get_bytes("mp/twice") == payload(size, 2) + b"end"


def test_abort_drops_the_upload(store: Store) -> None:
    upload = store.create_multipart("mp/aborted")
    store.upload_part("mp/aborted", upload, 1, b"data")
    store.abort_multipart("mp/aborted", upload)
    assert store.list_parts("mp/aborted", upload) is None
    assert store.head("mp/aborted") is None
    store.abort_multipart("mp/aborted", upload)  # again: fine
    with pytest.raises(ObjectMissing):
        store.upload_part("mp/aborted", upload, 2, b"late")


def test_complete_refuses_a_part_it_does_not_hold(store: Store) -> None:
    size = part_size(store)
    upload = store.create_multipart("mp/bad")
    good = store.upload_part("mp/bad", upload, 1, payload(size))
    store.upload_part("mp/bad", upload, 2, b"tail")
    forged = UploadedPart(2, '"' + "0" * 32 + '"', checksum.crc32c(b"tail"))
    with pytest.raises(IntegrityError):
        store.complete_multipart("mp/bad", upload, [good, forged])
    # A part without its CRC32C cannot complete an S3 upload; refused alike.
    tail = UploadedPart(2, store.list_parts("mp/bad", upload)[1].etag)  # type: ignore[index]
    if isinstance(store, S3Store):
        with pytest.raises(IntegrityError, match="CRC32C"):
            store.complete_multipart("mp/bad", upload, [good, tail])
    store.abort_multipart("mp/bad", upload)


def test_list_parts_of_unknown_upload_is_none(store: Store) -> None:
    assert store.list_parts("mp/none", "0123456789abcdef0123456789abcdef") is None


def test_concurrent_use_from_threads(store: Store) -> None:
    def work(i: int) -> bytes:
        key = f"t/{i % 5}/{i}"
        store.put_bytes(key, payload(1000 + i, i))
        assert store.get_range(key, 10, 20) == payload(1000 + i, i)[10:30]
        return store.get_bytes(key)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(64)))
    assert results == [payload(1000 + i, i) for i in range(64)]
    assert len(list(store.list("t/"))) == 64


def test_fault_wrapper_counts_and_fails_on_a_real_store(store: Store) -> None:
    faulty = FaultyStore(store)
    assert isinstance(store, Store) and isinstance(faulty, Store)
    faulty.fail("upload_part", on_call=2)
    upload = faulty.create_multipart("f/obj")
    faulty.upload_part("f/obj", upload, 1, b"a")
    with pytest.raises(StoreUnreachable):
        faulty.upload_part("f/obj", upload, 2, b"b")
    assert faulty.list_parts("f/obj", upload) == [store.list_parts("f/obj", upload)[0]]  # type: ignore[index]
    faulty.upload_part("f/obj", upload, 2, b"b")
    assert faulty.calls["upload_part"] == 3
    faulty.abort_multipart("f/obj", upload)
    faulty.put_bytes("f/c", b"abc")
    faulty.corrupt("f/c")
    assert faulty.get_range("f/c", 0, 3) != b"abc" and store.get_bytes("f/c") == b"abc"
