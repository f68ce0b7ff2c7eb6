"""Storage URIs, and the local store's refusal of keys that would escape its root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.errors import IntegrityError, InvalidInput, StoreError, UnsafePath
from ckptdrain.paths import check_key
from ckptdrain.store import StoreURI, endpoint_from_env, open_store, parse_store_uri
from ckptdrain.store.base import Store
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///data/ckpt", StoreURI("file", path="/data/ckpt")),
        ("file:///data//ckpt/", StoreURI("file", path="/data/ckpt")),
        ("file://localhost/data", StoreURI("file", path="/data")),
        ("file:///", StoreURI("file", path="/")),
        ("s3://my-bucket", StoreURI("s3", bucket="my-bucket")),
        ("s3://my-bucket/", StoreURI("s3", bucket="my-bucket")),
        ("s3://my.bucket-1/team/run/", StoreURI("s3", bucket="my.bucket-1", prefix="team/run")),
        ("S3://abc/x", StoreURI("s3", bucket="abc", prefix="x")),
    ],
)
def test_parse_valid(uri: str, expected: StoreURI) -> None:
    assert parse_store_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("", "file:///absolute/path"),
        ("   ", "file:///absolute/path"),
        ("/data/ckpt", "file:///absolute/path"),
        ("file:data/ckpt", "file:///absolute/path"),
        ("file://data/ckpt", "three slashes"),
        ("file:///data/../etc", "'..'"),
        ("file:///data/./x", "'.'"),
        ("s3://", "bucket name"),
        ("s3:///prefix", "bucket name"),
        ("s3://ab", "3-63"),
        ("s3://Upper-Case", "lowercase"),
        ("s3://bucket_underscore", "lowercase"),
        ("s3://-bucket", "starting and ending"),
        ("s3://a..b", "3-63"),
        ("s3://192.168.1.10", "3-63"),
        ("s3://host:9000/bucket", "endpoint_url"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/a//b", "empty components"),
        ("s3://bucket/x?versionId=1", "query"),
        ("s3://bucket/x#frag", "fragment"),
        ("s3a://bucket/x", "s3://"),
        ("gs://", "bucket name"),
        ("gs://ab", "GCS bucket name"),
        ("gs://Upper", "GCS bucket name"),
        ("gs://google-x", "GCS bucket name"),
        ("gs://" + "a" * 64, "GCS bucket name"),
        ("gs://host:4443/b", "storage.endpoint"),
        ("gs://bucket/a/../b", "'..'"),
        ("gcs://bucket/x", "gs://bucket"),
        ("http://example.com/x", "s3://bucket"),
        (" s3://bucket", "whitespace"),
        ("s3://bucket/a\nb", "control"),
    ],
)
def test_parse_refuses_with_a_message_naming_the_field(uri: str, says: str) -> None:
    with pytest.raises(InvalidInput) as excinfo:
        parse_store_uri(uri)
    assert excinfo.value.field == "uri"
    assert str(excinfo.value).startswith("uri: expected ")
    assert says in str(excinfo.value)


def test_parse_never_echoes_credentials() -> None:
    with pytest.raises(InvalidInput) as excinfo:
        parse_store_uri("s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/x")
    message = str(excinfo.value)
    assert "wJalrXUtnFEMIsecret" not in message and "AKIAEXAMPLE" not in message
    assert "credentials" in message


def test_endpoint_from_env_precedence() -> None:
    env = {"AWS_ENDPOINT_URL": "http://c", "AWS_ENDPOINT_URL_S3": "http://b"}
    assert endpoint_from_env(env) == "http://b"
    assert endpoint_from_env({**env, "CKPTDRAIN_S3_ENDPOINT": "http://a"}) == "http://a"
    assert endpoint_from_env({"AWS_ENDPOINT_URL": "http://c"}) == "http://c"
    assert endpoint_from_env({"AWS_ENDPOINT_URL": "  "}) is None
    assert endpoint_from_env({}) is None


def test_open_store_picks_the_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = open_store(f"file://{tmp_path}/store")
    assert isinstance(local, LocalStore) and (tmp_path / "store").is_dir()
    assert local.uri == f"file://{tmp_path}/store"
    for name in ("CKPTDRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-env:9000")
    remote = open_store("s3://bucket/pre/fix", region="eu-west-1")
    assert isinstance(remote, S3Store)
    assert (remote.bucket, remote.prefix, remote.uri) == (
        "bucket",
        "pre/fix",
        "s3://bucket/pre/fix",
    )
    assert remote.endpoint == "http://from-env:9000"
    explicit = open_store("s3://bucket", endpoint_url="http://explicit:1")
    assert isinstance(explicit, S3Store) and explicit.endpoint == "http://explicit:1"


# Key safety ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    [
        "",
        "/etc/passwd",
        "../outside",
        "a/../../outside",
        "a/./b",
        "a//b",
        "a/",
        "nul\x00byte",
        "back\\slash",
        ".ckptdrain-multipart/x",
        "a/.ckptdrain-tmp-123",
        "x" * 1025,
    ],
)
def test_unsafe_keys_are_refused(key: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    with pytest.raises(UnsafePath):
        check_key(key)
    with pytest.raises(UnsafePath):
        store.put_bytes(key, b"x")
    with pytest.raises(UnsafePath):
        store.head(key)
    with pytest.raises(UnsafePath):
        store.create_multipart(key)


@pytest.mark.parametrize("key", ["a", "a/b/c", "..a", "a..", ".hidden", "ü/日本", "a b/c"])
def test_ordinary_keys_are_accepted(key: str, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    store.put_bytes(key, b"x")
    assert [o.key for o in store.list("")] == [key]


_hostile_components = st.sampled_from(
    ["..", ".", "", "a", "b.c", "..a", ".ckptdrain-tmp-1", "/", "\\", "\x00", "~", "%2e%2e"]
)
_hostile_keys = st.one_of(
    st.lists(_hostile_components, min_size=1, max_size=6).map("/".join),
    st.lists(_hostile_components, min_size=1, max_size=6).map("".join),
    st.text(alphabet="./\\\x00ab~", max_size=20),
)


# No deadline: each example fsyncs, which is slow on a loaded CI machine.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=_hostile_keys)
def test_no_key_escapes_the_root(key: str, tmp_path: Path) -> None:
    """Whatever the key, a write is refused or lands inside the root and lists back."""
    outer = tmp_path / "outer"
    root = outer / "root"
    store = LocalStore(root)
    try:
        store.put_bytes(key, b"payload")
    except UnsafePath:
        return
    except StoreError:  # e.g. 'a' then 'a/b': allowed to fail, not to escape
        return
    finally:
        escaped = [p for p in outer.rglob("*") if root not in (p, *p.parents)]
        assert escaped == [], f"{key!r} wrote outside the root: {escaped}"
    assert store.get_bytes(key) == b"payload"
    assert key in [o.key for o in store.list("")]
    store.delete(key)


def test_upload_ids_are_not_paths(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    (tmp_path / "victim").mkdir()
    for upload_id in ("../../victim", "/tmp", "", "x" * 32, "0" * 31):
        assert store.list_parts("k", upload_id) is None
        store.abort_multipart("k", upload_id)
    assert (tmp_path / "victim").is_dir()


def test_an_upload_answers_only_for_its_own_key(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    upload = store.create_multipart("a")
    assert store.list_parts("a", upload) == []
    assert store.list_parts("b", upload) is None


def test_a_part_without_its_etag_is_not_reported(tmp_path: Path) -> None:
    """A crash between writing a part and its etag leaves it unlisted (re-sent)."""
    store = LocalStore(tmp_path / "root")
    upload = store.create_multipart("k")
    store.upload_part("k", upload, 1, b"one")
    store.upload_part("k", upload, 2, b"two")
    os.unlink(tmp_path / "root" / ".ckptdrain-multipart" / upload / "00002.etag")
    assert [p.number for p in store.list_parts("k", upload) or []] == [1]


def test_min_part_size_is_enforced_when_asked(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root", min_part_size=10)
    upload = store.create_multipart("k")
    parts = [store.upload_part("k", upload, 1, b"short"), store.upload_part("k", upload, 2, b"x")]
    with pytest.raises(IntegrityError, match="min_part_size"):
        store.complete_multipart("k", upload, parts)
    assert LocalStore(tmp_path / "other").min_part_size == 1


def test_leftovers_of_a_crash_never_list(tmp_path: Path) -> None:
    """A temp file or upload directory left by a killed process stays hidden."""
    store = LocalStore(tmp_path / "root")
    store.put_bytes("ckpt/a", b"a")
    (tmp_path / "root" / "ckpt" / ".ckptdrain-tmp-deadbeef").write_bytes(b"half")
    upload = store.create_multipart("ckpt/b")
    store.upload_part("ckpt/b", upload, 1, b"part")
    assert [o.key for o in store.list("")] == ["ckpt/a"]
    assert [o.key for o in store.list("ckpt/.ckptdrain")] == []
    assert isinstance(store, Store)


@pytest.mark.parametrize(("uri", "bucket", "prefix"), [
    ("gs://ckpt_bucket/runs/a", "ckpt_bucket", "runs/a"),
    ("gs://my.dotted.bucket", "my.dotted.bucket", ""),
    ("gs://b-1/", "b-1", ""),
])
def test_gs_uris_name_a_bucket_and_prefix(uri: str, bucket: str, prefix: str) -> None:
    parsed = parse_store_uri(uri)
    assert (parsed.scheme, parsed.bucket, parsed.prefix) == ("gs", bucket, prefix)
