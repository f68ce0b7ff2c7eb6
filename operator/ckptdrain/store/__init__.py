"""Object stores: parse a storage URI and open the matching adapter.

    file:///abs/path          a directory on a local or mounted filesystem
    s3://bucket[/prefix]      S3 or any S3-compatible endpoint
    gs://bucket[/prefix]      Google Cloud Storage (its JSON API, Application
                              Default Credentials)

`parse_store_uri` is pure (no I/O) so the webhook and the CLI can validate a
policy's URI before anything touches the network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from ckptdrain.errors import InvalidInput
from ckptdrain.store.base import ObjectInfo, Store, UploadedPart
from ckptdrain.store.endpoint import parse_endpoint

__all__ = [
    "ObjectInfo",
    "Store",
    "StoreURI",
    "UploadedPart",
    "endpoint_from_env",
    "open_store",
    "parse_store_uri",
]

_FIELD = "uri"
_EXPECTED = "file:///absolute/path, s3://bucket[/prefix] or gs://bucket[/prefix]"
# S3's bucket naming rules (the subset every S3-compatible server accepts).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IPV4_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
# GCS's: also '_', and up to 222 characters when dotted (63 per component).
_GCS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
# Environment variables that name a custom S3 endpoint, in precedence order.
ENDPOINT_ENV_VARS = ("CKPTDRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class StoreURI:
    """A parsed storage URI. For file: `path` is set; for s3: `bucket` and `prefix`."""

    scheme: Literal["file", "s3", "gs"]
    path: str = ""
    bucket: str = ""
    prefix: str = ""  # no leading or trailing '/'; "" means the bucket's root


def _redacted(uri: str) -> str:
    """The URI with any user:password@ part hidden, safe to put in a message."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@", r"\1***@", uri)


def parse_store_uri(uri: str) -> StoreURI:
    """Parse and validate a storage URI, or raise InvalidInput naming the field `uri`.

    Pure: no filesystem or network access. Never echoes credentials embedded
    in the URI.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise InvalidInput(_FIELD, _EXPECTED, uri)
    shown = _redacted(uri)
    if uri != uri.strip() or any(c in uri for c in "\x00\r\n\t"):
        raise InvalidInput(_FIELD, f"{_EXPECTED} without whitespace or control characters", shown)
    if "://" not in uri:
        raise InvalidInput(_FIELD, _EXPECTED, shown)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.query or parts.fragment or uri.endswith(("?", "#")):
        raise InvalidInput(_FIELD, f"{_EXPECTED} without '?query' or '#fragment'", shown)
    if "@" in parts.netloc:
        raise InvalidInput(
            _FIELD, f"{_EXPECTED} without credentials (use a secret reference)", shown
        )
    if scheme == "file":
        return _parse_file(parts.netloc, parts.path, shown)
    if scheme in ("s3", "s3a"):
        if scheme == "s3a":
            raise InvalidInput(_FIELD, "scheme s3:// (not s3a://)", shown)
        return _parse_s3(parts.netloc, parts.path, shown)
    if scheme == "gs":
        return _parse_gs(parts.netloc, parts.path, shown)
    raise InvalidInput(_FIELD, _EXPECTED, shown)


def _parse_file(netloc: str, path: str, shown: str) -> StoreURI:
    # file://data/x puts "data" in the host slot: almost always a typo for an
    # absolute path, so refuse it instead of silently dropping "data".
    if netloc not in ("", "localhost"):
        raise InvalidInput(_FIELD, "file:///absolute/path (three slashes)", shown)
    if not path.startswith("/"):
        raise InvalidInput(_FIELD, "file:///absolute/path", shown)
    components = path.split("/")
    if any(c in (".", "..") for c in components):
        raise InvalidInput(_FIELD, "file:///absolute/path without '.' or '..'", shown)
    normalized = "/" + "/".join(c for c in components if c)
    return StoreURI(scheme="file", path=normalized)


def _prefix(scheme: str, path: str, shown: str) -> str:
    components = [c for c in path.split("/") if c]
    if any(c in (".", "..") for c in components):
        raise InvalidInput(_FIELD, f"{scheme}://bucket/prefix without '.' or '..' components",
                           shown)
    if "//" in path.strip("/"):
        raise InvalidInput(_FIELD, f"{scheme}://bucket/prefix without empty components ('//')",
                           shown)
    return "/".join(components)


def _parse_gs(netloc: str, path: str, shown: str) -> StoreURI:
    bucket = netloc
    if not bucket or ":" in bucket:
        raise InvalidInput(_FIELD, "gs://bucket[/prefix] with a bucket name (an endpoint goes "
                           "in storage.endpoint)", shown)
    if not _GCS_BUCKET_RE.match(bucket) or ".." in bucket or _IPV4_RE.match(bucket) \
            or any(len(c) > 63 for c in bucket.split(".")) \
            or ("." not in bucket and len(bucket) > 63) or bucket.startswith("goog"):
        raise InvalidInput(
            _FIELD, "a GCS bucket name of 3-63 lowercase letters, digits, '-', '_' or '.' "
            "(up to 222 with dots), starting and ending with a letter or digit", shown)
    return StoreURI(scheme="gs", bucket=bucket, prefix=_prefix("gs", path, shown))


def _parse_s3(netloc: str, path: str, shown: str) -> StoreURI:
    bucket = netloc
    if not bucket:
        raise InvalidInput(_FIELD, "s3://bucket[/prefix] with a bucket name", shown)
    if ":" in bucket:
        raise InvalidInput(
            _FIELD, "s3://bucket[/prefix] (put the endpoint in endpoint_url, not the URI)", shown
        )
    if not _BUCKET_RE.match(bucket) or ".." in bucket or _IPV4_RE.match(bucket):
        raise InvalidInput(
            _FIELD,
            "a bucket name of 3-63 lowercase letters, digits, '.' or '-', "
            "starting and ending with a letter or digit",
            shown,
        )
    return StoreURI(scheme="s3", bucket=bucket, prefix=_prefix("s3", path, shown))


def endpoint_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The custom S3 endpoint named by the environment, or None for AWS itself.
    InvalidInput naming the variable when its value is not a usable URL."""
    env = os.environ if environ is None else environ
    for name in ENDPOINT_ENV_VARS:
        value = env.get(name, "").strip()
        if value:
            return parse_endpoint(name, value)
    return None


def explicit_keys(env: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """The keys the environment gives (access key, secret key, session
    token), or three Nones for the standard chain when it names none.

    A key variable that is set must hold a key: botocore skips an empty one
    and falls through to the rest of its chain (IRSA, Pod Identity, the
    instance profile), so a policy's Secret with empty values would sign
    with the pod's own identity, where the policy chose an endpoint for its
    own keys (store/ambient_endpoints.py). InvalidInput naming the variable;
    never a value."""
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    if not any(name in env for name in names):
        return None, None, None
    for name in names:
        if not (env.get(name) or "").strip():
            raise InvalidInput(name, "a key (the credentials Secret's value, or the "
                               "variable unset to use the AWS chain)",
                               "empty" if name in env else "unset")
    return env[names[0]].strip(), env[names[1]].strip(), \
        (env.get("AWS_SESSION_TOKEN") or "").strip() or None


def open_store(
    uri: str,
    *,
    endpoint_url: str | None = None,
    endpoint_field: str = "endpoint_url",
    region: str | None = None,
    max_pool_connections: int = 32,
    environ: dict[str, str] | None = None,
    options: object = None,
    create: bool = True,
) -> Store:
    """Open the store a URI names. Raises InvalidInput for a bad URI.

    For s3:// the endpoint is `endpoint_url`, else the first of
    CKPTDRAIN_S3_ENDPOINT, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS.
    Credentials come from the standard AWS chain (env, profile, IRSA, IMDS).
    The endpoint goes through `parse_endpoint` (InvalidInput naming
    `endpoint_field`, credentials redacted) before botocore sees it.
    Encryption, a private CA and the addressing style: `options` (an
    S3Options) if given, else the environment (store/s3_options.py;
    InvalidInput naming the variable).
    For gs:// the endpoint is `endpoint_url`, else STORAGE_EMULATOR_HOST
    (an emulator, plain http), else Google; credentials are Application
    Default Credentials (store/gcs_auth.py); a private CA as for s3://.
    Opening does no I/O for s3:// and gs:// (errors show on first use, but a
    GOOGLE_APPLICATION_CREDENTIALS file that cannot be used is refused now);
    file:// creates the directory if needed, unless `create` is False: then
    a missing directory is BucketMissing, as a missing bucket is on first use.
    """
    parsed = parse_store_uri(uri)
    endpoint = None if endpoint_url is None else parse_endpoint(endpoint_field, endpoint_url)
    if parsed.scheme == "file":
        from ckptdrain.store.local import LocalStore

        return LocalStore(parsed.path, create=create)
    env = os.environ if environ is None else environ
    if parsed.scheme == "gs":
        from ckptdrain.store.gcs import GcsStore
        from ckptdrain.store.s3_options import S3Options

        opts = options if isinstance(options, S3Options) else S3Options.from_env(env)
        return GcsStore(parsed.bucket, parsed.prefix, endpoint_url=endpoint,
                        max_pool_connections=max_pool_connections, environ=env,
                        ca_bundle=opts.ca_bundle)
    from ckptdrain.store.s3 import S3Store
    from ckptdrain.store.s3_options import S3Options

    access_key, secret_key, session_token = explicit_keys(env)
    return S3Store(
        parsed.bucket,
        parsed.prefix,
        endpoint_url=endpoint or endpoint_from_env(dict(env)),
        region=region,
        access_key=access_key, secret_key=secret_key, session_token=session_token,
        max_pool_connections=max_pool_connections,
        options=options if isinstance(options, S3Options) else S3Options.from_env(env),
    )
