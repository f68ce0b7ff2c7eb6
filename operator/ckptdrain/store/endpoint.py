"""The S3 endpoint URL: checked once, before any library sees it. Pure.

botocore refuses a malformed endpoint with a ValueError that quotes the whole
URL, and quotes it again in every connection error, so a password written
into the URL (`http://user:PASSWORD@host:9000`) ends up in tracebacks, logs
and Events. Every entry point (CLI flags, the agent's and restore's
environment, a policy's `storage.endpoint`, `open_store`) therefore passes
the value through `parse_endpoint` first: anything but
`http(s)://host[:port][/path]` is refused with one line naming the field,
and the value shown in that line never carries credentials. S3 credentials
belong in the AWS chain (environment, profile, workload identity) or a
Secret, never in a URL.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ckptdrain.errors import InvalidInput

EXPECTED = "an http:// or https:// URL such as http://minio.example:9000"
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")


def redact_endpoint(value: str) -> str:
    """`value` with anything before an '@' in its authority replaced by '***'."""
    return _USERINFO.sub(lambda m: f"{m[1] or ''}***@", value)


def _host_ok(host: str) -> bool:
    if host.startswith("["):  # IPv6 literal: urlsplit validated the brackets
        return host.endswith("]") and len(host) > 2
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split("."))


def parse_endpoint(field: str, value: object) -> str:
    """The endpoint as the S3 client should receive it (surrounding spaces and a
    trailing '/' dropped). InvalidInput naming `field` otherwise; the message
    shows the value with any credentials redacted."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, EXPECTED, "" if value is None else "(not a string)")
    text = value.strip()
    shown = redact_endpoint(text)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise InvalidInput(field, f"{EXPECTED}, without spaces or control characters", shown)
    if "://" not in text:
        raise InvalidInput(field, EXPECTED, shown)
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError for a port that is not 0..65535
    except ValueError:
        raise InvalidInput(field, f"{EXPECTED} (a valid host and port)", shown) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidInput(field, EXPECTED, shown)
    if "@" in parts.netloc:
        raise InvalidInput(
            field, f"{EXPECTED} without user:password@ (S3 keys come from AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY, a profile, workload identity or the policy's Secret)", shown)
    host = parts.netloc.rsplit(":", 1)[0] if port is not None or parts.netloc.endswith(":") \
        else parts.netloc
    if not host or not _host_ok(host):
        raise InvalidInput(field, f"{EXPECTED} (a host name of letters, digits, '-' and '.',"
                           " or an IP address)", shown)
    if port == 0 or parts.netloc.endswith(":"):
        raise InvalidInput(field, f"{EXPECTED} (a port in 1..65535)", shown)
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise InvalidInput(field, f"{EXPECTED} without '?query' or '#fragment'", shown)
    return text.rstrip("/")
