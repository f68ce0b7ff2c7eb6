"""Where a store reached with the pod's own identity may be. Pure.

A policy without a credentials Secret reaches S3 with the identity the pod
has around it: IRSA or EKS Pod Identity, a node's instance profile. Every
request to the store carries that identity's signature and its session
token (`x-amz-security-token`): a `storage.endpoint` the tenant chose would
receive them, and with them the platform's access to every bucket the role
reaches. So with the ambient identity a policy may name only AWS's own
endpoints (https, `*.amazonaws.com`, `*.amazonaws.com.cn`, or no endpoint)
and those the platform lists (CKPTDRAIN_AMBIENT_ENDPOINTS, the chart's
`agent.ambientEndpoints`). A policy with a Secret sends only its own keys,
wherever its endpoint is. (gs:// stores have their own rule, store/gcs.py.)

An entry is an origin, `https://host[:port]`, or `https://*.domain` for every
host under a domain (not the domain itself); paths are ignored and the port
is the scheme's default when not written.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ckptdrain.errors import InvalidInput
from ckptdrain.store.endpoint import EXPECTED, parse_endpoint

VARIABLE = "CKPTDRAIN_AMBIENT_ENDPOINTS"
AWS_DOMAINS = (".amazonaws.com", ".amazonaws.com.cn")
_DEFAULT_PORT = {"http": 80, "https": 443}

#: (scheme, host or "*.domain", port)
Origin = tuple[str, str, int]


def _origin(text: str) -> Origin:
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORT[scheme]


def parse_allowed(text: str, field: str = VARIABLE) -> tuple[Origin, ...]:
    """The platform's list, comma-separated; InvalidInput naming `field`."""
    allowed: list[Origin] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        wildcard = "://*." in entry
        checked = parse_endpoint(field, entry.replace("://*.", "://wildcard.", 1)
                                 if wildcard else entry)
        scheme, host, port = _origin(checked)
        if wildcard:
            host = "*." + host.removeprefix("wildcard.")
            if host.count(".") < 2:
                raise InvalidInput(field, f"{EXPECTED}, or https://*.domain with a domain of "
                                   "at least two labels", entry)
        allowed.append((scheme, host, port))
    return tuple(allowed)


def _matches(origin: Origin, entry: Origin) -> bool:
    scheme, host, port = origin
    if (scheme, port) != (entry[0], entry[2]):
        return False
    if entry[1].startswith("*."):
        return host.endswith(entry[1][1:]) and host != entry[1][2:]
    return host == entry[1]


def problem(endpoint: str, allowed: tuple[Origin, ...]) -> str | None:
    """Why the pod's own identity may not be sent to `endpoint` (a value
    parse_endpoint accepted), or None."""
    origin = _origin(endpoint)
    scheme, host, _ = origin
    if scheme == "https" and host.endswith(AWS_DOMAINS):
        return None
    if any(_matches(origin, entry) for entry in allowed):
        return None
    return ("an https://*.amazonaws.com endpoint, one the platform lists in "
            f"{VARIABLE} (chart: agent.ambientEndpoints), or a credentialsSecretRef: "
            "without a Secret the pod's own identity (its signature and session token) "
            "would be sent to this host")
