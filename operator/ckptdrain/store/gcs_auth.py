"""Access tokens for the gs:// store: Google's Application Default
Credentials, with no Google library.

In the order ADC looks:

1. `GOOGLE_APPLICATION_CREDENTIALS`, the path of a JSON key file: a
   service account's key (a JWT signed with its RSA key, exchanged at its
   `token_uri`) or a user's (`authorized_user`: a refresh token);
2. gcloud's `application_default_credentials.json` in
   `$CLOUDSDK_CONFIG` or `~/.config/gcloud`;
3. the metadata server (`GCE_METADATA_HOST`, default 169.254.169.254): on
   GKE with Workload Identity it answers for the pod's Kubernetes service
   account, so no key exists anywhere.

Other key file types (workload identity federation, an impersonation key
file) are refused naming the variable.

With `CKPTDRAIN_GOOGLE_SERVICE_ACCOUNT` set (admission sets it from the
policy's class, spec.identity.googleServiceAccount), the credentials above
are only the source: their token asks the IAM Credentials API
(`generateAccessToken`, at IAM_CREDENTIALS, never anywhere a policy or the
environment could name) for a token of that service account, and the store
uses that one. The pod's own identity needs
roles/iam.serviceAccountTokenCreator on the account (docs/cloud/gke.md),
and a token with the cloud-platform scope (a key file's is asked for it).

A token is kept until a minute before it expires, one per store, shared by
its threads. Tokens, keys and refresh tokens are never put in a message or
a log.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3

from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput, StoreAccessDenied, StoreUnreachable

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
#: What a source token needs for IAM Credentials' generateAccessToken: a
#: key file's is asked for it when impersonating (a VM's scopes are its own).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"
METADATA_HOST = "169.254.169.254"
METADATA_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
#: Renew this long before the token says it expires.
EARLY_S = 60.0
JWT_LIFETIME_S = 3600
#: Where a service account's token is asked for: Google's, fixed, so that
#: no policy or environment can send the source token elsewhere.
IAM_CREDENTIALS = "https://iamcredentials.googleapis.com"
IMPERSONATE_ENV = Env.GOOGLE_SERVICE_ACCOUNT.value
#: What the request path may hold of an account: an email, nothing that
#: would change the path or query.
_ACCOUNT = re.compile(r"[a-z0-9][-a-z0-9.]*@[a-z0-9][-a-z0-9.]*", re.ASCII)


@dataclass(frozen=True)
class Token:
    value: str = field(repr=False)
    expires_at: float = 0.0  # monotonic seconds
    #: Renew this long before it expires (a minute, or half a shorter life).
    early: float = EARLY_S


Fetch = Callable[[], Token]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_jwt(key: Mapping[str, Any], now: float, scope: str = SCOPE) -> str:
    """The assertion a service account's key signs to ask for a token of
    `scope` (RS256)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    header = {"alg": "RS256", "typ": "JWT"}
    if key.get("private_key_id"):
        header["kid"] = str(key["private_key_id"])
    claims = {"iss": key["client_email"], "scope": scope,
              "aud": key.get("token_uri") or DEFAULT_TOKEN_URI,
              "iat": int(now), "exp": int(now) + JWT_LIFETIME_S}
    signing_input = (_b64url(json.dumps(header, separators=(",", ":")).encode()) + "."
                     + _b64url(json.dumps(claims, separators=(",", ":")).encode()))
    try:
        private = serialization.load_pem_private_key(str(key["private_key"]).encode(), None)
    except (ValueError, TypeError):
        raise InvalidInput(CREDENTIALS_ENV, "a key file whose private_key is a PEM RSA key",
                           "(unreadable key)") from None
    if not isinstance(private, rsa.RSAPrivateKey):
        raise InvalidInput(CREDENTIALS_ENV, "a key file with an RSA private_key", "(not RSA)")
    signature = private.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64url(signature)


class TokenSource:
    """One store's access token, fetched by `fetch` and kept until it nearly
    expires. `account`: the service account impersonated, if any (it holds
    the bucket roles, so a refusal names it)."""

    def __init__(self, fetch: Fetch, clock: Callable[[], float] = time.monotonic, *,
                 account: str | None = None) -> None:
        self.account = account
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._token: Token | None = None

    def header(self) -> dict[str, str]:
        with self._lock:
            if self._token is None or self._clock() >= self._token.expires_at - self._token.early:
                self._token = self._fetch()
            return {"Authorization": f"Bearer {self._token.value}"}

    def forget(self) -> None:
        """Drop the token (the store answered 401: fetch a new one next time)."""
        with self._lock:
            self._token = None


def _post_form(http: urllib3.PoolManager, url: str, form: dict[str, str],
               what: str) -> dict[str, Any]:
    try:
        response = http.request("POST", url, body=urlencode(form),
                                headers={"Content-Type": "application/x-www-form-urlencoded"},
                                timeout=urllib3.Timeout(connect=10, read=30), retries=False)
    except urllib3.exceptions.HTTPError as err:
        raise StoreUnreachable(f"{what}: token endpoint {url} did not answer "
                               f"({type(err).__name__})") from None
    return _token_answer(response, what, url)


def _token_answer(response: urllib3.BaseHTTPResponse, what: str, url: str) -> dict[str, Any]:
    if response.status != 200:
        # The body may echo what was sent: say only the status.
        raise StoreAccessDenied(f"{what}: {url} refused the token request "
                                f"(HTTP {response.status})")
    try:
        answer = json.loads(response.data)
        str(answer["access_token"])
    except (ValueError, KeyError, TypeError):
        raise StoreAccessDenied(f"{what}: {url} answered without an access token") from None
    return dict(answer)


def _token(answer: Mapping[str, Any], clock: Callable[[], float]) -> Token:
    try:
        life = max(0.0, float(answer.get("expires_in", 3600)))
    except (TypeError, ValueError):
        life = 3600.0
    return Token(str(answer["access_token"]), clock() + life, min(EARLY_S, life / 2))


def _from_key_file(path: Path, http: urllib3.PoolManager, field: str,
                   clock: Callable[[], float], scope: str) -> Fetch:
    try:
        key = json.loads(path.read_text())
    except (OSError, ValueError):
        raise InvalidInput(field, "the path of a readable JSON key file", str(path)) from None
    kind = key.get("type") if isinstance(key, dict) else None
    if kind == "service_account":
        if not all(isinstance(key.get(k), str) for k in ("client_email", "private_key")):
            raise InvalidInput(field, "a service account key with client_email and "
                               "private_key", str(path))
        url = key.get("token_uri") or DEFAULT_TOKEN_URI

        def service_account() -> Token:
            form = {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                    "assertion": signed_jwt(key, time.time(), scope)}
            return _token(_post_form(http, url, form, f"service account {key['client_email']}"),
                          clock)
        return service_account
    if kind == "authorized_user":
        if not all(isinstance(key.get(k), str)
                   for k in ("client_id", "client_secret", "refresh_token")):
            raise InvalidInput(field, "an authorized_user file with client_id, client_secret "
                               "and refresh_token", str(path))
        url = key.get("token_uri") or DEFAULT_TOKEN_URI

        def user() -> Token:
            form = {"grant_type": "refresh_token", "client_id": key["client_id"],
                    "client_secret": key["client_secret"], "refresh_token": key["refresh_token"]}
            return _token(_post_form(http, url, form, "user credentials"), clock)
        return user
    raise InvalidInput(field, "a service_account or authorized_user key file (or none: the "
                       "metadata server, e.g. GKE Workload Identity)", f"type {kind!r}")


def _from_metadata(host: str, http: urllib3.PoolManager,
                   clock: Callable[[], float]) -> Fetch:
    url = f"http://{host}{METADATA_PATH}"

    def metadata() -> Token:
        try:
            response = http.request("GET", url, headers={"Metadata-Flavor": "Google"},
                                    timeout=urllib3.Timeout(connect=3, read=10), retries=False)
        except urllib3.exceptions.HTTPError as err:
            # Transient as far as we know: GKE's metadata server may not
            # answer for a moment as a pod starts. Retried like the store.
            raise StoreUnreachable(
                f"no Google credentials yet: {CREDENTIALS_ENV} is not set, there is no gcloud "
                f"application default credentials file, and the metadata server {host} did "
                f"not answer ({type(err).__name__}); on GKE enable Workload Identity for the "
                "pod's service account") from None
        if response.status >= 500:
            raise StoreUnreachable(f"metadata server {host} answered HTTP {response.status}; "
                                   "retried")
        try:
            return _token(_token_answer(response, "metadata server", url), clock)
        except StoreAccessDenied as err:
            # Off Google Cloud, something else may answer at the metadata
            # address: the fix is a key file, not the metadata server.
            raise StoreAccessDenied(
                f"no Google credentials: {CREDENTIALS_ENV} is not set, there is no gcloud "
                f"application default credentials file, and {err}; set {CREDENTIALS_ENV} "
                "to a key file or run `gcloud auth application-default login`") from None
    return metadata


def _expiry(answer: Mapping[str, Any], clock: Callable[[], float],
            wall: Callable[[], float]) -> Token:
    """The impersonated token, expiring when IAM says (RFC 3339 expireTime)."""
    try:
        expires = datetime.fromisoformat(str(answer["expireTime"])).timestamp()
        life = max(0.0, expires - wall())
    except (KeyError, ValueError):
        life = float(JWT_LIFETIME_S)
    return Token(str(answer["accessToken"]), clock() + life, min(EARLY_S, life / 2))


def impersonated(source: TokenSource, account: str, http: urllib3.PoolManager,
                 clock: Callable[[], float] = time.monotonic, *,
                 endpoint: str = IAM_CREDENTIALS,
                 wall: Callable[[], float] = time.time) -> Fetch:
    """Fetches `account`'s token with `source`'s (generateAccessToken).
    `endpoint` is for tests' stand-in server alone."""
    url = f"{endpoint}/v1/projects/-/serviceAccounts/{account}:generateAccessToken"
    what = f"impersonating Google service account {account}"

    def fetch() -> Token:
        headers = {**source.header(), "Content-Type": "application/json"}
        body = json.dumps({"scope": [SCOPE], "lifetime": f"{JWT_LIFETIME_S}s"})
        try:
            response = http.request("POST", url, body=body, headers=headers, retries=False,
                                    timeout=urllib3.Timeout(connect=10, read=30))
        except urllib3.exceptions.HTTPError as err:
            raise StoreUnreachable(f"{what}: {endpoint} did not answer "
                                   f"({type(err).__name__})") from None
        if response.status == 401:
            source.forget()  # the source token may be the stale one: fetched anew next time
        if response.status in (401, 403, 404):
            # The body may echo what was sent: say only the status.
            raise StoreAccessDenied(
                f"{what}: IAM Credentials refused (HTTP {response.status}); the pod's own "
                f"Google identity needs roles/iam.serviceAccountTokenCreator on {account}, "
                "and the account must exist; its token also needs the "
                f"{CLOUD_PLATFORM_SCOPE} scope, which a VM's or GKE node's access scopes "
                "may leave out")
        if response.status != 200:
            raise StoreUnreachable(f"{what}: IAM Credentials answered HTTP {response.status}; "
                                   "retried")
        try:
            answer = json.loads(response.data)
            return _expiry(answer, clock, wall)
        except (ValueError, KeyError, TypeError):
            raise StoreAccessDenied(f"{what}: IAM Credentials answered without an access "
                                    "token") from None
    return fetch


def default_credentials(environ: Mapping[str, str] | None = None,
                        http: urllib3.PoolManager | None = None,
                        clock: Callable[[], float] = time.monotonic, *,
                        iam_endpoint: str = IAM_CREDENTIALS) -> TokenSource:
    """A token source by Application Default Credentials, impersonating the
    service account CKPTDRAIN_GOOGLE_SERVICE_ACCOUNT names, if any
    (`iam_endpoint`: tests' stand-in for IAM Credentials). InvalidInput now
    for a key file or account that cannot be used; the metadata server is
    asked at first use."""
    env = os.environ if environ is None else environ
    http = http or urllib3.PoolManager(num_pools=2, maxsize=2)
    account = env.get(IMPERSONATE_ENV, "").strip()
    source = _adc(env, http, clock, CLOUD_PLATFORM_SCOPE if account else SCOPE)
    if not account:
        return source
    if not _ACCOUNT.fullmatch(account):
        raise InvalidInput(IMPERSONATE_ENV, "a Google service account email", account)
    return TokenSource(impersonated(source, account, http, clock, endpoint=iam_endpoint),
                       clock, account=account)


def _adc(env: Mapping[str, str], http: urllib3.PoolManager,
         clock: Callable[[], float], scope: str) -> TokenSource:
    """The Application Default Credentials, in the order ADC looks; a
    service account key's token is asked for `scope`."""
    named = env.get(CREDENTIALS_ENV, "").strip()
    if named:
        return TokenSource(_from_key_file(Path(named), http, CREDENTIALS_ENV, clock, scope), clock)
    config = env.get("CLOUDSDK_CONFIG", "").strip() or str(
        Path(env.get("HOME", "~")).expanduser() / ".config" / "gcloud")
    well_known = Path(config) / "application_default_credentials.json"
    if well_known.is_file():
        return TokenSource(_from_key_file(well_known, http, str(well_known), clock, scope), clock)
    host = env.get("GCE_METADATA_HOST", "").strip() or METADATA_HOST
    return TokenSource(_from_metadata(host, http, clock), clock)
