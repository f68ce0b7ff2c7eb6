"""store/s3_read_client.py against a small HTTP server in this process: what
it sends (addresses as botocore builds them), what it makes of odd answers
(a wrong region, a connection the server closed, a body cut short), and
that those reach the store as botocore's would. tests/integration/
test_store_reads.py holds it to botocore on MinIO and SeaweedFS."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    ResponseStreamingError,
    SSLError,
)

from ckptdrain.errors import StoreUnreachable
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_read_client import S3ReadClient
from ckptdrain.store.s3_read_settings import ReadSettings
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.store.sigv4 import Credentials

SETTINGS = ReadSettings(Credentials("AKID", "secret"), "us-east-1", virtual=False,
                        ca_file=None)
#: The region the fake server's bucket lives in.
HOME = "eu-west-3"


class Fake:
    """Answers GET and HEAD of /bkt/k with `body`; a request signed for
    another region than HOME gets S3's 400 naming HOME; `after` runs after
    each answer (to close the connection, say)."""

    def __init__(self) -> None:
        #: method, path, region, and the client's port (one per connection)
        self.seen: list[tuple[str, str, str, int]] = []
        self.body = b"hello"
        self.announce: int | None = None  # a Content-Length other than the body's
        self.no_length = False  # no Content-Length, and the connection closed
        self.after: Callable[[Any], None] = lambda handler: None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                fake.answer(self)

            do_GET = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        found = re.search(r"Credential=[^/]+/\d+/([^/]+)/", h.headers.get("Authorization", ""))
        region = found[1] if found else ""
        self.seen.append((h.command, h.path, region, h.client_address[1]))
        if h.path.endswith("/missing"):
            body = b"" if h.command == "HEAD" else (
                b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>The specified key"
                b" does not exist.</Message><Key>missing</Key></Error>")
            h.send_response(404)
        elif region != HOME:
            body = b"" if h.command == "HEAD" else (
                b"<?xml version='1.0'?><Error><Code>AuthorizationHeaderMalformed</Code>"
                b"<Message>wrong region</Message><Region>" + HOME.encode() + b"</Region></Error>")
            h.send_response(400)
            if h.command == "HEAD":
                h.send_header("x-amz-bucket-region", HOME)
        else:
            body = self.body
            h.send_response(200)
        if self.no_length:
            h.send_header("Connection", "close")
        else:
            h.send_header("Content-Length", str(self.announce or len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
        h.wfile.flush()
        self.after(h)


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = Fake()
    yield server
    server.server.shutdown()
    server.server.server_close()


def client(url: str, settings: ReadSettings = SETTINGS) -> S3ReadClient:
    return S3ReadClient(url, settings, max_pool_connections=4, connect_timeout=2,
                        read_timeout=2)


def test_a_wrong_region_is_corrected_for_that_request_only(fake: Fake) -> None:
    # botocore re-signs for the named region as this does; the client's own
    # region stays, so one stray answer cannot re-sign every later request.
    reader = client(fake.url)
    assert reader.get_object(Bucket="bkt", Key="k")["Body"].read() == b"hello"
    assert reader.head_object(Bucket="bkt", Key="k")["ContentLength"] == 5
    assert [(m, r) for m, _, r, _ in fake.seen] == [
        ("GET", "us-east-1"), ("GET", HOME), ("HEAD", "us-east-1"), ("HEAD", HOME)]
    assert reader._region == "us-east-1"


def test_a_get_with_neither_length_nor_chunks_is_refused(fake: Fake) -> None:
    fake.no_length = True  # EOF would end it: a cut body would read as whole
    with pytest.raises(ResponseStreamingError):
        client(fake.url, ReadSettings(SETTINGS.credentials, HOME, False, None)).get_object(
            Bucket="bkt", Key="k")


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_ca_bundle_is_loaded_as_botocore_loads_it(tmp_path: Path, where: str) -> None:
    # A directory is a capath (urllib3's ca_cert_dir); a missing file is
    # botocore's SSLError, not a raw FileNotFoundError.
    ca = str(tmp_path / "nowhere.pem") if where == "missing" else str(tmp_path)
    reader = client("https://127.0.0.1:1", ReadSettings(SETTINGS.credentials, HOME, False, ca))
    with pytest.raises(SSLError if where == "missing" else EndpointConnectionError):
        reader.head_object(Bucket="bkt", Key="k")


def test_a_head_learns_the_region_from_its_header(fake: Fake) -> None:
    reader = client(fake.url)
    assert reader.head_object(Bucket="bkt", Key="k")["ContentLength"] == 5
    assert [(m, r) for m, _, r, _ in fake.seen] == [("HEAD", "us-east-1"), ("HEAD", HOME)]


def test_a_connection_is_reused_and_one_the_server_closed_is_not(fake: Fake) -> None:
    reader = client(fake.url, ReadSettings(SETTINGS.credentials, HOME, False, None))
    for _ in range(3):
        assert reader.get_object(Bucket="bkt", Key="k")["Body"].read() == b"hello"
    assert len({c for *_, c in fake.seen}) == 1
    fake.after = lambda h: h.connection.shutdown(2)  # closed once answered, not announced
    fake.seen.clear()
    for _ in range(3):
        assert reader.get_object(Bucket="bkt", Key="k")["Body"].read() == b"hello"
    assert len({c for *_, c in fake.seen}) == 3


def test_a_body_cut_short_fails_the_read_as_unreachable(fake: Fake) -> None:
    fake.announce = 10  # five bytes come, then the connection closes
    fake.after = lambda h: h.connection.shutdown(2)
    store = S3Store("bkt", endpoint_url=fake.url, region=HOME, access_key="AKID",
                    secret_key="secret", gate=ThrottleGate(), max_attempts=1)
    assert store._reader is not None
    with pytest.raises(StoreUnreachable):
        store.get_bytes("k")


def test_an_endpoint_nobody_listens_on_is_botocores_connection_error() -> None:
    reader = client("http://127.0.0.1:9")
    with pytest.raises(EndpointConnectionError):
        reader.head_object(Bucket="bkt", Key="k")


def test_an_error_answer_is_the_client_error_botocore_raises(fake: Fake) -> None:
    settings = ReadSettings(SETTINGS.credentials, HOME, False, None)
    boto = botocore.session.get_session().create_client(
        "s3", region_name=HOME, endpoint_url=fake.url, aws_access_key_id="AKID",
        aws_secret_access_key="secret",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}))
    for op in ("get_object", "head_object"):
        errors = []
        for c in (client(fake.url, settings), boto):
            with pytest.raises(ClientError) as err:
                getattr(c, op)(Bucket="bkt", Key="missing")
            errors.append(err.value)
        ours, theirs = errors
        assert ours.operation_name == theirs.operation_name
        assert ours.response["Error"]["Code"] == theirs.response["Error"]["Code"]
        assert ours.response["Error"]["Message"] == theirs.response["Error"]["Message"]
        assert ours.response["ResponseMetadata"]["HTTPStatusCode"] == 404


class _Sent(Exception):
    """Raised by a before-send hook: the request botocore would have sent."""


def botocores_address(endpoint: str, virtual: bool, bucket: str,
                      key: str | None) -> tuple[str, str]:
    boto = botocore.session.get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="AKID",
        aws_secret_access_key="secret", config=Config(
            s3={"addressing_style": "virtual" if virtual else "path"},
            retries={"total_max_attempts": 1}))

    def stop(request: Any, **_: Any) -> None:
        raise _Sent(request.url, request.headers["host"])

    boto.meta.events.register("before-send", stop)
    with pytest.raises(_Sent) as sent:
        if key is None:
            boto.list_objects_v2(Bucket=bucket)
        else:
            boto.get_object(Bucket=bucket, Key=key)
    url, host = sent.value.args
    path = url.split("://", 1)[1].split("?", 1)[0]
    return (host.decode() if isinstance(host, bytes) else host), path[path.index("/"):]


@pytest.mark.parametrize(("endpoint", "virtual", "key"), [
    ("http://127.0.0.1:9000", False, "a b/c+d é"),
    ("http://127.0.0.1:9000/base", False, None),
    ("http://127.0.0.1:9000/base/", False, "k"),
    ("https://s3.example.com", True, "k/x"),
    ("https://s3.example.com:443", True, None),
    ("https://s3.example.com:8443", True, "k"),
    ("http://[::1]:9000", False, "k"),
    ("http://s3.example.com:80/root", False, "k"),
])
def test_requests_go_where_botocore_sends_them(endpoint: str, virtual: bool,
                                               key: str | None) -> None:
    reader = client(endpoint.rstrip("/"),
                    ReadSettings(SETTINGS.credentials, "us-east-1", virtual, None))
    assert reader._address("bkt", key) == botocores_address(endpoint.rstrip("/"), virtual,
                                                            "bkt", key)
