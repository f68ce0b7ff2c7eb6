"""What an S3 store refuses and how it says so, against real servers: a
stream it cannot rewind, a missing bucket, wrong credentials (never shown),
an endpoint nobody answers; and the endpoint taken from the environment.
"""

from __future__ import annotations

import io
import time

import pytest
from tests.support.s3servers import S3Server, free_port

from ckptdrain.errors import BucketMissing, InvalidInput, StoreAccessDenied, StoreUnreachable
from ckptdrain.store import open_store
from ckptdrain.store.s3 import S3Store

pytestmark = pytest.mark.integration


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
