"""A CheckpointClass's word on its policies' node data, as the driver reads
and records it. Pure.

    CheckpointClass spec.nodeTier.reclaim: {policy: Delete|Retain,
                                            gracePeriod: 1h}   (both optional)

The driver reads it while the policy is there (the class a policy is bound
to is the one its spec.checkpointClassName names: `contract.api.class_named`)
and records it beside the directory's owner marker, because once the policy
is deleted nothing says which class it had:

    <root>/<namespace>/<policy uid>/reclaim.json
        {"version": 1, "class": "prod", "known": true,
         "policy": "Retain" | null, "gracePeriodSeconds": 3600 | null}

null: the class leaves that field to the driver's own setting
(collection.effective). known false: the policy names the class but its
reclaim was never read (held, never the driver's setting). A record that
does not parse as this version is Unreadable: held, never the driver's
setting either.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ckptdrain import units
from ckptdrain.csi.collection import RECLAIM_POLICIES, Recorded, Unreadable
from ckptdrain.errors import InvalidInput

RECLAIM_FILE = "reclaim.json"
FORMAT_VERSION = 1
#: Every CheckpointClass's spec by name (one LIST). Raises Refused when the
#: apiserver does not answer with them.
ClassLister = Callable[[], Mapping[str, Mapping[str, Any]]]
FIELD = "spec.nodeTier.reclaim"


def from_class(name: str, spec: Mapping[str, Any]) -> Recorded:
    """What class `name` (its spec) says; raises InvalidInput naming the
    field (the CRD refuses the same, so only a class written before the
    field existed, or past the schema, gets here)."""
    tier = spec.get("nodeTier") if isinstance(spec, Mapping) else None
    reclaim = tier.get("reclaim") if isinstance(tier, Mapping) else None
    if reclaim is None:
        return Recorded(name)
    if not isinstance(reclaim, Mapping):
        raise InvalidInput(f"CheckpointClass {name} {FIELD}", "an object", reclaim)
    policy = reclaim.get("policy")
    if policy is not None and policy not in RECLAIM_POLICIES:
        raise InvalidInput(f"CheckpointClass {name} {FIELD}.policy",
                           " or ".join(RECLAIM_POLICIES), policy)
    grace = reclaim.get("gracePeriod")
    grace_s = None if grace is None else units.parse_duration(
        f"CheckpointClass {name} {FIELD}.gracePeriod", grace)
    return Recorded(name, policy, grace_s)


def dumps(recorded: Recorded) -> str:
    return json.dumps({"version": FORMAT_VERSION, "class": recorded.class_name,
                       "known": recorded.known, "policy": recorded.policy,
                       "gracePeriodSeconds": recorded.grace_s})


def loads(text: str) -> Recorded | Unreadable:
    """The record, or Unreadable saying why it is not one."""
    try:
        found = json.loads(text)
    except ValueError:
        return Unreadable("not JSON")
    if not isinstance(found, dict) or found.get("version") != FORMAT_VERSION:
        return Unreadable(f"not a version {FORMAT_VERSION} record")
    name, known = found.get("class"), found.get("known")
    policy, grace = found.get("policy"), found.get("gracePeriodSeconds")
    if not isinstance(name, str) or not name:
        return Unreadable("class: expected a non-empty name")
    if not isinstance(known, bool):
        return Unreadable("known: expected true or false")
    if policy is not None and policy not in RECLAIM_POLICIES:
        return Unreadable(f"policy: expected {' or '.join(RECLAIM_POLICIES)} or null, "
                          f"got {policy!r}")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int | float)
                              or not grace > 0):
        return Unreadable("gracePeriodSeconds: expected a positive number or null")
    return Recorded(name, policy, None if grace is None else float(grace), known)
