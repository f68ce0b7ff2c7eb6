"""What the injected containers and the trainer are told: their environment, per the
pod contract (docs/pod-contract.md), and the paths inside the pod it names. Pure: the
pod patch (injection.py) puts these lists into the containers it adds.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from ckptdrain import units
from ckptdrain.contract import earlier_stores
from ckptdrain.contract.api import ANNOTATION_RESTORE, ROLE_READER, ROLE_WRITER
from ckptdrain.contract.env import Env
from ckptdrain.operator.policy import peer_tier, storage_options
from ckptdrain.operator.policy.spec import Policy

LOCAL_DIR, WORK_DIR, SHARE_DIR = "/ckptdrain/local", "/ckptdrain/work", "/ckptdrain/share"
AGENT_METRICS_PORT = 9108
DEFAULT_GRACE_SECONDS = 30


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _writer_id(rank: int | None) -> dict[str, Any]:
    """The rank the webhook derived (operator/policy/identity.py); without one (the
    policy has one writer), the pod name, which the agent takes as writer 0."""
    return {"value": str(rank)} if rank is not None else _field("metadata.name")


def grace_seconds(pod: Mapping[str, Any]) -> int:
    value = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_SECONDS if value is None else int(value)


def _env(name: Env, source: dict[str, Any] | str) -> dict[str, Any]:
    # The plain string: a patch is JSON, and a reader compares names as text.
    if isinstance(source, str):
        return {"name": name.value, "value": source}
    return {"name": name.value, **source}


def _role(reader: bool) -> str:
    return ROLE_READER if reader else ROLE_WRITER


def agent_env(pod: Mapping[str, Any], policy: Policy, default_rate: float,
              rank: int | None = None, *, reader: bool = False,
              readers_alongside: bool = False) -> list[dict[str, Any]]:
    """Environment shared by the agent and restore, per the pod contract. A
    reader's `rank` is the shard it reads."""
    env = [
        _env(Env.POLICY, policy.key),
        _env(Env.POD_NAME, _field("metadata.name")),
        _env(Env.POD_UID, _field("metadata.uid")),
        _env(Env.NAMESPACE, _field("metadata.namespace")),
        _env(Env.NODE_NAME, _field("spec.nodeName")),
        _env(Env.WRITER_ID, _writer_id(rank)),
        _env(Env.WRITERS, str(policy.writers)),
        _env(Env.ROLE, _role(reader)),
        _env(Env.READERS, "true" if reader or readers_alongside else "false"),
        _env(Env.STORE_URI, policy.store_prefix()),
    ]
    if policy.endpoint:
        env.append(_env(Env.S3_ENDPOINT, policy.endpoint))
    if policy.region:
        env.append(_env(Env.REGION, policy.region))
    if policy.credentials is not None:
        ref = policy.credentials
        for var, key in ((Env.ACCESS_KEY_ID, ref.access_key_id_key),
                         (Env.SECRET_ACCESS_KEY, ref.secret_access_key_key)):
            env.append(_env(var, {"valueFrom": {"secretKeyRef": {"name": ref.name, "key": key}}}))
    env += [
        _env(Env.WORK_DIR, ckptdrain_work_dir(policy, rank, reader=reader)),
        # The same directory as the trainer mounts it: what restore.json and
        # the resume answer name, so the trainer finds the step it points to.
        _env(Env.TRAINER_WORK_DIR, WORK_DIR),
        _env(Env.LOCAL_DIR, local_dir(policy)),
        _env(Env.LOCAL_KEEP, str(policy.local_keep)),
        _env(Env.GLOBAL_KEEP, str(policy.global_keep)),
        _env(Env.INTERVAL, units.format_duration(policy.interval_s)),
        _env(Env.GLOBAL_EVERY, str(policy.sizing_input.global_every)),
        _env(Env.OVERLAP, units.format_percent(policy.sizing_input.overlap)),
        _env(Env.SHARE_FILE, posixpath.join(SHARE_DIR, "bandwidth")),
        _env(Env.DEFAULT_RATE, str(int(default_rate))),
        _env(Env.GRACE_SECONDS, str(grace_seconds(pod))),
        _env(Env.METRICS_PORT, str(AGENT_METRICS_PORT)),
        _env(Env.RESTORE, "true" if policy.restore_enabled else "false"),
        _env(Env.RESTORE_PREFER, policy.restore_prefer),
        _env(Env.RESTORE_RETRY_DEADLINE, units.format_duration(policy.restore_retry_deadline_s)
             if policy.restore_retry_deadline_s > 0 else "0"),
        _env(Env.RESTORE_AGREE_TIMEOUT, units.format_duration(policy.restore_agree_timeout_s)
             if policy.restore_agree_timeout_s > 0 else "0"),
        _env(Env.RESTORE_DIRECT_IO, "true" if policy.restore_direct_io else "false"),
        _env(Env.RESTORE_RESHARD, policy.restore_reshard.lower()),
        _env(Env.STALL_TIMEOUT, units.format_duration(policy.stall_timeout_s)),
        *storage_options.env(policy.storage_options),
        *peer_tier.env(policy.peer),
    ]
    if policy.local_capacity is not None:
        env.append(_env(Env.LOCAL_CAPACITY, str(policy.local_capacity)))
    return env


def restore_mode_env() -> dict[str, Any]:
    """Restore's own: the pod's `ckptdrain.io/restore` annotation, read when the
    container starts (an annotation added while restore retries counts from
    its next start). Not the agent's: a mistyped value stops restore with one
    line, and must not also crash-loop the sidecar of a running pod."""
    return _env(Env.RESTORE_MODE, _field(f"metadata.annotations['{ANNOTATION_RESTORE}']"))


def earlier_stores_env(stores: Sequence[earlier_stores.EarlierStore]) -> list[dict[str, Any]]:
    """Restore's own: where the policy's checkpoints were before its store
    moved (policy/history.py), so that finding nothing at the new prefix is
    not taken for a fresh start. Nothing when there is no such place."""
    return [_env(Env.EARLIER_STORES, earlier_stores.encode(stores))] if stores else []


def local_dir(policy: Policy) -> str:
    """Where agent and restore keep this pod's local tier.

    The hostPath is per policy and node, and an indexed Job puts several
    writers on one node: each gets its own subdirectory (the writer id is a
    Job index by then; the agent refuses anything else when writers > 1), or
    they would capture over each other's steps. A reader's id is the shard
    it reads: it finds that writer's copies when this node holds them.
    """
    if policy.writers > 1:
        return f"{LOCAL_DIR}/writer-$({Env.WRITER_ID.value})"
    return LOCAL_DIR


def work_on_node(policy: Policy, *, reader: bool = False) -> bool:
    """Whether the trainer's work dir is on the local tier's disk (a writer
    under a disk local tier, hostPath or the CSI driver's volume), not an
    emptyDir: see admission/work_dir.py."""
    return not reader and not policy.memory_limit


def work_name(rank: int | None) -> str:
    """The work dir's name in the local tier's hostPath: one per POD,
    `work-<writer>-$(CKPTDRAIN_POD_UID)` (`<writer>`: the webhook's rank, 0
    with one writer). A Job's replacement pod may start on the node while the
    old one still terminates: with one dir per writer, the new pod's restore
    would empty the dir the old trainer saves its emergency checkpoint into.
    The writer is written here, not taken from CKPTDRAIN_WRITER_ID, which a
    trainer may set itself: its dir must be the one its agent watches."""
    return f"work-{0 if rank is None else rank}-$({Env.POD_UID.value})"


def work_name_env(rank: int | None) -> list[dict[str, Any]]:
    """The pod UID, then the work dir's name from it (kubelet expands `$(…)`
    only from entries defined earlier): the trainer's and prepare's own,
    which the work dir's subPathExpr reads."""
    return [_env(Env.POD_UID, _field("metadata.uid")), _env(Env.WORK_NAME, work_name(rank))]


def ckptdrain_work_dir(policy: Policy, rank: int | None = None, *,
                       reader: bool = False) -> str:
    """Where agent and restore see the trainer's work dir: on the node, through
    their own local-tier mount (a hard link cannot cross two mounts, even of
    one filesystem: EXDEV), else the work volume's own mount. Their
    CKPTDRAIN_POD_UID comes earlier in their environment."""
    if work_on_node(policy, reader=reader):
        return f"{LOCAL_DIR}/{work_name(rank)}"
    return WORK_DIR


def trainer_env(pod: Mapping[str, Any], policy: Policy, rank: int | None = None, *,
                reader: bool = False) -> list[dict[str, Any]]:
    """The trainer's environment; on the node, last, the entries its work dir's
    subPathExpr reads (WEBHOOK_OWNED: the webhook's values win over the pod's)."""
    return [
        _env(Env.WORK_DIR, WORK_DIR),
        _env(Env.RESTORE_RESULT, posixpath.join(WORK_DIR, "restore.json")),
        _env(Env.WRITER_ID, _writer_id(rank)),
        _env(Env.WRITERS, str(policy.writers)),
        _env(Env.ROLE, _role(reader)),
        *(work_name_env(rank) if work_on_node(policy, reader=reader) else []),
    ]


#: What the trainer's work dir mount reads from its environment: a trainer
#: container's own entry of either would mount another dir than its agent's.
WEBHOOK_OWNED = frozenset({Env.POD_UID.value, Env.WORK_NAME.value})
