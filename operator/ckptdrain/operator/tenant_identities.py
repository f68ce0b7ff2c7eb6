"""The platform's store identity for each tenant namespace
(CKPTDRAIN_AGENT_IDENTITIES, the chart's `agent.identities`). Pure.

With one identity for the whole cluster (the agent's ServiceAccount
annotated with one IAM role), a trainer in namespace A holds the identity
that reads, overwrites and deletes namespace B's checkpoints. Here the
platform names an AWS role for each namespace instead; admission gives it
to ckptdrain's own containers only, as a web identity (a projected
ServiceAccount token that STS exchanges for the role,
admission/tenant_identity.py), so each role's trust policy can accept that
namespace's tokens alone.

The variable holds JSON, one entry per namespace:

    {"team-a": {"awsRoleArn": "arn:aws:iam::111122223333:role/ckpt-team-a",
                "audience": "sts.amazonaws.com",
                "expirationSeconds": 3600}}

`audience` (default sts.amazonaws.com) is the token's, which the role's
trust policy and the IAM OIDC provider's client ids must name;
`expirationSeconds` (default 3600) how long each token lives: the kubelet
renews it before then, and the apiserver refuses less than 600.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import InvalidInput

VARIABLE = "CKPTDRAIN_AGENT_IDENTITIES"
DEFAULT_AUDIENCE = "sts.amazonaws.com"
DEFAULT_EXPIRATION_S = 3600
#: The apiserver's own bounds for a projected token's expirationSeconds.
MIN_EXPIRATION_S, MAX_EXPIRATION_S = 600, 2**32
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: arn:<partition>:iam::<account>:role/<path/><name>, as IAM spells them
#: (a role's name and path segments: letters, digits and +=,.@_-).
ROLE_ARN = re.compile(r"arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/([\w+=,.@-]+/)*[\w+=,.@-]{1,64}",
                      re.ASCII)
#: Any printable text without spaces: what a token's `aud` and a trust
#: policy's condition compare as a string.
AUDIENCE = re.compile(r"[!-~]{1,253}")
KEYS = ("awsRoleArn", "audience", "expirationSeconds")


@dataclass(frozen=True)
class WebIdentity:
    """One namespace's role, and the token that asks STS for it."""

    role_arn: str
    audience: str = DEFAULT_AUDIENCE
    expiration_s: int = DEFAULT_EXPIRATION_S


#: (namespace, identity) pairs, sorted by namespace: hashable, like the config.
Identities = tuple[tuple[str, WebIdentity], ...]


def read_entry(field: str, raw: object) -> WebIdentity:
    """One identity entry (awsRoleArn, audience, expirationSeconds); InvalidInput
    naming `field` and the key."""
    if not isinstance(raw, Mapping):
        raise InvalidInput(field, "a map with awsRoleArn (and optionally audience and "
                           "expirationSeconds)", raw)
    unknown = sorted(str(k) for k in raw if k not in KEYS)
    if unknown:
        raise InvalidInput(f"{field}.{unknown[0]}", f"one of {', '.join(KEYS)}", raw[unknown[0]])
    arn = raw.get("awsRoleArn")
    if not isinstance(arn, str) or not ROLE_ARN.fullmatch(arn):
        raise InvalidInput(f"{field}.awsRoleArn",
                           "an IAM role ARN, arn:<partition>:iam::<12-digit account>:role/"
                           "[<path>/]<name>", arn)
    audience = raw.get("audience", DEFAULT_AUDIENCE)
    if not isinstance(audience, str) or not AUDIENCE.fullmatch(audience):
        raise InvalidInput(f"{field}.audience", "a token audience without spaces, "
                           f"such as {DEFAULT_AUDIENCE}", audience)
    expiration = raw.get("expirationSeconds", DEFAULT_EXPIRATION_S)
    if (not isinstance(expiration, int) or isinstance(expiration, bool)
            or not MIN_EXPIRATION_S <= expiration <= MAX_EXPIRATION_S):
        raise InvalidInput(f"{field}.expirationSeconds", f"a whole number of seconds from "
                           f"{MIN_EXPIRATION_S} to {MAX_EXPIRATION_S}", expiration)
    return WebIdentity(arn, audience, expiration)


def parse(text: str, variable: str = VARIABLE) -> Identities:
    """The variable's JSON ("" or "{}": none); InvalidInput naming the
    variable and, for a bad entry, its namespace and key."""
    if not text.strip():
        return ()
    try:
        raw: Any = json.loads(text)
    except ValueError:
        raw = text
    if not isinstance(raw, Mapping):
        raise InvalidInput(variable, 'JSON such as {"team-a": {"awsRoleArn": '
                           '"arn:aws:iam::111122223333:role/ckpt-team-a"}}', text)
    found: dict[str, WebIdentity] = {}
    for namespace, entry in raw.items():
        if not NAMESPACE.fullmatch(namespace):
            raise InvalidInput(f"{variable}[{namespace}]", "a namespace name (a DNS label: "
                               "lowercase letters, digits and '-', at most 63)", namespace)
        found[namespace] = read_entry(f"{variable}[{namespace}]", entry)
    return tuple(sorted(found.items()))


def of(identities: Identities, namespace: str) -> WebIdentity | None:
    """The identity the platform maps `namespace` to, or None."""
    return next((identity for name, identity in identities if name == namespace), None)
