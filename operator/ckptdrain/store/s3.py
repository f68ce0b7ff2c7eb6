"""The s3:// store: AWS S3 or any S3-compatible server, through boto3.

Deliberately the *classic* client (plain put_object/upload_part calls): the
CRT transfer client ignores custom endpoints and bandwidth limits. One client
is shared by all threads (botocore clients are thread-safe; sessions are not,
so the session is used only here, in the constructor).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from ckptdrain import checksum
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    StoreAccessDenied,
    StoreError,
    StoreUnreachable,
)
from ckptdrain.paths import check_key
from ckptdrain.store.base import MultipartUpload, ObjectInfo, UploadedPart
from ckptdrain.store.endpoint import parse_endpoint
from ckptdrain.store.s3_bodies import PacedBody, WindowBody

S3_MIN_PART_SIZE = 5 * 1024 * 1024
_ACCESS_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
}
_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "InvalidChecksum"}
_MISSING_KEY_CODES = {"NoSuchKey", "NotFound", "404"}


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _b64_crc32c(crc: int) -> str:
    """S3's form of a CRC32C: base64 of its 4 big-endian bytes."""
    return _b64(crc.to_bytes(4, "big"))


def _crc32c_from_b64(text: str | None) -> int | None:
    if not text:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def _redact_endpoint(url: str) -> str:
    return re.sub(r"://[^/@]*@", "://***@", url)


def _newer_or_same(item: dict[str, Any], other: dict[str, Any] | None) -> bool:
    """Whether a listed part supersedes `other` (a later entry wins ties)."""
    if other is None or not other.get("LastModified") or not item.get("LastModified"):
        return True
    return bool(item["LastModified"] >= other["LastModified"])


class S3Store:
    """A Store over one bucket and key prefix of an S3-compatible endpoint.

    Credentials: `access_key`/`secret_key` if given (tests), else the standard
    AWS chain (env vars, shared profile, web identity / IRSA, instance
    metadata). Neither is ever put in a message, a log or repr().

    Integrity: every body we hold in memory goes with a checksum the server
    verifies before storing (BadDigest / XAmzContentChecksumMismatch ->
    IntegrityError). Multipart parts carry x-amz-checksum-crc32c, the CRC32C
    the drain computes anyway (awscrt, ~0.13 core-s/GB; Content-MD5 cost
    ~1.7). Such a checksum binds the whole upload: the algorithm is named at
    CreateMultipartUpload and every part's CRC32C repeated at
    CompleteMultipartUpload (SeaweedFS answers InvalidRequest, MinIO
    InvalidPart, without them), so UploadedPart carries it and the drain
    journals it: SeaweedFS's ListParts does not return part checksums, and
    a resumed drain completes from its journal's CRCs. put_bytes (small
    objects: manifests, single-part files) still sends Content-MD5, which is
    per request and stateless. tests/integration/test_store_contract.py
    sends wrong checksums of both kinds to SeaweedFS and MinIO.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        max_pool_connections: int = 32,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
        list_page_size: int = 1000,
    ) -> None:
        if endpoint_url is not None:  # before botocore, which would quote it whole
            endpoint_url = parse_endpoint("endpoint_url", endpoint_url)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.endpoint = _redact_endpoint(endpoint_url) if endpoint_url else "AWS S3"
        self._page_size = list_page_size
        config = Config(
            region_name=region,
            signature_version="s3v4",
            # Custom endpoints (MinIO, SeaweedFS, Ceph) rarely have wildcard
            # DNS for virtual-hosted buckets; AWS itself picks what it needs.
            # Bodies carry Content-MD5 (a signed header the server verifies),
            # so SHA-256 payload signing, which botocore otherwise does over
            # plain HTTP, adds ~1 core-s/GB and no integrity.
            s3={"addressing_style": "path" if endpoint_url else "auto",
                "payload_signing_enabled": False},
            # "standard" retries throttling and 5xx with backoff; short
            # attempt counts keep a dead endpoint from stalling a drain.
            retries={"mode": "standard", "max_attempts": max_attempts},
            # One connection per concurrent request, or urllib3 discards
            # (and re-opens) connections under load.
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            tcp_keepalive=True,
            # botocore >= 1.36 would CRC32 every request and response body:
            # CPU we do not need, since our manifests carry CRC32C.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        session = boto3.session.Session(
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            aws_session_token=session_token,
            region_name=region,
        )
        try:
            self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        except (ValueError, BotoCoreError) as err:
            # botocore quotes the whole endpoint (credentials included) in its
            # message: say which setting is wrong, never what it holds.
            raise InvalidInput("endpoint_url", "an S3 endpoint botocore accepts "
                               f"({type(err).__name__})", self.endpoint) from None
        self._pace: Callable[[int], object] | None = None

    def set_pacer(self, pace: Callable[[int], object] | None) -> None:
        """Call `pace(n)` before each block of n bytes of put_bytes/upload_part
        bodies goes to the socket (a rate limiter's acquire); None: no pacing."""
        self._pace = pace

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint={self.endpoint!r})"

    @property
    def min_part_size(self) -> int:
        return S3_MIN_PART_SIZE

    # Helpers -----------------------------------------------------------------
    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, err: Exception, op: str, key: str | None = None) -> NoReturn:
        """Raise the errors.py exception for a botocore error. Never echoes secrets."""
        where = f"s3://{self.bucket}/{self._key(key) if key else self.prefix}".rstrip("/")
        if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
            raise StoreAccessDenied(
                f"{op} {where}: no usable S3 credentials found; check the credentials "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile, or workload identity)"
            ) from None
        if isinstance(err, (ConnectionError, HTTPClientError)):
            raise StoreUnreachable(
                f"{op} {where}: endpoint {self.endpoint} did not answer "
                f"({type(err).__name__}); is it up and reachable?"
            ) from err
        if isinstance(err, ClientError):
            error = err.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code == "NoSuchBucket":
                raise BucketMissing(
                    f"{op} {where}: bucket {self.bucket!r} does not exist at {self.endpoint}"
                ) from err
            if code in _ACCESS_CODES or status == 403:
                # Server messages for auth failures can quote the access key
                # id; say only the code.
                raise StoreAccessDenied(
                    f"{op} {where}: access denied by {self.endpoint} ({code or status}); "
                    "check the credentials and that they may use this bucket"
                ) from None
            if code in _MISSING_KEY_CODES or status == 404:
                raise ObjectMissing(key or where) from err
            if code in _DIGEST_CODES:
                raise IntegrityError(
                    f"{op} {where}: the store refused the bytes: checksum mismatch ({code})"
                ) from err
            if code in ("InvalidPart", "InvalidPartOrder", "EntityTooSmall"):
                raise IntegrityError(f"{op} {where}: {code}: {error.get('Message', '')}") from err
            if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout"):
                raise StoreUnreachable(
                    f"{op} {where}: endpoint {self.endpoint} is unavailable "
                    f"(HTTP {status} {code}) after retries"
                ) from err
            raise StoreError(f"{op} {where}: {code or status}: {error.get('Message', '')}") from err
        raise StoreError(f"{op} {where}: {type(err).__name__}") from err

    def _call(self, op: str, key: str | None, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as err:
            self._fail(err, op, key)

    @staticmethod
    def _integrity_args(data: bytes | bytearray | memoryview) -> dict[str, str]:
        """Content-MD5 for a whole-object body (parts carry CRC32C instead)."""
        return {"ContentMD5": _b64(hashlib.md5(data, usedforsecurity=False).digest())}

    # Whole objects -----------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Key=self._key(key), Body=PacedBody(data, self._pace),
                   ContentLength=len(data), **self._integrity_args(data))

    def put_stream(self, key: str, stream: BinaryIO, size: int) -> None:
        """Send exactly `size` bytes of `stream`, from where it stands.

        The stream must be seekable: botocore rewinds it to sign the payload
        (plain HTTP) and to retry. Pipes go through multipart instead.
        """
        if size < 0:
            raise InvalidInput("size", "a size >= 0", size)
        if not stream.seekable():
            raise InvalidInput("stream", "a seekable stream (use multipart for pipes)", stream)
        body = WindowBody(stream, size)
        self._call("put_object", key, Key=self._key(key), Body=body, ContentLength=size)

    def get_bytes(self, key: str) -> bytes:
        response = self._call("get_object", key, Key=self._key(key))
        return self._read_body(response, "get_object", key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from `start`; fewer only where the object ends."""
        if start < 0 or length < 0:
            raise InvalidInput("range", "start >= 0 and length >= 0", (start, length))
        if length == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return b""
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # start at or past the end (416); the key exists
            self._fail(err, "get_object", key)
        except BotoCoreError as err:
            self._fail(err, "get_object", key)
        return self._read_body(response, "get_object", key)

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        """Read up to len(buffer) bytes from `start` into `buffer`; return how
        many (fewer only where the object ends). ObjectMissing as get_range.

        The body goes from the socket straight into the caller's buffer
        (http.client's readinto under urllib3): get_range's body.read() makes
        the bytes twice more (http.client's read(amt) copies its bytearray,
        urllib3 joins its chunks) before the caller writes them out."""
        view = memoryview(buffer).cast("B")
        length = len(view)
        if start < 0:
            raise InvalidInput("range", "start >= 0", start)
        if length == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return 0
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{start + length - 1}"
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "InvalidRange":
                return 0  # start at or past the end (416); the key exists
            self._fail(err, "get_object", key)
        except BotoCoreError as err:
            self._fail(err, "get_object", key)
        body = response["Body"]
        expected = int(response.get("ContentLength", -1))
        raw = getattr(body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        if (not isinstance(fp, http.client.HTTPResponse) or not 0 <= expected <= length
                or getattr(raw, "chunked", False)):
            data = self._read_body(response, "get_object", key)  # any other transport
            if len(data) > length:
                raise StoreError(f"get_object {key}: {len(data)} bytes for a {length}-byte range")
            view[: len(data)] = data
            return len(data)
        got = 0
        try:
            while got < expected:
                n = fp.readinto(view[got:expected])
                if not n:
                    break
                got += n
        except (OSError, http.client.HTTPException) as err:
            body.close()
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} broke mid-body "
                f"({type(err).__name__})") from err
        if got != expected:
            body.close()
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} closed after {got} "
                f"of {expected} bytes")
        if fp.isclosed():
            raw.release_conn()  # read to its end: the connection is reusable
        body.close()
        return got

    def _read_body(self, response: dict[str, Any], op: str, key: str) -> bytes:
        try:
            with response["Body"] as body:
                return body.read()
        except BotoCoreError as err:  # connection dropped mid-body
            self._fail(err, op, key)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in _MISSING_KEY_CODES:
                # HEAD has no body, so a missing bucket also reads as 404.
                return None
            self._fail(err, "head_object", key)
        except BotoCoreError as err:
            self._fail(err, "head_object", key)
        return ObjectInfo(key=key, size=int(response["ContentLength"]))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects under `prefix` in key order, one page at a time."""
        root = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Prefix": root + prefix, "MaxKeys": self._page_size}
        while True:
            page = self._call("list_objects_v2", None, **kwargs)
            for item in page.get("Contents", []):
                modified = item.get("LastModified")
                yield ObjectInfo(key=item["Key"][len(root) :], size=int(item["Size"]),
                                 modified=modified.timestamp() if modified else None)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Key=self._key(key))

    # Multipart ---------------------------------------------------------------
    def create_multipart(self, key: str) -> str:
        # Every part then carries its CRC32C, verified by the server.
        response = self._call("create_multipart_upload", key, Key=self._key(key),
                              ChecksumAlgorithm="CRC32C")
        return str(response["UploadId"])

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
        try:
            response = self._client.upload_part(
                Bucket=self.bucket,
                Key=self._key(key),
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ContentLength=len(body),
                ChecksumCRC32C=_b64_crc32c(crc32c),
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "NoSuchUpload":
                raise ObjectMissing(key) from err
            self._fail(err, "upload_part", key)
        except BotoCoreError as err:
            self._fail(err, "upload_part", key)
        return UploadedPart(number=number, etag=str(response["ETag"]), crc32c=crc32c)

    def _server_parts(self, key: str, upload_id: str) -> dict[int, dict[str, Any]] | None:
        """Part number -> the server's record of it, or None if the upload is gone."""
        parts: dict[int, dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"Key": self._key(key), "UploadId": upload_id}
        while True:
            try:
                page = self._client.list_parts(Bucket=self.bucket, **kwargs)
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") in ("NoSuchUpload", "NoSuchKey"):
                    return None
                self._fail(err, "list_parts", key)
            except BotoCoreError as err:
                self._fail(err, "list_parts", key)
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
        return [UploadedPart(n, str(item["ETag"]), _crc32c_from_b64(item.get("ChecksumCRC32C")))
                for n, item in sorted(parts.items())]

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Assemble `parts` in order. ObjectMissing if the upload is gone;
        IntegrityError if a part is missing, differs, is too small, or comes
        without the CRC32C it was uploaded with."""
        entries: list[dict[str, Any]] = []
        for p in parts:
            if p.crc32c is None:
                raise IntegrityError(
                    f"complete_multipart_upload {key}: part {p.number} has no CRC32C "
                    "(the store needs each part's checksum to complete the upload)")
            entries.append({"PartNumber": p.number, "ETag": p.etag,
                            "ChecksumCRC32C": _b64_crc32c(p.crc32c)})
        try:
            self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": entries},
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "NoSuchUpload":
                raise ObjectMissing(key) from err
            self._fail(err, "complete_multipart_upload", key)
        except BotoCoreError as err:
            self._fail(err, "complete_multipart_upload", key)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), UploadId=upload_id
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchUpload", "NoSuchKey"):
                return
            self._fail(err, "abort_multipart_upload", key)
        except BotoCoreError as err:
            self._fail(err, "abort_multipart_upload", key)

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
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=self._key(key),
                                                ChecksumMode="ENABLED")
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in _MISSING_KEY_CODES:
                return None
            self._fail(err, "head_object", key)
        except BotoCoreError as err:
            self._fail(err, "head_object", key)
        text, _, parts = str(response.get("ChecksumCRC32C") or "").partition("-")
        crc = _crc32c_from_b64(text)
        if crc is None:
            return None
        return checksum.to_hex(crc) + (f"-{parts}" if parts.isdigit() else "")
