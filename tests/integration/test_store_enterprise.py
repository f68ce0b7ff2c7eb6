"""Enterprise S3 on real servers: a private CA (MinIO over TLS with a CA made
here), server-side encryption (MinIO with its built-in KMS key; SeaweedFS as
it is), and what is refused rather than stored in the clear."""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.support.s3servers import S3Server, start_minio

from ckptdrain.errors import StoreError, StoreUnreachable
from ckptdrain.operator.tls.certs import _pem, new_ca, new_serving
from ckptdrain.store import open_store
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_options import S3Options
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
PART = 5 << 20
KMS_KEY = "ckptdrain-test-key"


@pytest.fixture(scope="module")
def tls_minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """MinIO over https with a certificate from a CA nobody's system trusts,
    and a built-in KMS key (so SSE-S3 and SSE-KMS work)."""
    root = tmp_path_factory.mktemp("tls")
    now = datetime.now(UTC)
    ca, ca_key = new_ca("ckptdrain test CA", now)
    cert, key = new_serving(ca, ca_key, ["localhost"], now)
    (root / "ca.pem").write_bytes(_pem(ca))
    (root / "cert.pem").write_bytes(_pem(cert))
    (root / "key.pem").write_bytes(key)
    kms = f"{KMS_KEY}:{base64.b64encode(secrets.token_bytes(32)).decode()}"
    with start_minio(root, tls=(root / "cert.pem", root / "key.pem", root / "ca.pem"),
                     env_extra={"MINIO_KMS_SECRET_KEY": kms}) as server:
        yield server


def _tree(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "big.bin").write_bytes(secrets.token_bytes(PART + 17))
    (root / "small.bin").write_bytes(b"small")
    return root


def test_a_private_ca_by_reference_lets_the_drain_and_restore_through(
        tls_minio: S3Server, tmp_path: Path) -> None:
    bucket = tls_minio.create_bucket()
    env = {"CKPTDRAIN_S3_CA_BUNDLE": str(tls_minio.ca_bundle),
           "CKPTDRAIN_S3_ENDPOINT": tls_minio.endpoint_url,
           "AWS_ACCESS_KEY_ID": tls_minio.access_key,
           "AWS_SECRET_ACCESS_KEY": tls_minio.secret_key}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        store = open_store(f"s3://{bucket}/ca", region=tls_minio.region)
        src = _tree(tmp_path / "step-3")
        Drainer(store, part_size=PART).drain(src, build_manifest(src, 3, 0, 1, created=1.0),
                                             journal_path=tmp_path / "j")
        fetch(store, tmp_path / "out")
    assert (tmp_path / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_without_the_ca_the_endpoint_is_refused_once_and_clearly(
        tls_minio: S3Server) -> None:
    store = S3Store("any-bucket", endpoint_url=tls_minio.endpoint_url, region=tls_minio.region,
                    access_key=tls_minio.access_key, secret_key=tls_minio.secret_key,
                    gate=ThrottleGate())
    with pytest.raises(StoreUnreachable, match=r"storage\.caBundle"):
        store.put_bytes("k", b"v")
    assert store.gate.state().signals == 0  # not retried as if the store were busy


@pytest.mark.parametrize(("sse", "key_id", "expected"), [
    ("SSE-S3", None, "AES256"), ("SSE-KMS", KMS_KEY, "aws:kms")])
def test_objects_and_multipart_uploads_are_encrypted_as_asked(
        tls_minio: S3Server, tmp_path: Path, sse: str, key_id: str | None,
        expected: str) -> None:
    bucket = tls_minio.create_bucket()
    options = S3Options(sse=sse, kms_key_id=key_id, ca_bundle=str(tls_minio.ca_bundle))
    store = tls_minio.open_store(bucket, "enc", options=options)
    puts: list[dict[str, str]] = []
    store._client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: puts.append(dict(request.headers)))
    src = _tree(tmp_path / "step-4")
    result = Drainer(store, part_size=PART).drain(
        src, build_manifest(src, 4, 0, 1, created=time.time()), journal_path=tmp_path / "j")
    client = tls_minio.client()
    seen = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="enc/"):
        for item in page.get("Contents", []):
            head = client.head_object(Bucket=bucket, Key=item["Key"])
            seen[item["Key"].rsplit("/", 1)[-1]] = (head.get("ServerSideEncryption"),
                                                   head.get("SSEKMSKeyId"))
    # The multipart object, the single PUT and the manifest alike.
    assert set(seen) == {"big.bin", "small.bin", "00000.json"} and result.parts_sent >= 3
    assert {mode for mode, _ in seen.values()} == {expected}
    if key_id:
        assert all(key_id in str(k) for _, k in seen.values())
    # Every PUT asked for it, the checksum probe first among them: a bucket
    # policy that requires encryption would refuse a PUT without it.
    assert len(puts) >= 3 and all(
        h.get("x-amz-server-side-encryption") == expected.encode() for h in puts)
    fetch(store, tmp_path / "out")  # reads back transparently
    assert (tmp_path / "out" / "small.bin").read_bytes() == b"small"


def test_a_store_that_cannot_encrypt_refuses_the_write(s3server: S3Server,
                                                      s3area: tuple[str, str]) -> None:
    """The session servers run without a KMS: asked for SSE-KMS with a key
    they do not have, they refuse; nothing is stored in the clear."""
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix,
                                options=S3Options(sse="SSE-KMS", kms_key_id="no-such-key"))
    with pytest.raises(StoreError):
        store.put_bytes("secret", b"data")
    assert store.head("secret") is None


def test_sse_s3_where_the_server_has_it_and_a_clear_refusal_where_not(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    """SeaweedFS encrypts with SSE-S3 by itself; MinIO needs a KMS for it
    (the session server has none) and says it does not implement it."""
    bucket, prefix = s3area
    store = s3server.open_store(bucket, prefix, options=S3Options(sse="SSE-S3"))
    if s3server.name == "minio":
        with pytest.raises(StoreError, match="does not implement"):
            store.put_bytes("secret", b"data")
        assert store.head("secret") is None
        return
    store.put_bytes("secret", b"data")
    head = s3server.client().head_object(Bucket=bucket, Key=f"{prefix}/secret")
    assert head.get("ServerSideEncryption") == "AES256"
    assert store.get_bytes("secret") == b"data"
