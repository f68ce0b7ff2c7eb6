"""The s3:// store's multipart uploads and the CRC32C checksums that bind them.

An upload is created for CRC32C, every part carries its own, and completion
repeats them all (S3Store's docstring says why). Listing parts and uploads
copes with two servers' ways: SeaweedFS lists a part sent twice twice, MinIO
lists by a prefix only the uploads of the exact key it names. The server's
composite CRC32C of a finished object (`object_crc32c`) is how a resumed drain
recognises an upload it completed but never journaled.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

from botocore.exceptions import ClientError

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError, ObjectMissing
from ckptdrain.store.base import MultipartUpload, UploadedPart
from ckptdrain.store.s3_bodies import PacedBody, WindowBody
from ckptdrain.store.s3_errors import MISSING_KEY_CODES

#: The codes by which a server says an upload is no longer there.
_GONE = ("NoSuchUpload", "NoSuchKey")


def content_md5(data: bytes | bytearray | memoryview) -> str:
    """Content-MD5 of a body: only for servers that do not check CRC32C."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


def _stream_md5(stream: BinaryIO, size: int) -> str:
    """Content-MD5 of the next `size` bytes of `stream`, which is left where it was."""
    start, digest, left = stream.tell(), hashlib.md5(usedforsecurity=False), size
    while left:
        chunk = stream.read(min(left, 8 << 20))
        if not chunk:
            raise IntegrityError(f"the stream ended {left} bytes before its {size}-byte part")
        digest.update(chunk)
        left -= len(chunk)
    stream.seek(start)
    return base64.b64encode(digest.digest()).decode("ascii")


def _newer_or_same(item: dict[str, Any], other: dict[str, Any] | None) -> bool:
    """Whether a listed part supersedes `other` (a later entry wins ties)."""
    if other is None or not other.get("LastModified") or not item.get("LastModified"):
        return True
    return bool(item["LastModified"] >= other["LastModified"])


class S3Multipart:
    """S3Store's multipart operations (the Store protocol's upload half)."""

    bucket: str
    prefix: str
    _client: Any
    _pace: Callable[[int], object] | None
    _create_args: dict[str, Any]

    if TYPE_CHECKING:  # S3Store's own helpers
        def _key(self, key: str) -> str: ...
        def _fail(self, err: Exception, op: str, key: str | None = None) -> NoReturn: ...
        def _call(self, op: str, key: str | None, *, handled: Collection[str] = (),
                  **kwargs: Any) -> Any: ...
        def _crc32c_checked(self) -> bool | None: ...

    #: Uploads this process created for a server shown not to check CRC32C:
    #: their parts carry Content-MD5 (an upload resumed from an earlier
    #: process is completed as it was created there, with CRC32Cs).
    _md5_uploads: set[str]

    def create_multipart(self, key: str) -> str:
        # Every part then carries its CRC32C, verified by the server; where a
        # probe showed the server does not check it, Content-MD5 instead.
        if self._crc32c_checked() is False:
            response = self._call("create_multipart_upload", key, Key=self._key(key),
                                  **self._create_args)
            upload_id = str(response["UploadId"])
            self._md5_uploads.add(upload_id)
            return upload_id
        response = self._call("create_multipart_upload", key, Key=self._key(key),
                              ChecksumAlgorithm="CRC32C", **self._create_args)
        return str(response["UploadId"])

    def _part_checksum(self, upload_id: str, crc32c: int,
                       md5: Callable[[], str]) -> dict[str, str]:
        if upload_id in self._md5_uploads:
            return {"ContentMD5": md5()}
        return {"ChecksumCRC32C": checksum.to_b64(crc32c)}

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, crc32c: int | None = None
    ) -> UploadedPart:
        """Upload one part with its CRC32C, which the server verifies.
        ObjectMissing if the upload is gone; IntegrityError on a mismatch.

        The upload was created for CRC32C, so a part without one would be
        refused (MinIO) or could not be completed (SeaweedFS): when the caller
        has no CRC32C it is computed here, not replaced by Content-MD5."""
        if crc32c is None:
            crc32c = checksum.crc32c(memoryview(data).cast("B"))
        body = PacedBody(data, self._pace)  # no copy of the part; paced as it is sent
        response = self._call("upload_part", key, handled={"NoSuchUpload"}, Key=self._key(key),
                              UploadId=upload_id, PartNumber=number, Body=body,
                              ContentLength=len(body),
                              **self._part_checksum(upload_id, crc32c, lambda: content_md5(data)))
        if isinstance(response, ClientError):
            raise ObjectMissing(key) from response
        return UploadedPart(number=number, etag=str(response["ETag"]), crc32c=crc32c)

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        """upload_part, its body read from `stream` (seekable, from where it
        stands) as it is sent: a part larger than any buffer we hold. The
        server verifies `crc32c` (the caller's, computed beforehand)."""
        sums = self._part_checksum(upload_id, crc32c, lambda: _stream_md5(stream, size))
        body = WindowBody(stream, size, pace=self._pace, strict=True)
        response = self._call("upload_part", key, handled={"NoSuchUpload"}, Key=self._key(key),
                              UploadId=upload_id, PartNumber=number, Body=body,
                              ContentLength=size, **sums)
        if isinstance(response, ClientError):
            raise ObjectMissing(key) from response
        return UploadedPart(number=number, etag=str(response["ETag"]), crc32c=crc32c)

    def _server_parts(self, key: str, upload_id: str) -> dict[int, dict[str, Any]] | None:
        """Part number -> the server's record of it, or None if the upload is gone."""
        parts: dict[int, dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"Key": self._key(key), "UploadId": upload_id}
        while True:
            page = self._call("list_parts", key, handled=_GONE, **kwargs)
            if isinstance(page, ClientError):
                return None
            # SeaweedFS 4.x lists a part sent twice twice (and completes with
            # whichever etag it is given): report one, the newest.
            for item in page.get("Parts", []):
                number = int(item["PartNumber"])
                if _newer_or_same(item, parts.get(number)):
                    parts[number] = item
            marker = page.get("NextPartNumberMarker")
            if not page.get("IsTruncated") or not marker:
                return parts
            kwargs["PartNumberMarker"] = marker

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart] | None:
        parts = self._server_parts(key, upload_id)
        if parts is None:
            return None
        return [UploadedPart(n, str(item["ETag"]), checksum.from_b64(item.get("ChecksumCRC32C")),
                             item["LastModified"].timestamp() if item.get("LastModified") else None)
                for n, item in sorted(parts.items())]

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Assemble `parts` in order. ObjectMissing if the upload is gone;
        IntegrityError if a part is missing, differs, is too small, or comes
        without the CRC32C it was uploaded with."""
        entries: list[dict[str, Any]] = []
        for p in parts:
            if upload_id in self._md5_uploads:  # created without a checksum algorithm
                entries.append({"PartNumber": p.number, "ETag": p.etag})
                continue
            if p.crc32c is None:
                raise IntegrityError(
                    f"complete_multipart_upload {key}: part {p.number} has no CRC32C "
                    "(the store needs each part's checksum to complete the upload)")
            entries.append({"PartNumber": p.number, "ETag": p.etag,
                            "ChecksumCRC32C": checksum.to_b64(p.crc32c)})
        response = self._call("complete_multipart_upload", key, handled={"NoSuchUpload"},
                              Key=self._key(key), UploadId=upload_id,
                              MultipartUpload={"Parts": entries})
        if isinstance(response, ClientError):
            raise ObjectMissing(key) from response

    def abort_multipart(self, key: str, upload_id: str) -> None:
        # An upload already gone is aborted: nothing to do.
        self._call("abort_multipart_upload", key, handled=_GONE, Key=self._key(key),
                   UploadId=upload_id)

    def list_multipart_uploads(self, prefix: str) -> list[MultipartUpload]:
        """Unfinished uploads for keys under `prefix`, every page, in key order.

        MinIO lists by a prefix only the uploads of the exact key it names, but
        lists them all without one: from a server that says it is MinIO, the
        bucket's uploads are listed and filtered here."""
        root = f"{self.prefix}/" if self.prefix else ""
        found, server = self._uploads(root + prefix)
        if not found and server.lower() == "minio":
            found, _ = self._uploads(None)
        chosen = [MultipartUpload(u.key[len(root):], u.upload_id, u.initiated)
                  for u in found if u.key.startswith(root + prefix)]
        return sorted(chosen, key=lambda u: (u.key.encode("utf-8"), u.upload_id))

    def _uploads(self, prefix: str | None) -> tuple[list[MultipartUpload], str]:
        """Every page of ListMultipartUploads (full keys; None: no Prefix at
        all), and the server's name from its Server header."""
        kwargs: dict[str, Any] = {} if prefix is None else {"Prefix": prefix}
        found = []
        while True:
            page = self._call("list_multipart_uploads", None, **kwargs)
            for item in page.get("Uploads", []):
                started = item.get("Initiated")
                found.append(MultipartUpload(str(item["Key"]), str(item["UploadId"]),
                                             started.timestamp() if started else None))
            key_marker, id_marker = page.get("NextKeyMarker"), page.get("NextUploadIdMarker")
            if not page.get("IsTruncated") or not (key_marker or id_marker):
                headers = page.get("ResponseMetadata", {}).get("HTTPHeaders", {})
                return found, str(headers.get("server", ""))
            kwargs.update(KeyMarker=key_marker or "", UploadIdMarker=id_marker or "")

    def object_crc32c(self, key: str) -> str | None:
        """The CRC32C the server keeps for the object (HeadObject, ChecksumMode
        ENABLED): 8 hex digits, or "<8 hex>-<parts>" for a multipart upload's
        composite checksum; None when it keeps none or the object is missing."""
        response = self._call("head_object", key, handled=MISSING_KEY_CODES, Key=self._key(key),
                              ChecksumMode="ENABLED")
        if isinstance(response, ClientError):
            return None
        text, _, parts = str(response.get("ChecksumCRC32C") or "").partition("-")
        crc = checksum.from_b64(text)
        if crc is None:
            return None
        return checksum.to_hex(crc) + (f"-{parts}" if parts.isdigit() else "")
