"""Where the trainer's work dir lives, and the group that shares it. Pure: the
pod patch (injection.py) puts these volumes, mounts and ops into the pod.

A writer under a disk local tier writes its checkpoints on the node's disk,
inside the local tier's own volume (the hostPath, or the CSI driver's inline
volume), so capture links files instead of copying them (link(2) fails
across two mounts, even of one filesystem, so agent and restore reach it
through their local-tier mount):

    <volume>/               ckptdrain-local: agent, restore at /ckptdrain/local
      writer-<id>/          the local tier (several writers; pod_env.local_dir)
      work-<writer>-<uid>/  the trainer's /ckptdrain/work: one per pod
                            (subPathExpr: $(CKPTDRAIN_WORK_NAME))

One per pod, not per writer: a Job's replacement pod (podReplacementPolicy
TerminatingOrFailed) may start on the node while the old pod of the writer
still terminates. Sharing a dir, the new pod's restore would empty it under
the old trainer's emergency save, or the old trainer would publish into the
new pod's dir. The agent removes an earlier pod's dir once it holds the
writer's lease (agent/stale_work.py).

Who makes it: under the hostPath, the root `ckptdrain-prepare` (prepare.py);
in either mode restore (uid 65532, an init container, so before the
trainer's subPath mount) makes it when missing, gives it the pod's group
(CKPTDRAIN_WORK_GROUP, `group_env`), mode 2775, and refuses a symlink or a
dir it does not own there (restore/pod_work.py).

Under a memory tier (`localTier.memory`) it stays a memory emptyDir, and a
reader's (it never captures) a disk emptyDir sized for the step it restores.
On the node, no emptyDir limit and no ephemeral-storage request: the local
tier's disk holds it: size `localTier.capacity` for it (docs/pod-contract.md).

The trainer may run as root (the NGC images), as 65532 or as any uid
(OpenShift): what it shares with ckptdrain's containers (uid 65532) is the
pod's fsGroup, which every container of the pod holds as a supplementary
group. A pod without one gets 65532 (group_access.py says how files are
shared through it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain import units
from ckptdrain.contract.env import Env
from ckptdrain.operator.admission.pod_env import WORK_DIR, work_on_node
from ckptdrain.operator.policy.spec import Policy

#: The group a pod without an fsGroup gets: ckptdrain's own uid/gid.
SHARED_GROUP = 65532
#: What an emptyDir work dir may hold, in checkpoint shards: the step restore
#: placed (kept while the trainer loads it), the newest published one and the
#: one being written. Past its sizeLimit the kubelet evicts the pod, so the
#: limit is generous rather than tight.
WORK_SHARDS = 3

JSONPatch = list[dict[str, Any]]


def work_size(policy: Policy) -> int:
    """Bytes an emptyDir work dir on disk may hold (its sizeLimit and an
    ephemeral-storage request)."""
    return int(WORK_SHARDS * policy.checkpoint_bytes / policy.writers) + (64 << 20)


def volume(policy: Policy, *,
           reader: bool = False) -> dict[str, Any] | None:
    """The `ckptdrain-work` emptyDir, or None when the work dir is on the node.
    Always with a size limit, always a Kubernetes quantity: a work dir that
    grows without bound fills the node's ephemeral storage or memory."""
    if work_on_node(policy, reader=reader):
        return None
    work: dict[str, Any] = {"sizeLimit": units.format_quantity(work_size(policy))}
    if policy.memory_limit:
        work = {"medium": "Memory", "sizeLimit": policy.memory_limit}
    return {"name": "ckptdrain-work", "emptyDir": work}


def ephemeral_request(policy: Policy, *,
                      reader: bool = False) -> str | None:
    """What the pod requests as ephemeral-storage for a disk emptyDir work dir
    (the scheduler must find a node with room for it); None otherwise: memory
    counts against memory, the node's disk against the local tier's capacity."""
    if policy.memory_limit or work_on_node(policy, reader=reader):
        return None
    return units.format_quantity(work_size(policy))


def trainer_mount(policy: Policy, *,
                  reader: bool = False) -> dict[str, Any]:
    """The trainer's /ckptdrain/work. On the node, the local tier's volume with
    a subPathExpr: the trainer sees only its own pod's work dir, never the
    tier's steps. It reads CKPTDRAIN_WORK_NAME from the container's own
    environment, which the webhook sets in every trainer container
    (pod_env.trainer_env) and in prepare's."""
    if not work_on_node(policy, reader=reader):
        return {"name": "ckptdrain-work", "mountPath": WORK_DIR}
    return {"name": "ckptdrain-local", "mountPath": WORK_DIR,
            "subPathExpr": f"$({Env.WORK_NAME.value})"}


def shared_group(pod: Mapping[str, Any]) -> int:
    """The group the work dir is shared through: the pod's fsGroup, else ours."""
    context = pod.get("spec", {}).get("securityContext") or {}
    group = context.get("fsGroup")
    return SHARED_GROUP if group is None else int(group)


def group_env(pod: Mapping[str, Any], policy: Policy, *,
              reader: bool = False) -> list[dict[str, Any]]:
    """Restore's own, with the work dir on the node: the group it gives the
    pod's work dir (`shared_group`); nothing otherwise."""
    if not work_on_node(policy, reader=reader):
        return []
    return [{"name": Env.WORK_GROUP.value, "value": str(shared_group(pod))}]


def security_context_ops(pod: Mapping[str, Any]) -> JSONPatch:
    """Ops giving a pod without an fsGroup ours, with `OnRootMismatch` (the
    kubelet walks a volume to change its group only when its root differs);
    the pod's own fsGroup, and every other field of its securityContext, stay."""
    context = pod.get("spec", {}).get("securityContext")
    if context is not None and context.get("fsGroup") is not None:
        return []
    ours: dict[str, Any] = {"fsGroup": SHARED_GROUP, "fsGroupChangePolicy": "OnRootMismatch"}
    if context is None:
        return [{"op": "add", "path": "/spec/securityContext", "value": ours}]
    return [{"op": "add", "path": f"/spec/securityContext/{key}", "value": value}
            for key, value in ours.items() if key not in context]
