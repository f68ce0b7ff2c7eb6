"""The CRC32C every upload carries, against real stores: the servers check it
(S3 ones refuse a wrong one themselves), a server that ignores it is found
out by a probe and gets Content-MD5 instead, and no probe object is left or
listed. Every test taking `store` runs once per kind; S3-only ones take
`s3server` and `s3area` (bucket, prefix).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from tests.support.s3servers import S3Server
from tests.support.store_contract import payload

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError
from ckptdrain.store.base import Store
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store

pytestmark = pytest.mark.integration


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
