"""The store contract, against real stores: file://, SeaweedFS and MinIO.

Every test taking `store` runs once per kind; S3-only behaviour (checksums
the server verifies, credentials, endpoints) takes `s3server` and `s3area` (bucket, prefix).
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from tests.support.faults import FaultyStore
from tests.support.s3servers import S3Server, free_port

from ckptdrain import checksum
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    StoreAccessDenied,
    StoreUnreachable,
)
from ckptdrain.store import open_store
from ckptdrain.store.base import Store, UploadedPart
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store

pytestmark = pytest.mark.integration
MiB = 1024 * 1024


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def part_size(store: Store) -> int:
    """The smallest part the store takes, but at least 64 KiB of real data."""
    return max(store.min_part_size, 64 * 1024)


def reopen(store: Store, tmp_path: Path) -> Store:
    """A second, independent store object on the same data (a 'new process')."""
    if isinstance(store, LocalStore):
        return LocalStore(store.root)
    if isinstance(store, GcsStore):
        return GcsStore(store.bucket, store.prefix, endpoint_url=store._base, environ={})
    assert isinstance(store, S3Store)
    client = store._client
    creds = client._request_signer._credentials
    return S3Store(
        store.bucket,
        store.prefix,
        endpoint_url=client.meta.endpoint_url,
        region=client.meta.region_name,
        access_key=creds.access_key,
        secret_key=creds.secret_key,
    )


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


# S3 only: integrity, errors ---------------------------------------------------------
def _capture_headers(store: S3Store, operation: str) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []

    def hook(request: Any, **_: Any) -> None:
        seen.append(dict(request.headers))

    store._client.meta.events.register(f"before-send.s3.{operation}", hook)
    return seen


def test_parts_carry_a_crc32c_the_server_checks(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)
    data = payload(store.min_part_size, 5)
    crc = checksum.crc32c(data)
    sent = _capture_headers(store, "UploadPart")
    upload = store.create_multipart("ck/obj")
    part = store.upload_part("ck/obj", upload, 1, data, crc32c=crc)
    expected = base64.b64encode(crc.to_bytes(4, "big")).decode()
    assert sent and sent[-1]["x-amz-checksum-crc32c"] == expected.encode()
    assert "Content-MD5" not in sent[-1]  # the CPU that CRC32C saves
    assert part.crc32c == crc
    # The server verifies it: a wrong CRC32C is refused, through our mapping...
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.upload_part("ck/obj", upload, 2, data, crc32c=crc ^ 1)
    # ...and directly, so the refusal is the server's and not ours.
    with pytest.raises(ClientError) as excinfo:
        s3server.client().upload_part(
            Bucket=bucket, Key=f"{prefix}/ck/obj", UploadId=upload, PartNumber=3, Body=data,
            ChecksumCRC32C=base64.b64encode((crc ^ 1).to_bytes(4, "big")).decode(),
        )
    assert excinfo.value.response["Error"]["Code"] in (
        "BadDigest", "XAmzContentChecksumMismatch", "InvalidChecksum")
    # Without a CRC32C from the caller, the store computes it (never MD5).
    tail = store.upload_part("ck/obj", upload, 2, b"tail")
    assert tail.crc32c == checksum.crc32c(b"tail")
    # Completed with the parts' CRC32Cs.
    store.complete_multipart("ck/obj", upload, [part, tail])
    assert store.get_bytes("ck/obj") == data + b"tail"


def test_whole_objects_carry_a_crc32c_the_server_checks(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)
    sent = _capture_headers(store, "PutObject")
    # Computed by the store when the caller has none...
    store.put_bytes("ck/small", b"abc")
    expected = base64.b64encode(checksum.crc32c(b"abc").to_bytes(4, "big")).decode()
    assert sent and sent[-1]["x-amz-checksum-crc32c"] == expected.encode()
    assert "Content-MD5" not in sent[-1]  # MD5 costs ~1.7 core-s per GB it covers
    # ...the caller's when it has one (the drain's, taken as it read the file).
    data = payload(256 * 1024, 7)
    store.put_bytes("ck/data", data, checksum.crc32c(data))
    assert store.get_bytes("ck/data") == data
    # The server verifies it: a wrong CRC32C is refused and nothing is stored...
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.put_bytes("ck/other", data, checksum.crc32c(data) ^ 1)
    assert store.head("ck/other") is None
    # ...and the refusal is the server's, not ours.
    wrong = base64.b64encode((checksum.crc32c(b"abc") ^ 1).to_bytes(4, "big")).decode()
    with pytest.raises(ClientError) as excinfo:
        s3server.client().put_object(Bucket=bucket, Key=f"{prefix}/ck/other", Body=b"abc",
                                     ChecksumCRC32C=wrong)
    assert excinfo.value.response["Error"]["Code"] in (
        "BadDigest", "XAmzContentChecksumMismatch", "InvalidChecksum")


def _server_ignores_crc32c_puts(store: S3Store) -> None:
    """Make the server see PutObject without its checksum headers (removed
    before signing: as if never sent), as a server that ignores them would."""
    def drop(request: Any, **_: Any) -> None:
        for name in ("x-amz-checksum-crc32c", "x-amz-sdk-checksum-algorithm",
                     "x-amz-checksum-algorithm"):
            if name in request.headers:
                del request.headers[name]

    store._client.meta.events.register("before-sign.s3.PutObject", drop)


def test_a_server_that_ignores_the_crc32c_header_gets_content_md5(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    """A server that stores whatever x-amz-checksum-crc32c says is found out
    by the probe, and whole objects go with Content-MD5, which it checks."""
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)

    _server_ignores_crc32c_puts(store)
    sent = _capture_headers(store, "PutObject")
    store.put_bytes("ck/small", b"abc")
    assert store._checks_crc32c is False
    expected = base64.b64encode(hashlib.md5(b"abc").digest()).decode()
    assert sent[-1]["Content-MD5"] == expected.encode()
    # The probe's object, stored by such a server, is gone again.
    listed = s3server.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    assert [o["Key"] for o in listed.get("Contents", [])] == [f"{prefix}/ck/small"]
    # And Content-MD5 is checked: a wrong one is refused.
    wrong = {"ContentMD5": base64.b64encode(hashlib.md5(b"other").digest()).decode()}
    store._integrity_args = lambda _data, _crc: wrong  # type: ignore[method-assign]
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.put_bytes("ck/other", b"abc")
    assert store.head("ck/other") is None


def test_multipart_uploads_to_a_server_that_ignores_crc32c_carry_content_md5(
    s3server: S3Server, s3area: tuple[str, str], tmp_path: Path
) -> None:
    """Parts are most of the bytes: on a server shown not to check CRC32C, an
    upload is created without a checksum algorithm and each part carries a
    Content-MD5 the server does check; completed, the object is whole."""
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)

    _server_ignores_crc32c_puts(store)
    created = _capture_headers(store, "CreateMultipartUpload")
    parts = _capture_headers(store, "UploadPart")
    data = payload(store.min_part_size + 1000, 9)
    upload = store.create_multipart("ck/big")
    assert store._checks_crc32c is False  # the probe ran first
    assert "x-amz-checksum-algorithm" not in created[-1]
    first = store.upload_part("ck/big", upload, 1, data[:store.min_part_size])
    src = tmp_path / "tail"
    src.write_bytes(data[store.min_part_size:])
    with src.open("rb") as stream:
        second = store.upload_part_from("ck/big", upload, 2, stream, 1000,
                                        checksum.crc32c(data[store.min_part_size:]))
    for sent, body in zip(parts, (data[:store.min_part_size], data[store.min_part_size:]),
                          strict=True):
        assert sent["Content-MD5"] == base64.b64encode(hashlib.md5(body).digest())
        assert "x-amz-checksum-crc32c" not in sent
    store.complete_multipart("ck/big", upload, [first, second])
    assert store.get_bytes("ck/big") == data
    # The server checks that Content-MD5: a part that does not match is refused.
    other = store.create_multipart("ck/other")
    def wrong_md5(request: Any, **_: Any) -> None:
        del request.headers["Content-MD5"]
        request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(b"x").digest()).decode()

    store._client.meta.events.register("before-sign.s3.UploadPart", wrong_md5)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.upload_part("ck/other", other, 1, data[:store.min_part_size])
    store.abort_multipart("ck/other", other)


def test_s3_listings_leave_out_names_no_key_can_take(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    """A probe object a server kept (its delete failed) is never listed as data."""
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)
    store.put_bytes("ck/a", b"abc")
    s3server.client().put_object(Bucket=bucket, Key=f"{prefix}/.ckptdrain-probe/x", Body=b"p")
    s3server.client().put_object(Bucket=bucket, Key=f"{prefix}/ck/.ckptdrain-tmp", Body=b"p")
    assert [o.key for o in store.list("")] == ["ck/a"]


def test_the_probe_finds_that_real_servers_check_crc32c_and_leaves_nothing(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix)
    sent = _capture_headers(store, "PutObject")
    store.put_bytes("ck/a", b"abc")
    store.put_bytes("ck/b", b"abc")
    assert store._checks_crc32c is True
    assert len(sent) == 3  # one probe, then the two objects: asked once per store
    listed = s3server.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == [
        f"{prefix}/ck/a", f"{prefix}/ck/b"]


def test_every_store_refuses_a_whole_object_whose_crc32c_is_wrong(store: Store) -> None:
    data = payload(64 * 1024, 8)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.put_bytes("ck/wrong", data, checksum.crc32c(data) ^ 1)
    assert store.head("ck/wrong") is None
    store.put_bytes("ck/right", data, checksum.crc32c(data))
    assert store.get_bytes("ck/right") == data


def test_file_store_refuses_a_wrong_crc32c(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = payload(64 * 1024, 6)
    upload = store.create_multipart("ck/obj")
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        store.upload_part("ck/obj", upload, 1, data, crc32c=checksum.crc32c(data) ^ 1)
    assert store.list_parts("ck/obj", upload) == []
    part = store.upload_part("ck/obj", upload, 1, data, crc32c=checksum.crc32c(data))
    assert part.crc32c == checksum.crc32c(data)
    store.complete_multipart("ck/obj", upload, [part])
    assert store.get_bytes("ck/obj") == data


def test_put_stream_to_s3_refuses_a_stream_it_cannot_rewind(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    class Pipe(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def seekable(self) -> bool:
            return False

    store = s3server.open_store(*s3area)
    with pytest.raises(InvalidInput, match="seekable"):
        store.put_stream("pipe", Pipe(), 10)


def test_missing_bucket_is_named(s3server: S3Server) -> None:
    store = s3server.open_store("no-such-bucket-ckptdrain")
    for call in (
        lambda: store.put_bytes("k", b"x"),
        lambda: store.get_bytes("k"),
        lambda: list(store.list("")),
    ):
        with pytest.raises(BucketMissing, match="no-such-bucket-ckptdrain"):
            call()


def test_wrong_credentials_never_show_the_secret(
    s3server: S3Server, s3area: tuple[str, str]
) -> None:
    bucket = s3area[0]
    secret = "Sup3rS3cretValue-" + s3server.secret_key[:8]
    store = S3Store(
        bucket,
        endpoint_url=s3server.endpoint_url,
        region=s3server.region,
        access_key=s3server.access_key,
        secret_key=secret,
        max_attempts=1,
    )
    for call in (lambda: store.put_bytes("k", b"x"), lambda: store.head("k")):
        with pytest.raises(StoreAccessDenied) as excinfo:
            call()
        text = f"{excinfo.value} {excinfo.value!r} {store!r}"
        assert "credentials" in str(excinfo.value)
        assert secret not in text and s3server.access_key not in text

    unknown = S3Store(
        bucket,
        endpoint_url=s3server.endpoint_url,
        region=s3server.region,
        access_key="AKIDUNKNOWN0000000",
        secret_key=secret,
    )
    with pytest.raises(StoreAccessDenied) as excinfo:
        list(unknown.list(""))
    assert secret not in str(excinfo.value) and "AKIDUNKNOWN" not in str(excinfo.value)


def test_unreachable_endpoint_fails_fast_and_names_it() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = S3Store(
        "some-bucket",
        endpoint_url=endpoint,
        region="us-east-1",
        access_key="x",
        secret_key="y",
        connect_timeout=1,
        read_timeout=2,
        max_attempts=1,
    )
    started = time.monotonic()
    with pytest.raises(StoreUnreachable, match=endpoint.replace(".", r"\.")):
        store.put_bytes("k", b"x")
    assert time.monotonic() - started < 5


def test_open_store_takes_the_endpoint_from_the_environment(
    s3server: S3Server, s3area: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, prefix = s3area
    monkeypatch.setenv("CKPTDRAIN_S3_ENDPOINT", s3server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3server.secret_key)
    store = open_store(f"s3://{bucket}/{prefix}/env", region=s3server.region)
    store.put_bytes("a", b"through the standard credential chain")
    raw = s3server.client().get_object(Bucket=bucket, Key=f"{prefix}/env/a")["Body"].read()
    assert raw == b"through the standard credential chain"
