"""CheckpointPolicy at the operator's edge. The operator reads and writes
policies at v1beta1, the storage version, so its reads never wait on its
own /convert (its writes to a policy with a v1alpha1 manager in
managedFields still do: the apiserver converts for that manager's record,
and drops managedFields if /convert is down: docs/api-versions.md); its
pure core speaks v1alpha1's model (policy/spec.py,
ckptdrain.units). So each body read is converted down before the core sees
it, and each status or patch the core computes is converted up before it
is written, with the converter the webhook uses (contract/policy_versions).

Partial statuses convert too: the converter rewrites only the fields a
patch holds (a time set to null stays null, a merge patch's absent field
stays absent). metadata is never touched, so managedFields still say the
version each manager wrote (policy/version_messages.py). Pure, and free of
Kopf and the Kubernetes SDK: the admission process imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.contract import api
from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, to_v1alpha1, to_v1beta1

#: What Kopf's decorators name for CheckpointPolicy.
RESOURCE = (api.GROUP, api.POLICY_VERSION, api.POLICIES)


def version_of(plural: str) -> str:
    """The version the operator reads and writes `plural` at."""
    return api.POLICY_VERSION if plural == api.POLICIES else api.VERSION


def seen(body: Mapping[str, Any]) -> dict[str, Any]:
    """A policy as the core reads it: the v1alpha1 form of one read at
    v1beta1 (a new dict); any other body as a plain copy of its top level."""
    if body.get("apiVersion") == V1BETA1:
        return to_v1alpha1(body)
    return dict(body)


def event_subject(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an Event about a policy names (Kopf's kopf.info/warn read
    apiVersion, kind and metadata's name, namespace and uid): the policy at
    the storage version, whichever form `body` is in."""
    meta = body.get("metadata") or {}
    return {"apiVersion": api.POLICY_API_VERSION, "kind": api.KIND_POLICY,
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}}


def written(plural: str, change: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch of `plural` ({"status": …}, {"spec": …}, metadata) the
    core computed at v1alpha1, as the operator writes it: for a policy, its
    v1beta1 form; for any other kind, unchanged."""
    if plural != api.POLICIES:
        return dict(change)
    up = to_v1beta1({**change, "apiVersion": V1ALPHA1, "kind": api.KIND_POLICY})
    return {k: v for k, v in up.items() if k in change}


def read(plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object of `plural` as read from the apiserver, as the core reads
    it (a policy: `seen`)."""
    return seen(obj) if plural == api.POLICIES else dict(obj)
