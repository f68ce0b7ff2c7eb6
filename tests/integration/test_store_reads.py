"""Reads without botocore's client (store/s3_read_client.py) on real servers:
the same answers and the same failures as botocore's, credentials from
botocore's chain wherever its first link does not answer (web identity
through a real STS exchange), and a restore with static keys that never
loads botocore's client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import botocore.session
import pytest
from tests.support.ports import free_port
from tests.support.s3servers import S3Server

from ckptdrain.errors import (
    BucketMissing,
    CkptdrainError,
    ObjectMissing,
    StoreAccessDenied,
    StoreUnreachable,
)
from ckptdrain.store import open_store
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_throttle import ThrottleGate

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
#: Keys a listing, a URL and a signature all have to get right.
ODD_KEYS = ["plain", "a b/c+d%e~f!g'h(i)*j;k:l@m&n=o$p,q[r]s", "é/ü/日本", "x" * 200,
            "dir/with.dots/..file", "tab\tand+plus"]


def both(server: S3Server, bucket: str, prefix: str, **kw: Any) -> tuple[S3Store, S3Store]:
    """(reads without botocore, reads through it) on the same place."""
    ours = server.open_store(bucket, prefix, **kw)
    theirs = server.open_store(bucket, prefix, botocore_reads=True, **kw)
    assert ours._reader is not None and theirs._reader is None
    return ours, theirs


def test_answers_are_botocores(s3server: S3Server, s3area: tuple[str, str],
                               tmp_path: Path) -> None:
    bucket, prefix = s3area
    ours, theirs = both(s3server, bucket, prefix, list_page_size=2)
    for n, key in enumerate(ODD_KEYS):
        theirs.put_bytes(key, os.urandom(n * 1000 + 1))
    assert list(ours.list("")) == list(theirs.list(""))  # four pages
    assert [o.key for o in ours.list("")] == sorted(ODD_KEYS)
    assert [(o.modified, o.storage_class) for o in ours.list("")] == [
        (o.modified, o.storage_class) for o in theirs.list("")]
    assert list(ours.list("é/")) == list(theirs.list("é/")) != []
    for key in ODD_KEYS:
        data = theirs.get_bytes(key)
        assert ours.get_bytes(key) == data and ours.head(key) == theirs.head(key)
        for start, length in ((0, 1), (1, 5000), (len(data) - 1, 10), (len(data), 3)):
            assert ours.get_range(key, start, length) == theirs.get_range(key, start, length)
        buffer = bytearray(7)
        assert ours.get_range_into(key, 0, memoryview(buffer)) == min(7, len(data))
        assert bytes(buffer[:len(data)]) == data[:7]
        with open(tmp_path / "f", "wb+") as f:
            assert ours.get_range_to_file(key, 0, len(data) + 5, f.fileno(), 3) == len(data)
            f.seek(3)
            assert f.read() == data
    assert ours.head("no/such") is None and theirs.head("no/such") is None


def _failure(call: Any) -> tuple[type[BaseException], str]:
    with pytest.raises(CkptdrainError) as err:
        call()
    return type(err.value), str(err.value)


def test_failures_are_named_as_botocores(s3server: S3Server, s3area: tuple[str, str]) -> None:
    bucket, prefix = s3area
    cases = {
        "missing key": (dict(bucket=bucket, prefix=prefix), lambda s: s.get_bytes("none"),
                        ObjectMissing),
        "missing key, ranged": (dict(bucket=bucket, prefix=prefix),
                                lambda s: s.get_range("none", 0, 5), ObjectMissing),
        "missing bucket": (dict(bucket=f"no-{uuid.uuid4().hex[:8]}", prefix=""),
                           lambda s: list(s.list("")), BucketMissing),
        "wrong secret": (dict(bucket=bucket, prefix=prefix, secret_key="wrong"),
                         lambda s: list(s.list("")), StoreAccessDenied),
        "nobody listening": (dict(bucket=bucket, prefix=prefix,
                                  endpoint_url=f"http://127.0.0.1:{free_port()}"),
                             lambda s: s.get_bytes("k"), StoreUnreachable),
    }
    for name, (where, call, expected) in cases.items():
        found = []
        for reads in (False, True):
            store = S3Store(where["bucket"], where["prefix"],
                            endpoint_url=where.get("endpoint_url", s3server.endpoint_url),
                            region=s3server.region, access_key=s3server.access_key,
                            secret_key=where.get("secret_key", s3server.secret_key),
                            gate=ThrottleGate(), max_attempts=2, connect_timeout=2,
                            botocore_reads=reads)
            assert (store._reader is None) == reads
            found.append(_failure(lambda store=store, call=call: call(store)))
        assert found[0] == found[1], name
        assert found[0][0] is expected, name


# -- web identity (IRSA): botocore's chain, a real exchange --------------------------
class FakeSts:
    """STS's AssumeRoleWithWebIdentity on localhost: it records what it was
    asked and answers with credentials the S3 server really issued."""

    def __init__(self, credentials: dict[str, Any]) -> None:
        self.asked: list[dict[str, list[str]]] = []
        sts = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                sts.asked.append(form)
                body = (
                    "<AssumeRoleWithWebIdentityResponse xmlns="
                    "'https://sts.amazonaws.com/doc/2011-06-15/'>"
                    "<AssumeRoleWithWebIdentityResult><Credentials>"
                    f"<AccessKeyId>{credentials['AccessKeyId']}</AccessKeyId>"
                    f"<SecretAccessKey>{credentials['SecretAccessKey']}</SecretAccessKey>"
                    f"<SessionToken>{credentials['SessionToken']}</SessionToken>"
                    "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                    "<SubjectFromWebIdentityToken>system:serviceaccount:ml:trainer"
                    "</SubjectFromWebIdentityToken><AssumedRoleUser><AssumedRoleId>AROA:r"
                    "</AssumedRoleId><Arn>arn:aws:sts::123456789012:assumed-role/restore/r"
                    "</Arn></AssumedRoleUser></AssumeRoleWithWebIdentityResult>"
                    "</AssumeRoleWithWebIdentityResponse>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def minio_area(minio: S3Server) -> Iterator[tuple[str, str]]:
    """(bucket, prefix) on MinIO, this test's alone, removed after."""
    bucket = minio.create_bucket()
    yield bucket, "area"
    minio.delete_bucket(bucket)


@pytest.fixture
def irsa(minio: S3Server, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeSts, str]]:
    """A pod's IRSA environment: a projected token file and a role ARN, no
    keys; STS answers with temporary credentials MinIO issued."""
    sts_client = botocore.session.get_session().create_client(
        "sts", endpoint_url=minio.endpoint_url, region_name=minio.region,
        aws_access_key_id=minio.access_key, aws_secret_access_key=minio.secret_key)
    issued = sts_client.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx",
                                    RoleSessionName="restore")["Credentials"]
    sts = FakeSts(issued)
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.projected.token")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/restore")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", minio.region)
    yield sts, token.read_text()
    sts.server.shutdown()


def test_web_identity_resolves_through_botocores_chain_and_reads(
        minio: S3Server, minio_area: tuple[str, str], irsa: tuple[FakeSts, str]) -> None:
    bucket, prefix = minio_area
    minio.open_store(bucket, prefix).put_bytes("k", b"restored")
    sts, token = irsa
    store = open_store(f"s3://{bucket}/{prefix}", endpoint_url=minio.endpoint_url)
    assert isinstance(store, S3Store) and store._reader is None  # botocore's chain
    assert store.get_bytes("k") == b"restored"
    assert [o.key for o in store.list("")] == ["k"]
    assert len(sts.asked) == 1
    asked = sts.asked[0]
    assert asked["Action"] == ["AssumeRoleWithWebIdentity"]
    assert asked["WebIdentityToken"] == [token]
    assert asked["RoleArn"] == ["arn:aws:iam::123456789012:role/restore"]


def test_keys_in_the_environment_come_before_web_identity_as_in_botocore(
        minio: S3Server, minio_area: tuple[str, str], irsa: tuple[FakeSts, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    bucket, prefix = minio_area
    minio.open_store(bucket, prefix).put_bytes("k", b"keys")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    store = open_store(f"s3://{bucket}/{prefix}", endpoint_url=minio.endpoint_url)
    assert isinstance(store, S3Store) and store._reader is not None
    assert store.get_bytes("k") == b"keys"
    assert botocore.session.get_session().get_credentials().method == "env"
    assert irsa[0].asked == []


# -- what a restore loads ---------------------------------------------------------
_PULL = """
import json, sys
from ckptdrain.cli import main
code = main(["pull", sys.argv[1], sys.argv[2], "-q"])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0]
      in ("urllib3", "boto3") or m in ("botocore.client", "botocore.session"))}))
"""


@pytest.mark.parametrize("config_file", [False, True])
def test_a_pull_with_static_keys_loads_no_botocore_client(
        minio: S3Server, minio_area: tuple[str, str], tmp_path: Path,
        config_file: bool) -> None:
    bucket, prefix = minio_area
    src = tmp_path / "step-3"
    src.mkdir()
    (src / "one").write_bytes(b"x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=minio.access_key, AWS_SECRET_ACCESS_KEY=minio.secret_key,
               CKPTDRAIN_S3_ENDPOINT=minio.endpoint_url, HOME=str(tmp_path),
               PYTHONPATH=str(ROOT / "operator"))
    if config_file:  # settings botocore would read: its client sends, as before
        (tmp_path / "aws-config").write_text("[default]\n")
        env["AWS_CONFIG_FILE"] = str(tmp_path / "aws-config")
    uri = f"s3://{bucket}/{prefix}"
    subprocess.run([sys.executable, "-m", "ckptdrain", "push", str(src), uri, "-q",
                    "--journal", str(tmp_path / "j")], env=env, check=True)
    run = subprocess.run([sys.executable, "-c", _PULL, uri, str(tmp_path / "out")], env=env,
                         check=True, capture_output=True, text=True)
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["code"] == 0 and (tmp_path / "out" / "one").read_bytes() == b"x"
    if config_file:
        assert "botocore.client" in found["loaded"]
    else:
        assert found["loaded"] == []
