"""store/s3_read_settings.py: reads go around botocore only where botocore's
own default chain would answer with the same credentials, region and trust.

Every case is put to botocore itself (a real session over the same
environment and files): where our settings take credentials, botocore's
chain resolves the same ones from the environment; everywhere else (web
identity, profiles, files, expiring keys) ours step aside and botocore's
chain, resolved in its own order, is what the store uses."""

from __future__ import annotations

import os
from pathlib import Path

import botocore.httpsession
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import PartialCredentialsError

from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_read_settings import (
    DEFAULT_REGION,
    config_file,
    default_ca_file,
    read_settings,
)
from ckptdrain.store.sigv4 import Credentials

ENDPOINT = "http://127.0.0.1:9000"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAENV", "AWS_SECRET_ACCESS_KEY": "env-secret"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment with nothing of AWS in it: no variables, no files,
    no instance metadata to wait for."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def ours(environ: dict[str, str], **kw: object) -> Credentials | None:
    args: dict[str, object] = dict(bucket="bkt", endpoint_url=ENDPOINT, addressing="path",
                                   region=None, access_key=None, secret_key=None,
                                   session_token=None, ca_bundle=None,
                                   config_file_exists=Path(config_file(environ)).exists())
    args.update(kw)
    found = read_settings(environ, **args)  # type: ignore[arg-type]
    return None if found is None else found.credentials


def botocores(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[str, object]:
    """(method, credentials) botocore's default chain resolves from `env`."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        found = botocore.session.get_session().get_credentials()
    except PartialCredentialsError:
        return "error", None
    return ("none", None) if found is None else (found.method, found)


WEB_IDENTITY = {"AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/restore",
                "AWS_ROLE_SESSION_NAME": "ckptdrain"}

#: case -> (environment, whether reads go without botocore, the method by
#: which botocore's own chain resolves it).
CASES: dict[str, tuple[dict[str, str], bool, str]] = {
    "static keys (a Secret)": (KEYS, True, "env"),
    "static keys with a session token": ({**KEYS, "AWS_SESSION_TOKEN": "tok"}, True, "env"),
    # botocore reads it before AWS_SESSION_TOKEN (even empty): its to resolve.
    "the old token variable": ({**KEYS, "AWS_SECURITY_TOKEN": "old-tok"}, False, "env"),
    "both token variables": ({**KEYS, "AWS_SECURITY_TOKEN": "old-tok",
                              "AWS_SESSION_TOKEN": "tok"}, False, "env"),
    "keys and web identity: botocore takes the keys": ({**KEYS, **WEB_IDENTITY}, True, "env"),
    "web identity (IRSA)": (WEB_IDENTITY, False, "assume-role-with-web-identity"),
    "half a key pair": ({"AWS_ACCESS_KEY_ID": "AKIAENV"}, False, "error"),
    "keys that expire": ({**KEYS, "AWS_CREDENTIAL_EXPIRATION": "2099-01-01T00:00:00Z"},
                         False, "env"),
    "a profile in the config file": ({"AWS_PROFILE": "restore"}, False, "config-file"),
    # botocore still takes the keys; a config file may hold other settings.
    "a profile and keys": ({**KEYS, "AWS_PROFILE": "restore"}, False, "env"),
    "nothing": ({}, False, "none"),
}


@pytest.mark.parametrize("case", CASES)
def test_credentials_are_taken_only_where_botocores_chain_gives_the_same(
        home: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    env, taken, method = CASES[case]
    env = dict(env)
    if "AWS_ROLE_ARN" in env:
        token = home / "token"
        token.write_text("eyJ.web.identity")
        env["AWS_WEB_IDENTITY_TOKEN_FILE"] = str(token)
    if "AWS_PROFILE" in env:
        (home / ".aws").mkdir()
        (home / ".aws" / "config").write_text(
            "[profile restore]\naws_access_key_id = AKIAPROFILE\n"
            "aws_secret_access_key = profile-secret\nregion = eu-west-3\n")
    mine = ours(env)
    assert botocores(monkeypatch, env)[0] == method
    assert (mine is not None) == taken
    if mine is not None:
        frozen = botocores(monkeypatch, env)[1].get_frozen_credentials()  # type: ignore[attr-defined]
        assert (mine.access_key, mine.secret_key, mine.token) == (
            frozen.access_key, frozen.secret_key, frozen.token)


def test_web_identity_is_left_to_botocore_which_resolves_it(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = home / "token"
    token.write_text("eyJ.web.identity")
    env = {**WEB_IDENTITY, "AWS_WEB_IDENTITY_TOKEN_FILE": str(token)}
    assert ours(env) is None
    method, _ = botocores(monkeypatch, env)
    assert method == "assume-role-with-web-identity"
    store = S3Store("bkt", endpoint_url=ENDPOINT)
    assert store._reader is None  # every request botocore's, credentials from its chain
    creds = store._client._request_signer._credentials
    assert creds.method == "assume-role-with-web-identity"


def test_a_store_with_static_keys_reads_without_botocore(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    store = S3Store("bkt", endpoint_url=ENDPOINT)
    assert store._reader is not None and store._botocore is None
    assert store._reader.serves("get_object", {"Bucket": "bkt", "Key": "k", "Range": "b"})
    assert not store._reader.serves("head_object", {"Bucket": "b", "Key": "k",
                                                    "ChecksumMode": "ENABLED"})
    assert not store._reader.serves("put_object", {"Bucket": "b", "Key": "k"})


@pytest.mark.parametrize(("env", "kw"), [
    ({**KEYS, "HTTPS_PROXY": "http://proxy:3128"}, {}),
    ({**KEYS, "http_proxy": "http://proxy:3128"}, {}),
    ({**KEYS, "AWS_USE_FIPS_ENDPOINT": "true"}, {}),
    ({**KEYS, "AWS_USE_DUALSTACK_ENDPOINT": "true"}, {}),
    (KEYS, {"endpoint_url": None}),  # AWS itself: botocore's endpoint rules
    (KEYS, {"addressing": "auto"}),
    (KEYS, {"config_file_exists": True}),
    ({}, {"access_key": "AKIAGIVEN"}),  # half a pair given: botocore says what is wrong
    # Virtual hosts botocore would not use (it sends these by path):
    (KEYS, {"addressing": "virtual", "bucket": "a.b"}),
    (KEYS, {"addressing": "virtual", "bucket": "Bkt"}),
    (KEYS, {"addressing": "virtual", "bucket": "b_k"}),
    (KEYS, {"addressing": "virtual", "bucket": "-bk"}),
    (KEYS, {"addressing": "virtual", "endpoint_url": "https://s3.example", "bucket": "ab"}),
    (KEYS, {"addressing": "virtual", "endpoint_url": "http://10.0.0.5:9000"}),
    (KEYS, {"addressing": "virtual", "endpoint_url": "http://[::1]:9000"}),
])
def test_botocore_sends_where_its_answer_is_not_known(env: dict[str, str],
                                                      kw: dict[str, object]) -> None:
    assert read_settings(env, **{**dict(
        bucket="bkt", endpoint_url=ENDPOINT, addressing="path", region=None, access_key=None,
        secret_key=None, session_token=None, ca_bundle=None,
        config_file_exists=False), **kw}) is None  # type: ignore[arg-type]


def test_given_keys_come_before_the_environment() -> None:
    found = ours(KEYS, access_key="AKIAGIVEN", secret_key="given", session_token="t")
    assert found == Credentials("AKIAGIVEN", "given", "t")


@pytest.mark.parametrize(("region", "env"), [
    (None, {}), (None, {"AWS_DEFAULT_REGION": "eu-west-3"}),
    ("ap-south-1", {"AWS_DEFAULT_REGION": "eu-west-3"}),
    (None, {"AWS_REGION": "eu-north-1"}),  # botocore does not read it
])
def test_the_signing_region_is_botocores(home: Path, monkeypatch: pytest.MonkeyPatch,
                                         region: str | None, env: dict[str, str]) -> None:
    for name, value in {**KEYS, **env}.items():
        monkeypatch.setenv(name, value)
    client = botocore.session.get_session().create_client(
        "s3", region_name=region, endpoint_url=ENDPOINT,
        config=Config(s3={"addressing_style": "path"}))
    found = read_settings({**KEYS, **env}, bucket="bkt", endpoint_url=ENDPOINT, addressing="path",
                          region=region, access_key=None, secret_key=None,
                          session_token=None, ca_bundle=None, config_file_exists=False)
    assert found is not None and found.region == client.meta.region_name
    assert DEFAULT_REGION == "us-east-1"


def test_trust_is_the_stores_bundle_else_aws_ca_bundle_else_botocores_default() -> None:
    def ca(env: dict[str, str], bundle: str | None) -> str | None:
        found = read_settings({**KEYS, **env}, bucket="bkt", endpoint_url="https://s3.example",
                              addressing="path", region=None, access_key=None,
                              secret_key=None, session_token=None, ca_bundle=bundle,
                              config_file_exists=False)
        assert found is not None
        return found.ca_file

    assert ca({"AWS_CA_BUNDLE": "/env/ca.pem"}, "/policy/ca.pem") == "/policy/ca.pem"
    assert ca({"AWS_CA_BUNDLE": "/env/ca.pem"}, None) == "/env/ca.pem"
    assert ca({}, None) is None
    assert default_ca_file() == botocore.httpsession.get_cert_path(True)


def test_virtual_addressing_is_taken_for_a_dns_label_on_a_named_host() -> None:
    found = read_settings(KEYS, bucket="bkt-1", endpoint_url="https://s3.example",
                          addressing="virtual", region=None, access_key=None,
                          secret_key=None, session_token=None, ca_bundle=None,
                          config_file_exists=False)
    assert found is not None and found.virtual


def test_no_key_shows_in_a_repr() -> None:
    found = ours(KEYS, access_key="AKIAGIVEN", secret_key="given", session_token="t")
    settings = read_settings(KEYS, bucket="bkt", endpoint_url=ENDPOINT, addressing="path",
                             region=None, access_key="AKIAGIVEN", secret_key="given",
                             session_token="t", ca_bundle=None, config_file_exists=False)
    for text in (repr(found), repr(settings)):
        assert "AKIAGIVEN" not in text and "given" not in text and "'t'" not in text
