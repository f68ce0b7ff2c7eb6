"""When the s3:// store may read without botocore's client, and with what:
the credentials, signing region and trust botocore itself would use. Pure
but for `default_ca_file` (which asks certifi where it keeps its file).

Reads go around botocore (s3_read_client.py) only where botocore's answer
is known without botocore; anything else, and every write, is botocore's:

- a custom endpoint (MinIO, Ceph, SeaweedFS...), addressed by path or by
  virtual host as the store asks: AWS itself needs botocore's endpoint rules
  (partitions, FIPS, dual-stack, access points, region redirects);
- credentials from the first link of botocore's default chain, or given:
  the store's own keys (tests), else AWS_ACCESS_KEY_ID with
  AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN; AWS_SECURITY_TOKEN, which
  botocore reads first, is left to it), which
  botocore's EnvProvider returns before it looks at anything else (no
  profile is ever set on the store's session, the one thing that would
  skip it). Anything else: an assume-role profile, web identity (IRSA: the
  token file and role ARN), SSO, a credential process, container or
  instance credentials, keys that expire (AWS_CREDENTIAL_EXPIRATION), or
  half a key pair: the whole chain, botocore's, in its order;
- no shared config file (AWS_CONFIG_FILE, else ~/.aws/config): it may name
  a region, a CA bundle or S3 settings that botocore would apply;
- virtual addressing only for a bucket that is one lowercase DNS label on
  an endpoint named by host name: botocore sends any other (dots,
  capitals, underscores, an IP literal endpoint) by path;
- no proxy in the environment (botocore sends through it) and no
  AWS_USE_FIPS_ENDPOINT / AWS_USE_DUALSTACK_ENDPOINT (botocore's rules
  decide what they mean for a custom endpoint).

The signing region is the store's, else AWS_DEFAULT_REGION, else
us-east-1 (botocore's for S3 when none is set; AWS_REGION is not read).
The CA file: the store's CA bundle, else AWS_CA_BUNDLE, else botocore's
default (certifi's file, or the one botocore ships).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ckptdrain.store.sigv4 import Credentials

#: botocore's signing region for S3 when neither the client nor the
#: environment names one.
DEFAULT_REGION = "us-east-1"
_SWITCHES = ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
#: A bucket botocore puts in the host name: one lowercase DNS label.
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9])")


@dataclass(frozen=True)
class ReadSettings:
    """How to send a read: signed with `credentials` for `region`; the bucket
    in the host name when `virtual`; for https, trusting `ca_file` (None:
    botocore's default, see default_ca_file)."""

    credentials: Credentials = field(repr=False)
    region: str
    virtual: bool
    ca_file: str | None


def read_settings(environ: Mapping[str, str], *, bucket: str, endpoint_url: str | None,
                  addressing: str,
                  region: str | None, access_key: str | None, secret_key: str | None,
                  session_token: str | None, ca_bundle: str | None,
                  config_file_exists: bool) -> ReadSettings | None:
    """The settings for reads without botocore, or None where botocore must
    send them (the module's docstring says when). `addressing` is the
    store's resolved style (path, virtual or auto)."""
    if endpoint_url is None or addressing not in ("path", "virtual"):
        return None
    if addressing == "virtual" and not virtual_host(bucket, endpoint_url):
        return None
    if config_file_exists or any(environ.get(name, "").strip() for name in _SWITCHES):
        return None
    if any(name.lower().endswith("_proxy") and name.lower() != "no_proxy" and value.strip()
           for name, value in environ.items()):
        return None
    credentials = given_credentials(access_key, secret_key, session_token)
    if credentials is None and access_key is None and secret_key is None:
        credentials = environment_credentials(environ)
    if credentials is None:
        return None
    return ReadSettings(
        credentials=credentials,
        region=region or environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
        virtual=addressing == "virtual",
        ca_file=ca_bundle or environ.get("AWS_CA_BUNDLE") or None)


def virtual_host(bucket: str, endpoint_url: str) -> bool:
    """Whether botocore would put `bucket` in the endpoint's host name; where
    it would not, it falls back to path style, which is its to decide."""
    try:
        ipaddress.ip_address(str(urlsplit(endpoint_url).hostname))
    except ValueError:
        return _LABEL.fullmatch(bucket) is not None
    return False


def given_credentials(access_key: str | None, secret_key: str | None,
                      session_token: str | None) -> Credentials | None:
    """The store's own keys, when it was given a whole pair."""
    if access_key and secret_key:
        return Credentials(access_key, secret_key, session_token or None)
    return None


def environment_credentials(environ: Mapping[str, str]) -> Credentials | None:
    """What botocore's EnvProvider returns as plain (not refreshable)
    credentials; None where it returns nothing, an error (half a pair) or
    credentials that expire."""
    access_key = environ.get("AWS_ACCESS_KEY_ID", "")
    secret_key = environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not access_key or not secret_key or environ.get("AWS_CREDENTIAL_EXPIRATION", ""):
        return None
    if "AWS_SECURITY_TOKEN" in environ:
        # botocore takes it before AWS_SESSION_TOKEN, even empty; which one
        # wins beside the other is its to say.
        return None
    token = environ.get("AWS_SESSION_TOKEN", "")
    return Credentials(access_key, secret_key, token or None)


def config_file(environ: Mapping[str, str]) -> str:
    """The shared config file botocore reads (AWS_CONFIG_FILE, else ~/.aws/config)."""
    return os.path.expanduser(environ.get("AWS_CONFIG_FILE") or "~/.aws/config")


def default_ca_file() -> str:
    """The CA file botocore trusts when told nothing (httpsession.get_cert_path)."""
    try:
        import certifi
    except ImportError:
        import botocore

        return os.path.join(os.path.dirname(botocore.__file__), "cacert.pem")
    return str(certifi.where())
