"""AWS Signature Version 4 for S3 requests, as botocore's S3SigV4Auth signs
them with payload signing off: the payload stands as UNSIGNED-PAYLOAD, the
path is signed as it is sent (S3 neither normalises nor double-encodes it).
Pure: the time and the credentials are arguments.

    canonical request   METHOD \\n path \\n sorted query \\n headers \\n names \\n payload
    string to sign      AWS4-HMAC-SHA256 \\n time \\n day/region/s3/aws4_request \\n sha256(above)
    signing key         HMAC chain: "AWS4"+secret -> day -> region -> s3 -> aws4_request

tests/unit/test_sigv4.py holds it to botocore's own signer, header for header.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
#: Headers botocore leaves out of a signature (auth.SIGNED_HEADERS_BLACKLIST):
#: proxies and HTTP clients may change them on the way.
UNSIGNED_HEADERS = frozenset({
    "baggage", "connection", "expect", "keep-alive", "proxy-authenticate",
    "proxy-authorization", "te", "traceparent", "tracestate", "trailer", "transfer-encoding",
    "upgrade", "user-agent", "x-amzn-trace-id",
})


@dataclass(frozen=True)
class Credentials:
    """What signs a request; none of it shows in repr() (the store promises
    no credentials there, and the key id names the account's user)."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


def quote_path(path: str) -> str:
    """An object path as S3 requests carry it: every byte but unreserved
    characters and '/' percent-encoded (botocore's serializer for {Key+})."""
    return quote(path, safe="/~")


def query_string(params: list[tuple[str, str]]) -> str:
    """`params` encoded as botocore encodes a query (and signs it): names and
    values percent-encoded but for unreserved characters, sorted."""
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                    for k, v in sorted(params))


def sign(method: str, host: str, path: str, query: str, headers: dict[str, str],
         credentials: Credentials, region: str, now: datetime,
         service: str = "s3") -> dict[str, str]:
    """`headers` with what makes the request signed added: Host, X-Amz-Date,
    x-amz-content-sha256, X-Amz-Security-Token (temporary credentials) and
    Authorization. `path` is already percent-encoded (quote_path), `query`
    already encoded and sorted (query_string); `host` is the Host header's
    value (no port for a scheme's default one), `now` a UTC time."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    out = {**headers, "host": host, "X-Amz-Date": stamp,
           "x-amz-content-sha256": UNSIGNED_PAYLOAD}
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    signed = {name.lower(): " ".join(str(value).split()) for name, value in out.items()
              if name.lower() not in UNSIGNED_HEADERS}
    names = ";".join(sorted(signed))
    canonical = "\n".join([
        method.upper(), path, query,
        "".join(f"{name}:{signed[name]}\n" for name in sorted(signed)),
        names, UNSIGNED_PAYLOAD])
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{credentials.secret_key}".encode()
    for part in (stamp[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                            f"SignedHeaders={names}, Signature={signature}")
    return out
