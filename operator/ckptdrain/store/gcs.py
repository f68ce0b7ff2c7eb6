"""The gs:// store: Google Cloud Storage through its JSON API, natively.

Credentials are Application Default Credentials (gcs_auth.py), so GKE
Workload Identity works without HMAC keys; a bearer token is never sent
over plain http (an http:// endpoint is an emulator, asked anonymously).

Integrity: every upload carries its CRC32C in the object's metadata (a
multipart upload of the JSON API; GCS checks it before it stores the
object) and the CRC32C GCS reports for what it stored is compared with
ours; a mismatch deletes that generation and raises IntegrityError.
Reads are checked as the S3 store checks them: a ranged GET
must answer the range asked for (gcs_ranged_reads.py). Multipart uploads
are parts stored as objects and composed on the server (gcs_multipart.py).

Every request passes the endpoint's throttle gate (s3_throttle.py), shared
with every store of the process: 429 and 5xx answers and dropped
connections shrink the window for all, and are retried there. The gate
speaks botocore's error types, so failures are handed to it as those.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, NoReturn
from urllib.parse import quote

import urllib3
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError, SSLError

from ckptdrain import checksum
from ckptdrain.errors import (
    BucketMissing,
    GenerationChanged,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    ObjectTooLarge,
    StoreAccessDenied,
    StoreError,
    StoreUnreachable,
)
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store.base import ObjectInfo
from ckptdrain.store.gcs_auth import TokenSource, default_credentials
from ckptdrain.store.gcs_body import RelatedBody
from ckptdrain.store.gcs_formats import when
from ckptdrain.store.gcs_multipart import GcsMultipart
from ckptdrain.store.gcs_ranged_reads import GcsRangedReads
from ckptdrain.store.gcs_storage_class import GcsStorageClass
from ckptdrain.store.s3_bodies import PacedBody, WindowBody
from ckptdrain.store.s3_errors import redact_endpoint
from ckptdrain.store.s3_throttle import ATTEMPTS, ThrottleGate, gate_for

GOOGLE = "https://storage.googleapis.com"
#: The emulator convention of Google's own libraries: host[:port], plain http.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
MIN_PART_SIZE = 5 << 20  # as the S3 store's, so a drain cuts files the same way
_BLOCK = 1 << 20


class GcsStore(GcsMultipart, GcsStorageClass, GcsRangedReads):
    """A Store over one bucket and key prefix of Google Cloud Storage."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 tokens: TokenSource | None = None, max_pool_connections: int = 32,
                 ca_bundle: str | None = None, environ: Mapping[str, str] | None = None,
                 gate: ThrottleGate | None = None, attempts: int = ATTEMPTS,
                 connect_timeout: float = 10, read_timeout: float = 120) -> None:
        env = os.environ if environ is None else environ
        emulator = env.get(EMULATOR_ENV, "").strip()
        endpoint = endpoint_url or (f"http://{emulator}" if emulator else GOOGLE)
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.endpoint = redact_endpoint(endpoint.rstrip("/"))
        self._base = endpoint.rstrip("/")
        self.uri = f"gs://{bucket}/{self.prefix}".rstrip("/")
        # Never a bearer token over plain http: there, an emulator is asked
        # anonymously. Over https, Google's token only to Google's hosts
        # (Private Service Connect endpoints included), unless the caller
        # hands a token source of its own: a store's endpoint is a policy
        # field, and a token is worth an hour of the agent's identity.
        if (urllib3.util.parse_url(self._base).scheme or "").lower() == "http":
            self._tokens = None  # whatever case the scheme is written in
        elif tokens is not None:
            self._tokens = tokens
        elif endpoint_problem(self._base) is None:
            self._tokens = default_credentials(env)
        else:
            raise InvalidInput("endpoint", str(endpoint_problem(self._base)), self.endpoint)
        self._http = urllib3.PoolManager(
            num_pools=4, maxsize=max_pool_connections, block=False, ca_certs=ca_bundle,
            blocksize=_BLOCK,
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout))
        self._pace: Callable[[int], object] | None = None
        self.gate = gate if gate is not None else gate_for(self.endpoint)
        self._attempts = max(1, attempts)

    def __repr__(self) -> str:
        return f"GcsStore({self.uri!r}, endpoint={self.endpoint!r})"

    def set_pacer(self, pace: Callable[[int], object] | None) -> None:
        """Bytes sent are handed to `pace` as they go (the drain's rate limiter)."""
        self._pace = pace

    @property
    def min_part_size(self) -> int:
        return MIN_PART_SIZE

    # Helpers -----------------------------------------------------------------
    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _object_url(self, name: str, media: bool = False) -> str:
        url = f"{self._base}/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"
        return url + ("?alt=media" if media else "")

    def _where(self, key: str | None) -> str:
        return f"gs://{self.bucket}/{self._name(key) if key else self.prefix}".rstrip("/")

    def _request(self, op: str, method: str, url: str, key: str | None, *,
                 body: Any = None, size: int = 0, headers: Mapping[str, str] | None = None,
                 stream: bool = False, missing: bool = False
                 ) -> urllib3.BaseHTTPResponse | None:
        """One request through the gate; None for a 404 when `missing` (the
        caller says what that means). Errors are raised as errors.py's."""
        def call(**kwargs: Any) -> dict[str, Any]:
            all_headers = dict(headers or {})
            if self._tokens is not None:
                all_headers.update(self._tokens.header())
            if size or body is not None:
                all_headers["Content-Length"] = str(size)
            try:
                response = self._http.request(method, url, body=kwargs.get("Body"),
                                              headers=all_headers, preload_content=not stream,
                                              retries=False, redirect=False)
            except urllib3.exceptions.SSLError as err:
                raise SSLError(endpoint_url=self.endpoint, error=err) from None
            except urllib3.exceptions.ReadTimeoutError as err:
                raise ReadTimeoutError(endpoint_url=self.endpoint, error=err) from None
            except urllib3.exceptions.HTTPError as err:
                raise EndpointConnectionError(endpoint_url=self.endpoint, error=err) from None
            if response.status < 300:
                length = response.headers.get("Content-Length")
                return {"Response": response, "ContentLength": int(length) if length else 0}
            if stream:  # the start of an error body, then the connection is dropped
                text = response.read(2000)
                response.close()
            else:
                text = response.data[:2000]
                response.release_conn()
            message = _error_message(text)
            if missing and response.status == 404 and not bucket_missing(message):
                return {"Response": None, "ContentLength": 0}
            if response.status == 401 and self._tokens is not None:
                self._tokens.forget()
            raise ClientError({"Error": {"Code": str(response.status), "Message": message},
                               "ResponseMetadata": {"HTTPStatusCode": response.status}}, op)

        gate_op = {"upload": "put_object", "compose": "complete_multipart_upload",
                   "get": "get_object", "stat": "head_object", "list": "list_objects_v2",
                   "delete": "delete_object", "rewrite": "copy_object",
                   }.get(op.split(" ")[0], "get_object")
        for retry in (False, True):
            try:
                answer = self.gate.send(gate_op, call, {"Body": body, "ContentLength": size},
                                        self._attempts)
            except ClientError as err:
                status = err.response["ResponseMetadata"]["HTTPStatusCode"]
                if status == 401 and self._tokens is not None and not retry:
                    if hasattr(body, "seek"):
                        body.seek(0)
                    continue  # an expired token: once more with a new one
                self._fail(op, key, status, err.response["Error"]["Message"])
            except (SSLError, ReadTimeoutError, EndpointConnectionError) as err:
                what = "TLS failed (certificate not trusted or not TLS)" \
                    if isinstance(err, SSLError) else f"did not answer ({type(err).__name__})"
                raise StoreUnreachable(f"{op} {self._where(key)}: {self.endpoint} {what}") \
                    from None
            response: urllib3.BaseHTTPResponse | None = answer["Response"]
            return response  # None: a missing object, where the caller allowed it
        raise AssertionError("unreachable")

    def _fail(self, op: str, key: str | None, status: int, message: str) -> NoReturn:
        where = self._where(key)
        if status in (401, 403):
            account = self._tokens.account if self._tokens is not None else None
            who = (f"Google service account {account} (impersonated)" if account
                   else "pod's Google service account")
            raise StoreAccessDenied(f"{op} {where}: access denied (HTTP {status}); check the "
                                    f"{who} and its bucket roles")
        if status == 404 and (key is None or bucket_missing(message)):
            raise BucketMissing(f"{op} {where}: bucket {self.bucket} does not exist "
                                f"at {self.endpoint}")
        if status == 404:
            raise ObjectMissing(key or where)
        if status == 412:
            raise GenerationChanged(f"{op} {where}: another generation is there now "
                                    f"(HTTP 412 from {self.endpoint})")
        raise StoreError(f"{op} {where}: HTTP {status} from {self.endpoint}: {message}")

    def _json(self, response: urllib3.BaseHTTPResponse, op: str, key: str | None
              ) -> dict[str, Any]:
        try:
            value = json.loads(response.data)
        except ValueError:
            raise StoreError(f"{op} {self._where(key)}: an answer that is not JSON") from None
        if not isinstance(value, dict):
            raise StoreError(f"{op} {self._where(key)}: an answer that is not an object")
        return value

    def _upload(self, op: str, name: str, key: str, body: Any, size: int,
                crc: int) -> dict[str, Any]:
        """Upload `size` bytes from `body` as object `name`, its CRC32C in the
        object's metadata (GCS refuses the upload when the bytes differ); the
        stored object's metadata. What GCS says it stored is checked too: a
        mismatch deletes that generation (never another) and raises."""
        related = RelatedBody({"name": name, "crc32c": checksum.to_b64(crc)}, body)
        url = (f"{self._base}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o"
               "?uploadType=multipart")
        response = self._request(op, "POST", url, key, body=related,
                                 size=size + related.extra(),
                                 headers={"Content-Type": related.content_type})
        assert response is not None
        meta = self._json(response, op, key)
        stored = checksum.from_b64(meta.get("crc32c"))
        if int(meta.get("size", -1)) != size or stored != crc:
            self._delete_name(name, key, generation=str(meta.get("generation", "")))
            raise IntegrityError(
                f"{op} {self._where(key)}: the store refused the bytes: checksum mismatch "
                f"(stored {meta.get('size')} of {size} bytes, CRC32C "
                f"{checksum.to_hex(stored) if stored is not None else 'none'}, expected "
                f"{checksum.to_hex(crc)})")
        return meta

    def _delete_name(self, name: str, key: str | None, generation: str | None = None) -> None:
        url = self._object_url(name)
        if generation:
            url += f"?generation={quote(generation, safe='')}"
        response = self._request("delete", "DELETE", url, key, missing=True)
        if response is not None:
            response.release_conn()

    def _stat(self, name: str, key: str | None) -> dict[str, Any] | None:
        response = self._request("stat", "GET", self._object_url(name), key, missing=True)
        return None if response is None else self._json(response, "stat", key)

    def _list_names(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        """Every object whose name starts with `full_prefix`, by name, paged."""
        url = f"{self._base}/storage/v1/b/{quote(self.bucket, safe='')}/o"
        token = None
        while True:
            query = f"?prefix={quote(full_prefix, safe='')}"
            if token:
                query += f"&pageToken={quote(token, safe='')}"
            response = self._request("list", "GET", url + query, None)
            assert response is not None
            page = self._json(response, "list", None)
            items = page.get("items") or []
            yield from sorted(items, key=lambda i: str(i.get("name", "")).encode())
            token = page.get("nextPageToken")
            if not token:
                return

    # Whole objects -----------------------------------------------------------
    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        if crc32c is None:
            crc32c = checksum.crc32c(memoryview(data).cast("B"))
        self._upload("upload", self._name(key), key, PacedBody(data, self._pace), len(data),
                     crc32c)

    def put_stream(self, key: str, stream: BinaryIO, size: int) -> None:
        if size < 0:
            raise InvalidInput("size", "a size >= 0", size)
        if not stream.seekable():
            raise InvalidInput("stream", "a seekable stream (use multipart for pipes)", stream)
        body = WindowBody(stream, size, self._pace, strict=True)
        crc, scan = 0, WindowBody(stream, size, strict=True)
        while chunk := scan.read(_BLOCK):  # its CRC32C first: it goes before the bytes
            crc = checksum.crc32c(chunk, crc)
        body.seek(0)
        self._upload("upload", self._name(key), key, body, size, crc)

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        response = self._request("get", "GET", self._object_url(self._name(key), media=True),
                                 key, stream=True, missing=True)
        if response is None:
            raise ObjectMissing(key)
        announced = response.headers.get("Content-Length")
        if limit is not None and announced is not None and int(announced) > limit:
            response.close()  # unread: the connection is dropped, not pooled
            raise ObjectTooLarge(f"{self._where(key)}: {announced} bytes, more than {limit}")
        data = self._read(response, key, None if limit is None else limit + 1)
        if limit is not None and len(data) > limit:
            raise ObjectTooLarge(f"{self._where(key)}: more than {limit} bytes")
        return data

    def _read(self, response: urllib3.BaseHTTPResponse, key: str, most: int | None) -> bytes:
        try:
            data = response.read(most) if most is not None else response.read()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            response.release_conn()
            raise self._broke(key, err) from None
        response.release_conn()
        return bytes(data)

    def _broke(self, key: str, err: BaseException) -> StoreUnreachable:
        return StoreUnreachable(f"get {self._where(key)}: the connection to {self.endpoint} "
                                f"broke mid-body ({type(err).__name__})")

    def head(self, key: str) -> ObjectInfo | None:
        meta = self._stat(self._name(key), key)
        if meta is None:
            return None
        return ObjectInfo(key=key, size=int(meta.get("size", 0)), modified=when(
            meta.get("updated")), storage_class=meta.get("storageClass"))

    def object_crc32c(self, key: str) -> str | None:
        """The CRC32C GCS keeps for the whole object (composed ones included)."""
        meta = self._stat(self._name(key), key)
        crc = checksum.from_b64(meta.get("crc32c")) if meta is not None else None
        return None if crc is None else checksum.to_hex(crc)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        for item in self._list_names(root + prefix):
            key = str(item["name"])[len(root):]
            if any(c.startswith(RESERVED_PREFIX) for c in key.split("/")):
                continue  # unfinished uploads' parts (gcs_multipart.py), ours or a nested store's
            yield ObjectInfo(key=key, size=int(item.get("size", 0)),
                             modified=when(item.get("updated")),
                             storage_class=item.get("storageClass"))

    def delete(self, key: str) -> None:
        self._delete_name(self._name(key), key)


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` cannot be a gs:// store's, or None. Pure: the policy
    webhook asks it too."""
    url = urllib3.util.parse_url(endpoint)
    host, scheme = (url.host or "").lower(), (url.scheme or "").lower()
    if scheme == "http" or (scheme == "https" and (
            host == "googleapis.com" or host.endswith(".googleapis.com"))):
        return None
    return ("https://storage.googleapis.com, another *.googleapis.com host (Private Service "
            "Connect), or an http:// emulator: the pod's Google token is sent to it")


def bucket_missing(message: str) -> bool:
    """Whether a 404's message says the bucket is missing. GCS names the
    bucket in every 404 ("No such object: <bucket>/<name>"), so only its
    bucket answer counts, not any message that mentions a bucket."""
    return "bucket does not exist" in message.lower()


def _error_message(text: bytes) -> str:
    """What a GCS error answer says, in one short line (no request echo)."""
    try:
        error = json.loads(text).get("error", {})
        return str(error.get("message", ""))[:300]
    except (ValueError, AttributeError):
        return text.decode("utf-8", "replace").strip().splitlines()[0][:300] if text else ""
