"""Opted-in pods that no CheckpointPolicy selects: what admission answers
and what the sweep says about them. Pure: no Kubernetes, no clock.

A pod labelled `ckptdrain.io/inject=true` asks to be checkpointed. When no
policy of its namespace selects it (the policy was deleted, or its selector
has a typo), it would start without restore and never be drained, and an
admission warning alone reaches nobody when a controller creates the pod.
So admission refuses it (CKPTDRAIN_UNSELECTED_PODS=Refuse, the default) and
the pod's controller keeps retrying, its failures visible on the workload;
with Flag it is admitted bare. Whatever runs bare anyway (Flag, a webhook
that failed open, a label added after creation) the sweep flags with an
`Unselected` Event on the pod and one on its controller; so it does a pod
injected for a policy that was deleted since.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ckptdrain.contract import api
from ckptdrain.operator.config import UNSELECTED_REFUSE, OperatorConfig
from ckptdrain.operator.policy import spec as pol

#: The reason of the Warning Events the sweep posts.
REASON = "Unselected"


def _fix(namespace: str) -> str:
    return (f"create a CheckpointPolicy in {namespace} whose spec.selector matches the "
            f"pod's labels, or remove the label {api.LABEL_INJECT} to run the pod "
            "without checkpoints")


def refuses(cfg: OperatorConfig) -> bool:
    """Whether admission refuses such a pod (else it admits it bare)."""
    return cfg.unselected_pods == UNSELECTED_REFUSE


def selected_by_none(labels: Mapping[str, str],
                     selectors: Iterable[Mapping[str, Any] | None]) -> bool:
    """No selector of the namespace's policies matches the pod's labels."""
    return not any(pol.selector_matches(s or {}, dict(labels)) for s in selectors)


#: How many of the namespace's policies a refusal lists (a typo is found by
#: comparing; a namespace of hundreds must not make the message unreadable).
LISTED_POLICIES = 5


def _policies(policies: Sequence[Mapping[str, Any]]) -> str:
    if not policies:
        return "the namespace has no CheckpointPolicy"
    shown = sorted(policies, key=lambda b: str((b.get("metadata") or {}).get("name")))
    parts = [f"{(b.get('metadata') or {}).get('name')} selects "
             f"{json.dumps((b.get('spec') or {}).get('selector') or {}, sort_keys=True)[:200]}"
             for b in shown[:LISTED_POLICIES]]
    more = len(shown) - LISTED_POLICIES
    return "its policies: " + "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def refusal(namespace: str, pod: str, labels: Mapping[str, str],
            policies: Sequence[Mapping[str, Any]]) -> str:
    """Admission's answer under Refuse: what is wrong, what the pod's labels
    and the namespace's selectors are (a typo shows), and the two ways out."""
    return (f"metadata.labels: no CheckpointPolicy in {namespace} selects this pod ({pod}), "
            f"but it is labelled {api.LABEL_INJECT}=true, which asks for checkpoints; "
            f"the pod's labels: {json.dumps(dict(labels), sort_keys=True)[:300]}; "
            f"{_policies(policies)}; " + _fix(namespace))


def invalid_refusal(namespace: str, pod: str, policy: str, error: str) -> str:
    """Admission's answer under Refuse when the one policy selecting the pod
    is invalid: admitted bare, the pod would run unprotected all the same."""
    return (f"metadata.labels: CheckpointPolicy {policy} in {namespace} selects this pod "
            f"({pod}) but is invalid ({error}); fix the policy (kubectl describe "
            f"checkpointpolicy {policy} -n {namespace}), or remove the label "
            f"{api.LABEL_INJECT} to run the pod without checkpoints")


def admission_warning(namespace: str) -> str:
    """Admission's warning under Flag: the pod is admitted bare."""
    return (f"ckptdrain: no CheckpointPolicy in {namespace} selects this pod; not injected: "
            "it starts without restore and is never checkpointed; "
            + _fix(namespace))


def pod_event(namespace: str) -> str:
    """The Event on the pod."""
    return (f"labelled {api.LABEL_INJECT}=true, but no CheckpointPolicy in {namespace} "
            "selects it: it runs without restore and is never checkpointed. "
            f"To fix: {_fix(namespace)}; then delete the pod, so that its controller "
            "recreates it through admission.")


def orphan_event(namespace: str, policy: str) -> str:
    """The Event on an injected pod whose policy was deleted."""
    return (f"labelled {api.LABEL_INJECT}=true and injected for CheckpointPolicy {policy}, "
            f"which no longer exists in {namespace}: the operator no longer coordinates "
            "its checkpoints. To fix: recreate a CheckpointPolicy that selects it and "
            "delete the pod, so that its controller recreates it through admission; or "
            "delete the workload.")


def owner_event(namespace: str, count: int, example: str,
                deleted: str | None = None) -> str:
    """The one Event on a pod's controller (a Job, a ReplicaSet, ...);
    `deleted`: the policy its pods were injected for, now gone."""
    pods = f"pod {example} is" if count == 1 else f"{count} of its pods (e.g. {example}) are"
    if deleted:
        return (f"{pods} labelled {api.LABEL_INJECT}=true and injected for CheckpointPolicy "
                f"{deleted}, which no longer exists in {namespace}: the operator no longer "
                "coordinates their checkpoints. Recreate a CheckpointPolicy that selects "
                "them and delete the pods, or delete the workload.")
    return (f"{pods} labelled {api.LABEL_INJECT}=true, but no CheckpointPolicy in "
            f"{namespace} selects them: they run without restore and are never "
            "checkpointed. Create a CheckpointPolicy whose spec.selector matches the pod "
            f"template's labels, or remove {api.LABEL_INJECT} from the template.")


#: Controllers that live outside any namespace (a mirror pod's Node): a
#: namespaced Event cannot name them, so only the pod is flagged.
CLUSTER_SCOPED = frozenset({("v1", "Node")})


class Pod(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def owner(self) -> tuple[str, str, str, str | None] | None: ...
    @property
    def policy(self) -> str | None: ...


@dataclass(frozen=True)
class Notice:
    """One Event to post, about one object, keyed by the object's uid."""
    uid: str
    api_version: str
    kind: str
    name: str
    message: str


def notices(namespace: str, pods: Sequence[Pod]) -> list[Notice]:
    """One Event per unselected pod and one per namespaced controller (with
    how many of its pods are unselected): a 2,000-pod Job gets one, not 2,000.
    A pod with a `policy` was injected for that policy, which is gone."""
    out = [Notice(p.uid, "v1", "Pod", p.name,
                  orphan_event(namespace, p.policy) if p.policy else pod_event(namespace))
           for p in pods]
    by_owner: dict[str, list[Pod]] = {}
    for p in pods:
        if p.owner is not None and p.owner[3] and p.owner[:2] not in CLUSTER_SCOPED:
            by_owner.setdefault(p.owner[3], []).append(p)
    for uid, owned in by_owner.items():
        api_version, kind, name, _ = owned[0].owner  # type: ignore[misc]
        first = min(p.name for p in owned)
        deleted = next((p.policy for p in owned if p.policy), None)
        out.append(Notice(uid, api_version, kind, name,
                          owner_event(namespace, len(owned), first, deleted)))
    return out
