"""Where a store reached with the pod's own identity may be. Pure.

A policy without a credentials Secret reaches S3 with the identity the pod
has around it: IRSA or EKS Pod Identity, a node's instance profile. Every
request to the store is signed by that identity and carries its session
token (`x-amz-security-token`; never the secret key). A `storage.endpoint`
the tenant chose would receive those requests and the checkpoints in them,
sent with the platform's identity: a host under the tenant's control (an
API Gateway or load balancer under amazonaws.com included), or an S3
bucket of someone else's named in the host. So with the ambient identity a
policy may name only S3's own endpoints (`AWS_S3_HOSTS`: https on 443, the
regional, FIPS, dual-stack and legacy forms and VPC interface endpoints,
never a bucket in the host) or no endpoint, and those the platform lists
(CKPTDRAIN_AMBIENT_ENDPOINTS, the chart's `agent.ambientEndpoints`, and
for a policy of a CheckpointClass the endpoint of its store when that
entry says `ambientIdentity: true`, policy/class_stores.py); and a
private CA only with a listed endpoint (S3's certificates are public). A
policy with a Secret signs with its own keys, wherever its endpoint is:
store/__init__.explicit_keys refuses a Secret with empty keys, which would
let the S3 client fall back to the pod's identity. (gs:// stores have their
own rule, store/gcs.py.)

The same holds for the identity the platform maps a tenant namespace to
(CKPTDRAIN_AGENT_IDENTITIES): it has no Secret either, and the role signs
every request alike.

What this does not do: a tenant who may create pods can use the pod's
identity itself (the trainer shares it, or asks for a token of the mapped
role's audience); it keeps a tenant who may only write policies from
sending the identity elsewhere.

An entry is an origin, `https://host[:port]`, or `https://*.domain` for every
host under a domain (not the domain itself); paths are ignored and the port
is the scheme's default when not written.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ckptdrain.errors import InvalidInput
from ckptdrain.store.endpoint import EXPECTED, parse_endpoint

VARIABLE = "CKPTDRAIN_AMBIENT_ENDPOINTS"
_REGION = r"[a-z]{2}(-[a-z0-9]+)+-[0-9]"
_AWS = r"\.amazonaws\.com(\.cn)?"
#: S3's own host names: s3.amazonaws.com; s3[-fips][.dualstack].<region>;
#: the legacy s3-<region> and s3-external-1; s3-accelerate[.dualstack]; a
#: VPC interface endpoint's (optionally with AWS's `bucket.` prefix).
AWS_S3_HOSTS = re.compile(
    rf"^(s3(-fips)?(\.dualstack)?\.{_REGION}{_AWS}"
    rf"|s3{_AWS}"
    rf"|s3-({_REGION}|external-1){_AWS}"
    rf"|s3-accelerate(\.dualstack)?{_AWS}"
    rf"|(bucket\.)?vpce-[a-z0-9-]+\.s3\.{_REGION}\.vpce{_AWS})$")
_DEFAULT_PORT = {"http": 80, "https": 443}

#: (scheme, host or "*.domain", port)
Origin = tuple[str, str, int]


def origin(text: str) -> Origin:
    """The origin of one endpoint (a value parse_endpoint accepted)."""
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
        scheme, host, port = origin(checked)
        if wildcard:
            host = "*." + host.removeprefix("wildcard.")
            if host.count(".") < 2 or not re.search(r"[a-z]", host.rsplit(".", 1)[1]):
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


def listed(endpoint: str, allowed: tuple[Origin, ...]) -> bool:
    """Whether the platform lists `endpoint` (a value parse_endpoint accepted)."""
    found = origin(endpoint)
    return any(_matches(found, entry) for entry in allowed)


def problem(endpoint: str, allowed: tuple[Origin, ...]) -> str | None:
    """Why the pod's own identity may not be sent to `endpoint` (a value
    parse_endpoint accepted), or None."""
    scheme, host, port = origin(endpoint)
    if scheme == "https" and port == 443 and AWS_S3_HOSTS.match(host):
        return None
    if listed(endpoint, allowed):
        return None
    return ("one of S3's own endpoints (https://s3.<region>.amazonaws.com and its FIPS, "
            "dual-stack and VPC endpoint forms), one the platform lists in "
            f"{VARIABLE} (chart: agent.ambientEndpoints) or vouches for in the policy's "
            "CheckpointClass (spec.stores[].ambientIdentity on its store), or a "
            "credentialsSecretRef: "
            "without a Secret the pods' own identity signs every request sent there")
