"""The s3:// store: AWS S3 or any S3-compatible server, through botocore.

Deliberately the *classic* client (plain put_object/upload_part calls): the
CRT transfer client ignores custom endpoints and bandwidth limits. One client
is shared by all threads (botocore clients are thread-safe; sessions are not,
so the session is used only where the client is built). Reads may go
without it (s3_read_client.py, when s3_read_settings.py allows).

The adapter keeps its rooms: this one (the client, whole objects, ranged
reads, listing), `s3_multipart.py` (multipart uploads and their CRC32Cs),
`s3_bodies.py` (paced, copy-free request bodies), `s3_errors.py`
(botocore's errors onto errors.py's, secrets left out), and the reads
without botocore (`s3_read_settings.py`, `s3_read_client.py`,
`s3_read_answers.py`, `sigv4.py`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, BinaryIO, NoReturn
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from ckptdrain import __version__, checksum
from ckptdrain.errors import (
    InvalidInput,
    ObjectTooLarge,
)
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store import splice
from ckptdrain.store.base import ObjectInfo
from ckptdrain.store.endpoint import parse_endpoint
from ckptdrain.store.s3_bodies import PacedBody, WindowBody
from ckptdrain.store.s3_checksum_probe import probe_key, server_checks_crc32c
from ckptdrain.store.s3_errors import MISSING_KEY_CODES, raise_store_error, redact_endpoint
from ckptdrain.store.s3_multipart import S3Multipart, content_md5
from ckptdrain.store.s3_options import S3Options
from ckptdrain.store.s3_ranged_reads import S3RangedReads
from ckptdrain.store.s3_read_client import S3ReadClient
from ckptdrain.store.s3_read_settings import config_file, read_settings
from ckptdrain.store.s3_storage_class import S3StorageClass
from ckptdrain.store.s3_throttle import ThrottleGate, gate_for

S3_MIN_PART_SIZE = 5 * 1024 * 1024
_READ_CHUNK = 1 << 20
class S3Store(S3Multipart, S3StorageClass, S3RangedReads):
    """A Store over one bucket and key prefix of an S3-compatible endpoint.

    Credentials: `access_key`/`secret_key` if given (tests), else the standard
    AWS chain (env vars, shared profile, web identity / IRSA, instance
    metadata). Neither is ever put in a message, a log or repr().

    Reads (GetObject, HeadObject, ListObjectsV2) go without botocore's client
    where s3_read_settings.py knows botocore's answer (a custom endpoint,
    static keys, nothing in the environment that would change a request):
    s3_read_client.py sends them, and botocore's client is built on the
    first other request, so a restore never pays for it. `botocore_reads`
    sends every request through botocore (tests hold the two to each other).

    Integrity: every body we hold in memory goes with a checksum the server
    verifies before storing (BadDigest / XAmzContentChecksumMismatch ->
    IntegrityError). Multipart parts carry x-amz-checksum-crc32c, the CRC32C
    the drain computes anyway (awscrt, ~0.13 core-s/GB; Content-MD5 cost
    ~1.7). Such a checksum binds the whole upload: the algorithm is named at
    CreateMultipartUpload and every part's CRC32C repeated at
    CompleteMultipartUpload (SeaweedFS answers InvalidRequest, MinIO
    InvalidPart, without them), so UploadedPart carries it and the drain
    journals it: SeaweedFS's ListParts does not return part checksums, and
    a resumed drain completes from its journal's CRCs. put_bytes (manifests,
    single-part files) sends x-amz-checksum-crc32c as well: the caller's, or
    one computed here (Content-MD5 costs ~1.7 core-s per GB it covers),
    once a probe has shown that the server checks it
    (s3_checksum_probe.py); where it does not, Content-MD5 as before.
    tests/integration/test_store_checksums.py sends wrong checksums to
    SeaweedFS and MinIO.
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
        gate: ThrottleGate | None = None,
        options: S3Options | None = None,
        botocore_reads: bool = False,
    ) -> None:
        if endpoint_url is not None:  # before botocore, which would quote it whole
            endpoint_url = parse_endpoint("endpoint_url", endpoint_url)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.endpoint = redact_endpoint(endpoint_url) if endpoint_url else "AWS S3"
        self.splices = splice.available() and bool(endpoint_url) and \
            urlsplit(str(endpoint_url)).scheme.lower() == "http"
        self._page_size = list_page_size
        self.options = options or S3Options()
        self._create_args = self.options.create_args()
        style = self.options.addressing_style(endpoint_url is not None)
        self._client_args: dict[str, Any] = dict(
            endpoint_url=endpoint_url, region=region, access_key=access_key,
            secret_key=secret_key, session_token=session_token, style=style,
            max_pool_connections=max_pool_connections, connect_timeout=connect_timeout,
            read_timeout=read_timeout)
        self._botocore: Any = None
        self._client_lock = threading.Lock()
        env = os.environ
        settings = read_settings(
            env, bucket=bucket, endpoint_url=endpoint_url, addressing=style, region=region,
            access_key=access_key, secret_key=secret_key, session_token=session_token,
            ca_bundle=self.options.ca_bundle,
            config_file_exists=os.path.exists(config_file(env)))
        #: Reads without botocore where its answer is known without it
        #: (s3_read_settings.py); None: every request is botocore's.
        self._reader = None if settings is None or botocore_reads else S3ReadClient(
            str(endpoint_url), settings, max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout, read_timeout=read_timeout)
        if self._reader is None:
            self._botocore = self._build_client()  # a bad endpoint is refused now
        self._pace: Callable[[int], object] | None = None
        self._checks_crc32c: bool | None = None  # asked once (s3_checksum_probe.py)
        self._probes_left = 3
        self._md5_uploads: set[str] = set()
        self._probe_lock = threading.Lock()
        self.gate = gate if gate is not None else gate_for(self.endpoint)
        self._attempts = max(1, max_attempts)

    @property
    def _client(self) -> Any:
        """botocore's client, built on first use where reads go without it:
        a restore that only reads never pays for it."""
        with self._client_lock:
            if self._botocore is None:
                self._botocore = self._build_client()
            return self._botocore

    @_client.setter
    def _client(self, client: Any) -> None:
        """A client set by hand (a benchmark's) sends every request, reads too."""
        self._botocore, self._reader = client, None

    def _build_client(self) -> Any:
        # Imported here: botocore's client, its model and endpoint rules cost
        # a process ~0.25 s of CPU, which a restore reading without it is spared.
        import botocore.session
        from botocore.config import Config

        a = self._client_args
        config = Config(
            region_name=a["region"],
            signature_version="s3v4",
            # Path-style for custom endpoints unless told (s3_options.py).
            # Bodies carry a checksum the server verifies (CRC32C, or
            # Content-MD5 where CRC32C is not checked: _integrity_args),
            # a signed header, so SHA-256 payload signing, which botocore
            # otherwise does over plain HTTP, adds ~1 core-s/GB and no integrity.
            s3={"addressing_style": a["style"], "payload_signing_enabled": False},
            # No retries in botocore: each request would back off on its
            # own. The gate (s3_throttle.py) retries throttling, 5xx and
            # timeouts with one back-off shared by the whole process.
            retries={"mode": "standard", "total_max_attempts": 1},
            # One connection per concurrent request, or urllib3 discards
            # (and re-opens) connections under load.
            max_pool_connections=a["max_pool_connections"],
            connect_timeout=a["connect_timeout"],
            read_timeout=a["read_timeout"],
            tcp_keepalive=True,
            # botocore >= 1.36 would CRC32 every request and response body:
            # CPU we do not need, since our manifests carry CRC32C.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            user_agent_extra=f"ckptdrain/{__version__}",
        )
        # botocore's own session, not boto3's: boto3 adds only what this
        # store does not use (resources, upload_file through s3transfer), and
        # importing it cost a restore 0.1 core-s before its first byte.
        session = botocore.session.get_session()
        if any(a[k] is not None for k in ("access_key", "secret_key", "session_token")):
            session.set_credentials(a["access_key"], a["secret_key"], a["session_token"])
        try:
            return session.create_client(
                "s3", region_name=a["region"], endpoint_url=a["endpoint_url"], config=config,
                verify=self.options.ca_bundle)
        except (ValueError, BotoCoreError) as err:
            # botocore quotes the whole endpoint (credentials included) in its
            # message: say which setting is wrong, never what it holds.
            raise InvalidInput("endpoint_url", "an S3 endpoint botocore accepts "
                               f"({type(err).__name__})", self.endpoint) from None

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
        raise_store_error(err, op, where, bucket=self.bucket, endpoint=self.endpoint, key=key)

    def _call(self, op: str, key: str | None, *, handled: Collection[str] = (),
              **kwargs: Any) -> Any:
        """The client's `op` on this bucket, its errors raised as _fail maps
        them; one whose code is in `handled` is returned instead (a
        ClientError), for the caller to say what it means."""
        client = self._reader if self._reader is not None and self._reader.serves(
            op, {"Bucket": self.bucket, **kwargs}) else self._client
        try:
            return self.gate.send(op, getattr(client, op), {"Bucket": self.bucket, **kwargs},
                                  self._attempts)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in handled:
                return err
            self._fail(err, op, key)
        except BotoCoreError as err:
            self._fail(err, op, key)

    def _crc32c_checked(self) -> bool | None:
        """Whether the server checks x-amz-checksum-crc32c: asked once
        (s3_checksum_probe.py); None while its answers say nothing."""
        with self._probe_lock:
            if self._checks_crc32c is None and self._probes_left > 0:
                # StoreUnreachable propagates (the write fails as it would);
                # answers that say nothing stop the asking after a few.
                self._checks_crc32c = server_checks_crc32c(
                    lambda op, **kw: self._call(op, None, **kw),
                    probe_key(self.prefix), self.endpoint, self._create_args)
                if self._checks_crc32c is None:
                    self._probes_left -= 1
            return self._checks_crc32c

    def _integrity_args(self, data: bytes | bytearray | memoryview,
                        crc32c: int | None) -> dict[str, str]:
        """The checksum the server verifies before it stores a whole object:
        its CRC32C, or Content-MD5 where the server does not check CRC32C."""
        if not self._crc32c_checked():  # False, or None: not known
            return {"ContentMD5": content_md5(data)}
        if crc32c is None:
            crc32c = checksum.crc32c(memoryview(data).cast("B"))
        return {"ChecksumCRC32C": checksum.to_b64(crc32c)}

    # Whole objects -----------------------------------------------------------
    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        self._call("put_object", key, Key=self._key(key), Body=PacedBody(data, self._pace),
                   ContentLength=len(data), **self._integrity_args(data, crc32c),
                   **self._create_args)

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
        self._call("put_object", key, Key=self._key(key), Body=body, ContentLength=size,
                   **self._create_args)

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        response = self._call("get_object", key, Key=self._key(key))
        if limit is None:
            return self._read_body(response, "get_object", key)
        size = response.get("ContentLength")
        if size is not None and int(size) > limit:
            response["Body"].close()  # refused unread: the connection is dropped
            raise ObjectTooLarge(f"{key}: {int(size)} bytes, more than the {limit} allowed")
        data = self._read_body(response, "get_object", key, limit)
        if len(data) > limit:  # a body longer than announced (or none announced)
            raise ObjectTooLarge(f"{key}: more than the {limit} bytes allowed")
        return data

    def _read_body(self, response: dict[str, Any], op: str, key: str,
                   limit: int | None = None) -> bytes:
        """The response's body; with `limit`, at most limit + 1 bytes of it
        (the caller tells too many from enough), whatever was announced."""
        try:
            with response["Body"] as body:
                if limit is None:
                    return body.read()
                chunks, got = [], 0
                while got <= limit:
                    chunk = body.read(min(limit + 1 - got, _READ_CHUNK))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                return b"".join(chunks)
        except BotoCoreError as err:  # connection dropped mid-body
            self._fail(err, op, key)

    def head(self, key: str) -> ObjectInfo | None:
        response = self._call("head_object", key, handled=MISSING_KEY_CODES, Key=self._key(key))
        if isinstance(response, ClientError):
            return None  # HEAD has no body, so a missing bucket also reads as 404
        return ObjectInfo(key=key, size=int(response["ContentLength"]))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects under `prefix` in key order, one page at a time. Names no
        key can take (a checksum probe a server kept) are not listed."""
        root = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Prefix": root + prefix, "MaxKeys": self._page_size}
        while True:
            page = self._call("list_objects_v2", None, **kwargs)
            for item in page.get("Contents", []):
                key = item["Key"][len(root) :]
                if any(c.startswith(RESERVED_PREFIX) for c in key.split("/")):
                    continue
                modified = item.get("LastModified")
                yield ObjectInfo(key=key, size=int(item["Size"]),
                                 modified=modified.timestamp() if modified else None,
                                 storage_class=item.get("StorageClass"))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def delete(self, key: str) -> None:
        self._call("delete_object", key, Key=self._key(key))
