"""store/gcs_auth.py: Application Default Credentials without a Google
library. Google's token endpoint and metadata server are played by local
HTTP servers that check what the real ones check (the JWT's RS256 signature
against the key's public half, the Metadata-Flavor header)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ckptdrain.errors import InvalidInput, StoreAccessDenied, StoreUnreachable
from ckptdrain.store import gcs_auth

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption()).decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Google(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []
    issued: ClassVar[int] = 0
    refuse: ClassVar[bool] = False  # as a metadata address off Google Cloud may answer

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _token(self) -> None:
        type(self).issued += 1
        self._answer(200, {"access_token": f"tok-{self.issued}", "expires_in": 3599,
                           "token_type": "Bearer"})

    def do_GET(self) -> None:
        type(self).seen.append({"path": self.path, "flavor": self.headers.get("Metadata-Flavor")})
        if self.path != gcs_auth.METADATA_PATH or self.headers.get("Metadata-Flavor") != "Google" \
                or self.refuse:
            self._answer(403, {"error": "missing Metadata-Flavor"})
            return
        self._token()

    def do_POST(self) -> None:
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        type(self).seen.append({"path": self.path, "form": form})
        if form.get("grant_type") == ["refresh_token"]:
            ok = form.get("refresh_token") == ["r-1"] and form.get("client_secret") == ["cs"]
            self._token() if ok else self._answer(400, {"error": "invalid_grant"})
            return
        header, claims, signature = form["assertion"][0].split(".")
        try:
            KEY.public_key().verify(_unb64(signature), f"{header}.{claims}".encode(),
                                    padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            self._answer(400, {"error": "invalid_grant"})
            return
        body = json.loads(_unb64(claims))
        if body["aud"] != f"http://127.0.0.1:{self.server.server_address[1]}/token" or \
                body["scope"] != gcs_auth.SCOPE or body["exp"] - body["iat"] != 3600:
            self._answer(400, {"error": "invalid_grant"})
            return
        self._token()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def google() -> Iterator[str]:
    _Google.seen.clear()
    _Google.issued = 0
    _Google.refuse = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Google)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _key_file(tmp_path: Path, **key: Any) -> str:
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    return str(path)


def test_a_service_account_key_signs_a_jwt_the_token_endpoint_accepts(
        google: str, tmp_path: Path) -> None:
    path = _key_file(tmp_path, type="service_account", client_email="sa@p.iam.gserviceaccount.com",
                     private_key=PEM, private_key_id="k1", token_uri=f"http://{google}/token")
    source = gcs_auth.default_credentials({gcs_auth.CREDENTIALS_ENV: path, "HOME": str(tmp_path)})
    assert source.header() == {"Authorization": "Bearer tok-1"}
    assert source.header() == {"Authorization": "Bearer tok-1"}  # kept until it nearly expires
    source.forget()
    assert source.header() == {"Authorization": "Bearer tok-2"}
    assert [s["path"] for s in _Google.seen] == ["/token", "/token"]


def test_a_token_is_renewed_a_minute_before_it_expires(google: str, tmp_path: Path) -> None:
    now = [1000.0]
    path = _key_file(tmp_path, type="authorized_user", client_id="c", client_secret="cs",
                     refresh_token="r-1", token_uri=f"http://{google}/token")
    source = gcs_auth.default_credentials({gcs_auth.CREDENTIALS_ENV: path},
                                          clock=lambda: now[0])
    assert source.header()["Authorization"] == "Bearer tok-1"
    now[0] += 3599 - 61
    assert source.header()["Authorization"] == "Bearer tok-1"
    now[0] += 2
    assert source.header()["Authorization"] == "Bearer tok-2"


def test_gclouds_file_comes_before_the_metadata_server(google: str, tmp_path: Path) -> None:
    config = tmp_path / "gcloud"
    config.mkdir()
    (config / "application_default_credentials.json").write_text(json.dumps({
        "type": "authorized_user", "client_id": "c", "client_secret": "cs",
        "refresh_token": "r-1", "token_uri": f"http://{google}/token"}))
    source = gcs_auth.default_credentials({"CLOUDSDK_CONFIG": str(config),
                                           "GCE_METADATA_HOST": google})
    assert source.header()["Authorization"] == "Bearer tok-1"
    assert [s["path"] for s in _Google.seen] == ["/token"]


def test_without_a_key_the_metadata_server_is_asked_with_its_header(
        google: str, tmp_path: Path) -> None:
    source = gcs_auth.default_credentials({"HOME": str(tmp_path), "GCE_METADATA_HOST": google})
    assert source.header()["Authorization"] == "Bearer tok-1"
    assert _Google.seen == [{"path": gcs_auth.METADATA_PATH, "flavor": "Google"}]


def test_no_metadata_server_says_what_to_set(tmp_path: Path) -> None:
    source = gcs_auth.default_credentials({"HOME": str(tmp_path),
                                           "GCE_METADATA_HOST": "127.0.0.1:9"})
    with pytest.raises(StoreUnreachable, match="Workload Identity"):  # retried, not fatal
        source.header()


def test_a_metadata_address_that_refuses_says_what_to_set(google: str, tmp_path: Path) -> None:
    _Google.refuse = True
    source = gcs_auth.default_credentials({"HOME": str(tmp_path), "GCE_METADATA_HOST": google})
    with pytest.raises(StoreAccessDenied, match=r"HTTP 403.*set GOOGLE_APPLICATION_CREDENTIALS"):
        source.header()


def test_a_refused_token_request_never_shows_the_secret(google: str, tmp_path: Path) -> None:
    path = _key_file(tmp_path, type="authorized_user", client_id="c", client_secret="cs",
                     refresh_token="very-secret-refresh", token_uri=f"http://{google}/token")
    source = gcs_auth.default_credentials({gcs_auth.CREDENTIALS_ENV: path})
    with pytest.raises(StoreAccessDenied) as err:
        source.header()
    assert "HTTP 400" in str(err.value) and "very-secret-refresh" not in str(err.value)


@pytest.mark.parametrize(("key", "says"), [
    ({"type": "external_account"}, "service_account or authorized_user"),
    ({"type": "service_account", "client_email": "x"}, "client_email and private_key"),
    ({"type": "authorized_user", "client_id": "c"}, "refresh_token"),
])
def test_key_files_that_cannot_be_used_are_refused_naming_the_variable(
        tmp_path: Path, key: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        gcs_auth.default_credentials({gcs_auth.CREDENTIALS_ENV: _key_file(tmp_path, **key)})
    assert err.value.field == gcs_auth.CREDENTIALS_ENV and says in str(err.value)


def test_a_key_that_is_not_a_pem_rsa_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = _key_file(tmp_path, type="service_account", client_email="sa@x",
                     private_key="-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----",
                     token_uri="http://127.0.0.1:9/token")
    source = gcs_auth.default_credentials({gcs_auth.CREDENTIALS_ENV: path})
    with pytest.raises(InvalidInput) as err:
        source.header()
    assert "c2VjcmV0" not in str(err.value)


def test_a_token_of_short_life_is_not_fetched_on_every_request() -> None:
    now = [0.0]
    issued = []

    def fetch() -> gcs_auth.Token:
        issued.append(1)
        return gcs_auth._token({"access_token": f"t{len(issued)}", "expires_in": 30},
                               lambda: now[0])

    source = gcs_auth.TokenSource(fetch, clock=lambda: now[0])
    source.header()
    now[0] = 10.0
    source.header()
    assert len(issued) == 1  # renewed at half its life, not a minute before it
    now[0] = 16.0
    source.header()
    assert len(issued) == 2
    assert "t2" not in repr(gcs_auth.Token("t2", 1.0))
