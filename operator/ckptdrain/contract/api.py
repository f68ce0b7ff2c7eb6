"""Names both sides of the API share: group, version, resources, labels,
annotations, and the one timestamp format. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

GROUP = "ckptdrain.io"
#: The one version of Checkpoint and CheckpointShare (CheckpointClass is
#: v1beta1 only: class_events.py).
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: CheckpointPolicy's storage version from 0.3.0, which the operator, the
#: CSI driver and the CLI read and write (v1alpha1 is served too, converted
#: by the operator's /convert: docs/api-versions.md).
POLICY_VERSION = "v1beta1"
POLICY_API_VERSION = f"{GROUP}/{POLICY_VERSION}"

POLICIES = "checkpointpolicies"
CHECKPOINTS = "checkpoints"
KIND_POLICY = "CheckpointPolicy"
KIND_CHECKPOINT = "Checkpoint"

#: Pods opt in with this label; the webhook's objectSelector matches only them.
LABEL_INJECT = "ckptdrain.io/inject"
#: On an injected pod: its writer rank (the webhook sets it), so admission
#: finds a live pod already holding a rank with one server-side selector.
LABEL_WRITER = "ckptdrain.io/writer"
#: On a Checkpoint record: the policy it belongs to. On an injected pod
#: whose policy's name fits a label value (and on every pod of a policy with
#: the peer tier): the policy that injected it, which policy admission selects
#: a policy's live pods by and a NetworkPolicy selects (docs/peer-tier.md).
LABEL_POLICY = "ckptdrain.io/policy"
#: On an injected writer's pod, beside its rank, when the name fits a label
#: value: the policy it writes for. Admission finds a rank's holders by both
#: (operator/apiserver/reads.py writer_selectors): the few pods that match, not every
#: pod holding that rank under any policy of the namespace.
LABEL_WRITER_POLICY = "ckptdrain.io/writer-policy"
#: On an injected reader's pod (a pod that restores but never writes): the
#: shard it reads. It never carries LABEL_WRITER: nothing that counts,
#: pairs or fences writers sees it.
LABEL_READER = "ckptdrain.io/reader"
#: Longest label value Kubernetes takes.
MAX_LABEL_VALUE = 63


def is_reader(labels: Mapping[str, str] | None) -> bool:
    """Whether a pod's labels mark it a reader: nothing that counts, pairs or
    fences writers may take it for one."""
    return LABEL_READER in (labels or {})


def policy_labelled(policy: str) -> bool:
    """Whether a policy's pods carry its name as LABEL_POLICY (and its
    writers as LABEL_WRITER_POLICY): a name no longer than a label value."""
    return len(policy) <= MAX_LABEL_VALUE

#: The policy that injected a pod (its name, in the pod's namespace).
ANNOTATION_POLICY = "ckptdrain.io/policy"
ANNOTATION_INJECTED = "ckptdrain.io/injected"
#: The agent image the webhook injected into the pod: what a replacement
#: writer of the same workload keeps across an operator upgrade
#: (operator/admission/agent_pin.py). Always written by the webhook, over any
#: value the pod came with.
ANNOTATION_AGENT_IMAGE = "ckptdrain.io/agent-image"
#: The pod's bandwidth share in bytes/s: the operator writes it, the agent
#: reads it through a downward-API file.
ANNOTATION_BANDWIDTH = "ckptdrain.io/bandwidth"
#: Bytes the agent still has to drain: the agent writes it, the operator
#: splits bandwidth by it.
ANNOTATION_PENDING = "ckptdrain.io/pending-bytes"
#: How many pods write, as the pod's workload says (Job completions, …): the
#: webhook sets it when known, the operator compares it with spec.writers.
ANNOTATION_WORKLOAD_WRITERS = "ckptdrain.io/workload-writers"
#: Set by an agent that applies its namespace's cluster scale
#: (contract/share.py), in its own report patch. While a pod of a policy has
#: not said so, the operator rewrites the policy's channel for every change
#: of budget.
ANNOTATION_SHARE_SCALE = "ckptdrain.io/share-scale"
#: What restore placed for the trainer: `restored_from(step, tier)`.
ANNOTATION_RESTORED = "ckptdrain.io/restored-from"
#: What restore did, as JSON (contract/goodput.RestoreView): outcome, step, tier,
#: duration and, when it failed, the reason. Restore writes it with
#: ANNOTATION_RESTORED; the operator copies failures into the policy status.
ANNOTATION_RESTORE_RESULT = "ckptdrain.io/restore-result"
#: The agent's goodput view of its trainer, as JSON (contract/goodput.AgentView).
ANNOTATION_GOODPUT = "ckptdrain.io/goodput"
#: Set by the user on a pod (or its template) to `RESTORE_SKIP` for a
#: deliberate fresh start: restore then places nothing. It reaches restore
#: through the downward API (Env.RESTORE_MODE), so it is read when the init
#: container starts, not only at admission.
ANNOTATION_RESTORE = "ckptdrain.io/restore"
RESTORE_SKIP = "skip"
#: Set by the user on a pod (or its template) to declare its role: ROLE_READER
#: (restores its shard, never writes; any rank) or ROLE_WRITER (must hold a
#: writer rank below spec.writers). Without it the policy's spec.readers decides.
ANNOTATION_ROLE = "ckptdrain.io/role"
ROLE_WRITER = "writer"
ROLE_READER = "reader"

#: Every time the API carries (records, status, conditions): UTC, whole seconds.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def timestamp(now: datetime) -> str:
    return now.strftime(TIME_FORMAT)


def parse_timestamp(text: str) -> datetime:
    """The UTC datetime of a `timestamp`; ValueError for anything else."""
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC)


def as_stored(value: Any) -> Any:
    """`value` as the apiserver keeps it once written with a JSON merge
    patch: a null names a key to remove, so no object keeps a null value,
    not even one inside a list (the apiserver prunes those too). Compare
    and remember what was written in this form, or a status read back
    differs from it and is written again."""
    if isinstance(value, Mapping):
        return {k: as_stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    return value


def restored_from(step: int | None, tier: str | None) -> str:
    """The `ckptdrain.io/restored-from` value: `step=<N> tier=<local|global>`, or `fresh`."""
    return "fresh" if step is None else f"step={step} tier={tier}"


#: CheckpointClass: cluster-scoped, v1beta1 only.
CLASSES = "checkpointclasses"
CLASS_VERSION = "v1beta1"


def class_named(policy_spec: Mapping[str, object] | None) -> str | None:
    """The CheckpointClass a policy is bound to: the one its
    spec.checkpointClassName names (a policy created while a class was the
    default had that name written in at creation); None: no class, the
    operator's and the driver's own settings, for good."""
    name = (policy_spec or {}).get("checkpointClassName")
    return str(name) if name else None
