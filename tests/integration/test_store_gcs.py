"""The gs:// store beyond the shared contract (which runs on it through the
`store` fixture): what it does on a real GCS JSON API server
(fake-gcs-server) and, where that server does not do what GCS does, around
it: a CRC32C it does not check, a bearer token it does not ask for."""

from __future__ import annotations

import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tests.support.apiserver import make_ca, make_cert
from tests.support.gcsserver import GcsServer

from ckptdrain import checksum, keys
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    StoreAccessDenied,
    StoreUnreachable,
)
from ckptdrain.store import open_store
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.gcs_auth import Token, TokenSource
from ckptdrain.store.gcs_multipart import UPLOADS
from ckptdrain.transfer.catalog import complete_steps
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration


@pytest.fixture
def gstore(gcs: GcsServer, _session_buckets: dict[str, str]) -> Iterator[GcsStore]:
    if gcs.name not in _session_buckets:
        _session_buckets[gcs.name] = gcs.create_bucket()
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    yield gcs.open_store(_session_buckets[gcs.name], prefix)
    gcs.delete_prefix(_session_buckets[gcs.name], prefix + "/")


def test_a_part_whose_crc32c_is_not_its_bytes_is_refused_and_not_kept(gstore: GcsStore) -> None:
    data = b"x" * (5 << 20)
    upload = gstore.create_multipart("data/k")
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        gstore.upload_part("data/k", upload, 1, data, checksum.crc32c(data) ^ 1)
    assert gstore.list_parts("data/k", upload) == []
    gstore.abort_multipart("data/k", upload)
    assert gstore.list_multipart_uploads("") == []


def test_more_parts_than_one_compose_takes_are_composed_in_rounds(gstore: GcsStore) -> None:
    chunks = [bytes([i]) * (5 << 20 if i < 39 else 1234) for i in range(40)]
    upload = gstore.create_multipart("data/many")
    sent = [gstore.upload_part("data/many", upload, n, c) for n, c in enumerate(chunks, 1)]
    gstore.complete_multipart("data/many", upload, sent)
    whole = b"".join(chunks)
    assert gstore.object_crc32c("data/many") == checksum.to_hex(checksum.crc32c(whole))
    assert gstore.get_range("data/many", 5 * (5 << 20) - 2, 4) == bytes([4, 4, 5, 5])
    # Parts, intermediate objects and the marker went with the upload.
    assert not list(gstore._list_names(f"{gstore.prefix}/{UPLOADS}/"))


def test_a_part_sent_again_after_listing_is_not_composed_in_its_place(gstore: GcsStore) -> None:
    size = 5 << 20
    upload = gstore.create_multipart("data/r")
    first = gstore.upload_part("data/r", upload, 1, b"a" * size)
    last = gstore.upload_part("data/r", upload, 2, b"z")
    gstore.upload_part("data/r", upload, 1, b"b" * size)  # a new generation
    with pytest.raises(IntegrityError, match="etag differs"):
        gstore.complete_multipart("data/r", upload, [first, last])
    gstore.abort_multipart("data/r", upload)


def test_a_drain_and_a_restore_through_open_store_with_the_emulator_variable(
        gcs: GcsServer, gstore: GcsStore, tmp_path: Path) -> None:
    src = tmp_path / "step-5"
    (src / "opt").mkdir(parents=True)
    (src / "model.bin").write_bytes(bytes(range(256)) * 50_000)
    (src / "opt" / "s.bin").write_bytes(b"s" * 1000)
    store = open_store(gstore.uri, environ={
        "STORAGE_EMULATOR_HOST": gcs.endpoint_url.split("://")[1]})
    assert isinstance(store, GcsStore)
    Drainer(store, part_size=5 << 20, concurrency=3).drain(
        src, build_manifest(src, 5, 0, 1, created=5.0), journal_path=tmp_path / "j.json")
    assert [c.step for c in complete_steps(store)] == [5]
    assert len([k for k in store.list(keys.DATA)]) == 2
    got = fetch(store, tmp_path / "dest")
    assert got.step == 5
    assert (tmp_path / "dest" / "model.bin").read_bytes() == (src / "model.bin").read_bytes()


def test_a_missing_bucket_is_named(gcs: GcsServer) -> None:
    store = gcs.open_store("no-such-bucket-here")
    with pytest.raises(BucketMissing, match="no-such-bucket-here"):
        list(store.list(""))


def test_an_unreachable_endpoint_fails_fast_and_names_it() -> None:
    store = GcsStore("b", endpoint_url="http://127.0.0.1:9", environ={}, attempts=1)
    with pytest.raises(StoreUnreachable, match=r"127\.0\.0\.1:9"):
        store.get_bytes("k")


class _Recorder(BaseHTTPRequestHandler):
    """A TLS endpoint that answers object metadata, as GCS would, to a valid
    bearer token only; the first token it sees it calls expired."""
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        type(self).seen.append(auth)
        status, body = (401, {"error": {"code": 401, "message": "Invalid Credentials"}}) \
            if auth != "Bearer tok-2" else (200, {"name": "p/k", "size": "3",
                                                 "crc32c": "AAAAAA==",
                                                 "updated": "2026-11-27T00:00:00Z"})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


def test_a_bearer_token_goes_over_tls_only_and_an_expired_one_is_renewed_once(
        tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = make_cert(tmp_path, "gcs", ca)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    issued = iter(["tok-1", "tok-2", "tok-3", "tok-4"])
    tokens = TokenSource(lambda: Token(next(issued), float("inf")))
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        store = GcsStore("b", "p", endpoint_url=url, tokens=tokens, ca_bundle=str(ca[0]),
                         environ={})
        info = store.head("k")
        assert info is not None and info.size == 3
        assert _Recorder.seen == ["Bearer tok-1", "Bearer tok-2"]
        # A token the store keeps refusing is an access problem, said once.
        _Recorder.seen.clear()
        tokens.forget()
        with pytest.raises(StoreAccessDenied, match="HTTP 401"):
            store.head("k")
        assert _Recorder.seen == ["Bearer tok-3", "Bearer tok-4"]
        # Over plain http no token is ever asked for or sent, however the
        # scheme is written (parse_endpoint keeps its case).
        for scheme in ("http", "HTTP", "Http"):
            plain = GcsStore("b", endpoint_url=f"{scheme}://127.0.0.1:9", environ={},
                             attempts=1)
            assert plain._tokens is None, scheme
    finally:
        server.shutdown()


class _RealNotFound(BaseHTTPRequestHandler):
    """Answers as GCS does when an object or a bucket is missing: its 404
    names the bucket either way (fake-gcs-server says only "Not Found")."""

    def _not_found(self) -> None:
        bucket = self.path.split("/b/", 1)[1].split("/", 1)[0]
        message = (f"No such object: {bucket}/x" if "/o/" in self.path and "gone" not in bucket
                   else "The specified bucket does not exist.")
        data = json.dumps({"error": {"code": 404, "message": message}}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_DELETE = _not_found

    def log_message(self, *_: Any) -> None:
        pass


def test_a_missing_object_in_a_bucket_named_bucket_is_a_missing_object() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RealNotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        store = GcsStore("my-gcs-bucket", "ckpt", endpoint_url=url, environ={})
        assert store.head("manifests/x.json") is None
        with pytest.raises(ObjectMissing):
            store.get_bytes("manifests/x.json")
        store.delete("manifests/x.json")  # a missing object: nothing to do
        gone = GcsStore("gone-bucket", endpoint_url=url, environ={})
        with pytest.raises(BucketMissing):
            gone.get_bytes("k")
        with pytest.raises(BucketMissing):
            gone.head("k")
    finally:
        server.shutdown()


@pytest.mark.parametrize("endpoint", ["https://storage.example.com", "https://127.0.0.1:1"])
def test_googles_token_goes_to_googles_hosts_only(endpoint: str) -> None:
    with pytest.raises(InvalidInput, match=r"googleapis\.com"):
        GcsStore("b", endpoint_url=endpoint, environ={})
    assert GcsStore("b", endpoint_url="https://storage-x.p.googleapis.com",
                    environ={"GCE_METADATA_HOST": "127.0.0.1:9"})._tokens is not None
