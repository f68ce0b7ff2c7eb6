"""store/gcs_auth.py with CKPTDRAIN_GOOGLE_SERVICE_ACCOUNT: the Application
Default Credentials' token asks IAM Credentials' generateAccessToken for
the named service account's, and the store uses that one. A local HTTP
server plays both the metadata server (the source) and IAM Credentials,
checking what the real ones check (the source token as the bearer, the
account in the path, the storage scope); it is reached only through the
keyword argument tests alone pass."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

import pytest
import urllib3
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ckptdrain.errors import InvalidInput, StoreAccessDenied, StoreUnreachable
from ckptdrain.store import gcs_auth

ACCOUNT = "ckpt-ml@my-project.iam.gserviceaccount.com"
PATH = f"/v1/projects/-/serviceAccounts/{ACCOUNT}:generateAccessToken"
#: The stand-in's wall clock (its expireTime is an hour after), a year ahead
#: of any real one: a test that hands in no wall clock sees a long-lived token.
NOW = 1_830_000_000.0


class _Google(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []
    jwt_scopes: ClassVar[list[str]] = []
    sources: ClassVar[int] = 0
    issued: ClassVar[int] = 0
    status: ClassVar[int] = 200  # what IAM answers
    life_s: ClassVar[int] = 3600

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # the metadata server: the pod's own identity
        if self.path != gcs_auth.METADATA_PATH or self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, {})
            return
        type(self).sources += 1
        self._answer(200, {"access_token": f"source-secret-{self.sources}", "expires_in": 7200})

    def do_POST(self) -> None:  # IAM Credentials, or a key file's token endpoint
        data = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/token":  # the key's JWT: what it asks for is kept
            [assertion] = parse_qs(data.decode())["assertion"]
            claims = assertion.split(".")[1]
            type(self).jwt_scopes.append(json.loads(
                base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["scope"])
            type(self).sources += 1
            self._answer(200, {"access_token": f"source-secret-{self.sources}",
                               "expires_in": 3600})
            return
        body = json.loads(data)
        type(self).seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                "body": body})
        if self.status != 200:
            # As Google's errors may: echoing what it was sent.
            self._answer(self.status, {"error": {"message": self.headers.get("Authorization")}})
            return
        if self.path != PATH or body.get("scope") != [gcs_auth.SCOPE] or not str(
                self.headers.get("Authorization")).startswith("Bearer source-secret-"):
            self._answer(400, {"error": "bad request"})
            return
        type(self).issued += 1
        expires = datetime.fromtimestamp(NOW + self.life_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._answer(200, {"accessToken": f"impersonated-{self.issued}", "expireTime": expires})

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def google() -> Iterator[str]:
    _Google.seen.clear()
    _Google.jwt_scopes.clear()
    _Google.sources = _Google.issued = 0
    _Google.status, _Google.life_s = 200, 3600
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Google)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _source(google: str, tmp_path: Path, account: str = ACCOUNT) -> gcs_auth.TokenSource:
    env = {"HOME": str(tmp_path), "GCE_METADATA_HOST": google,
           gcs_auth.IMPERSONATE_ENV: account}
    return gcs_auth.default_credentials(env, iam_endpoint=f"http://{google}")


def test_the_pods_token_is_exchanged_for_the_accounts(google: str, tmp_path: Path) -> None:
    source = _source(google, tmp_path)
    assert source.header() == {"Authorization": "Bearer impersonated-1"}
    [asked] = _Google.seen
    assert asked == {"path": PATH, "auth": "Bearer source-secret-1",
                     "body": {"scope": [gcs_auth.SCOPE], "lifetime": "3600s"}}


def test_the_accounts_token_is_kept_and_renewed_before_it_expires(
        google: str, tmp_path: Path) -> None:
    now = [500.0]
    pods = gcs_auth.default_credentials({"HOME": str(tmp_path), "GCE_METADATA_HOST": google},
                                        clock=lambda: now[0])
    source = gcs_auth.TokenSource(gcs_auth.impersonated(
        pods, ACCOUNT, urllib3.PoolManager(), lambda: now[0], endpoint=f"http://{google}",
        wall=lambda: NOW), lambda: now[0])
    assert source.header()["Authorization"] == "Bearer impersonated-1"
    now[0] += 3600 - 61
    assert source.header()["Authorization"] == "Bearer impersonated-1"
    assert _Google.issued == 1
    now[0] += 2  # within the last minute: a new one, on the same source token
    assert source.header()["Authorization"] == "Bearer impersonated-2"
    assert (_Google.issued, _Google.sources) == (2, 1)


def test_without_the_variable_nothing_is_impersonated(google: str, tmp_path: Path) -> None:
    source = gcs_auth.default_credentials({"HOME": str(tmp_path), "GCE_METADATA_HOST": google},
                                          iam_endpoint=f"http://{google}")
    assert source.header() == {"Authorization": "Bearer source-secret-1"}
    assert _Google.seen == []


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refusal_names_the_account_and_the_role_and_no_token(
        google: str, tmp_path: Path, status: int) -> None:
    _Google.status = status
    source = _source(google, tmp_path)
    with pytest.raises(StoreAccessDenied) as err:
        source.header()
    said = str(err.value)
    assert f"HTTP {status}" in said and ACCOUNT in said
    assert "roles/iam.serviceAccountTokenCreator" in said
    # A VM's (or node's) access scopes may leave the source token short of IAM.
    assert gcs_auth.CLOUD_PLATFORM_SCOPE in said and "access scopes" in said
    assert "secret" not in said and "Bearer" not in said


def test_a_401_fetches_a_new_source_token_next_time(google: str, tmp_path: Path) -> None:
    _Google.status = 401
    source = _source(google, tmp_path)
    with pytest.raises(StoreAccessDenied):
        source.header()
    _Google.status = 200
    assert source.header()["Authorization"] == "Bearer impersonated-1"
    assert [s["auth"] for s in _Google.seen] == ["Bearer source-secret-1",
                                                 "Bearer source-secret-2"]


def test_trouble_at_iam_is_retried_not_fatal(google: str, tmp_path: Path) -> None:
    _Google.status = 503
    with pytest.raises(StoreUnreachable, match=f"{ACCOUNT}.*HTTP 503"):
        _source(google, tmp_path).header()


@pytest.mark.parametrize("account", ["ckpt@x/../../evil", "ckpt@x?y=1", "not-an-email",
                                     "ckpt@x#frag"])
def test_an_account_that_would_change_the_request_is_refused_naming_the_variable(
        google: str, tmp_path: Path, account: str) -> None:
    with pytest.raises(InvalidInput) as err:
        _source(google, tmp_path, account=account)
    assert err.value.field == gcs_auth.IMPERSONATE_ENV


class _Recorder:
    """A PoolManager that records where it is sent and answers 403."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def request(self, method: str, url: str, **_: Any) -> Any:
        self.urls.append(url)
        return type("R", (), {"status": 403, "data": b"{}"})()


def test_only_googles_iam_credentials_is_ever_asked(tmp_path: Path) -> None:
    key = tmp_path / "adc.json"
    key.write_text(json.dumps({"type": "authorized_user", "client_id": "c",
                               "client_secret": "cs", "refresh_token": "r"}))
    http = _Recorder()
    source = gcs_auth.TokenSource(gcs_auth.impersonated(
        gcs_auth.TokenSource(lambda: gcs_auth.Token("src", 1e12)), ACCOUNT, http))  # type: ignore[arg-type]
    with pytest.raises(StoreAccessDenied):
        source.header()
    # Whatever else the environment says: the variables name no other host.
    env = {gcs_auth.CREDENTIALS_ENV: str(key), gcs_auth.IMPERSONATE_ENV: ACCOUNT,
           "CKPTDRAIN_IAM_ENDPOINT": "http://evil", "GOOGLE_API_ENDPOINT": "http://evil"}
    with pytest.raises(StoreAccessDenied):
        gcs_auth.default_credentials(env, http).header()  # type: ignore[arg-type]
    assert http.urls[0] == f"https://iamcredentials.googleapis.com{PATH}"
    assert http.urls[1] == gcs_auth.DEFAULT_TOKEN_URI  # the source, refused by the recorder


def test_the_store_takes_the_account_from_its_environment(tmp_path: Path) -> None:
    from ckptdrain.store.gcs import GcsStore

    env = {"HOME": str(tmp_path), "GCE_METADATA_HOST": "127.0.0.1:9",
           gcs_auth.IMPERSONATE_ENV: "ckpt@x/../evil"}
    with pytest.raises(InvalidInput) as err:
        GcsStore("bucket", "p", environ=env)
    assert err.value.field == gcs_auth.IMPERSONATE_ENV


class _Refusing:
    def request(self, method: str, url: str, **_: Any) -> Any:
        return type("R", (), {"status": 403, "data": b"{}", "headers": {},
                              "release_conn": lambda self: None})()


@pytest.mark.parametrize("account", [ACCOUNT, None])
def test_a_refusal_from_the_bucket_names_the_account_impersonated(account: str | None) -> None:
    # The impersonated account holds the bucket roles, not the pod's own.
    from ckptdrain.store.gcs import GcsStore

    tokens = gcs_auth.TokenSource(lambda: gcs_auth.Token("t", 1e12), account=account)
    store = GcsStore("bucket", "p", tokens=tokens, environ={})
    store._http = _Refusing()  # type: ignore[assignment]
    with pytest.raises(StoreAccessDenied) as err:
        store.head("k")
    said = str(err.value)
    assert "HTTP 403" in said and "bucket roles" in said
    assert (f"Google service account {ACCOUNT}" in said) == (account is not None)
    assert ("pod's Google service account" in said) == (account is None)


def test_the_impersonating_source_says_its_account(google: str, tmp_path: Path) -> None:
    assert _source(google, tmp_path).account == ACCOUNT
    plain = {"HOME": str(tmp_path), "GCE_METADATA_HOST": google}
    assert gcs_auth.default_credentials(plain).account is None


def _key_file(google: str, tmp_path: Path) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"type": "service_account", "private_key": pem,
                                "client_email": "source@p.iam.gserviceaccount.com",
                                "token_uri": f"http://{google}/token"}))
    return str(path)


def test_a_key_files_token_asks_for_cloud_platform_only_to_impersonate(
        google: str, tmp_path: Path) -> None:
    # generateAccessToken takes only a caller token with cloud-platform (or
    # iam) scope; without impersonation the key asks for storage alone.
    env = {"HOME": str(tmp_path), gcs_auth.CREDENTIALS_ENV: _key_file(google, tmp_path)}
    gcs_auth.default_credentials(env, iam_endpoint=f"http://{google}").header()
    assert _Google.jwt_scopes == [gcs_auth.SCOPE]
    impersonating = gcs_auth.default_credentials({**env, gcs_auth.IMPERSONATE_ENV: ACCOUNT},
                                                 iam_endpoint=f"http://{google}")
    assert impersonating.header() == {"Authorization": "Bearer impersonated-1"}
    assert _Google.jwt_scopes == [gcs_auth.SCOPE, gcs_auth.CLOUD_PLATFORM_SCOPE]
