"""What the mutating webhook adds to a selected pod, as JSONPatch ops.

Pure: `build_pod_patch(pod, policy, config)` follows docs/pod-contract.md
exactly (the node tier as a hostPath with the root prepare container,
admission/prepare.py, or as the CSI driver's inline volume; restore init
container first, the agent as a native sidecar, the volumes, env,
annotations; with the peer tier on, the peer sidecar before restore,
policy/peer_tier.py; the work dir where admission/work_dir.py puts it, and
the pod's fsGroup that shares it; the store identity of restore and the
agent, admission/tenant_identity.py or cloud_identity.py, and the
trainer's where its policy asks). An already-injected pod yields []; on
reinvocation `reinvocation_patch` follows what later webhooks did. `grace_problem`
says when terminationGracePeriodSeconds is too short to flush one shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptdrain import units
from ckptdrain.contract.api import (
    ANNOTATION_AGENT_IMAGE,
    ANNOTATION_BANDWIDTH,
    ANNOTATION_INJECTED,
    ANNOTATION_POLICY,
    ANNOTATION_WORKLOAD_WRITERS,
    LABEL_POLICY,
    LABEL_READER,
    LABEL_WRITER,
    LABEL_WRITER_POLICY,
    policy_labelled,
)
from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.contract.env import CREDENTIALS
from ckptdrain.operator import containers
from ckptdrain.operator.admission import (
    cloud_identity,
    prepare,
    resources,
    tenant_identity,
    work_dir,
)
from ckptdrain.operator.admission.node_volume import local_volume
from ckptdrain.operator.admission.patch import JSONPatch, append, pointer
from ckptdrain.operator.admission.pod_env import (
    AGENT_METRICS_PORT,
    LOCAL_DIR,
    SHARE_DIR,
    WEBHOOK_OWNED,
    WORK_DIR,
    agent_env,
    earlier_stores_env,
    grace_seconds,
    restore_mode_env,
    trainer_env,
    work_on_node,
)
from ckptdrain.operator.admission.pod_placement import placement_ops
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import peer_tier, storage_options
from ckptdrain.operator.policy.class_placement import ANYWHERE, Placement
from ckptdrain.operator.policy.spec import Policy

RESTORE = "ckptdrain-restore"
AGENT = "ckptdrain-agent"
RUN_AS = prepare.RUN_AS
PREPARE = prepare.PREPARE

SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
    "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}


def _container(name: str, command: str, env: list[dict[str, Any]], config: OperatorConfig,
               mounts: list[tuple[str, str]], sidecar: bool,
               resources: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name, "image": config.image, "imagePullPolicy": config.image_pull_policy,
        "command": ["ckptdrain", command], "env": env,
        "volumeMounts": [{"name": v, "mountPath": p} for v, p in mounts],
        "securityContext": dict(SECURITY_CONTEXT),
        "resources": resources,
    }
    if sidecar:
        # Native sidecar: starts before the trainer, stops after it, and never
        # blocks the pod from completing.
        container["restartPolicy"] = "Always"
        container["ports"] = [{"name": "agent-metrics", "containerPort": AGENT_METRICS_PORT}]
    return container


def volumes(policy: Policy, *, prepare: bool = True, reader: bool = False,
            csi_driver: str | None = None) -> list[dict[str, Any]]:
    """The volumes ckptdrain adds (`ckptdrain-local`: local_volume). A reader
    has no agent, so no bandwidth share. No `ckptdrain-work` when the work
    dir is on the node (admission/work_dir.py)."""
    work = work_dir.volume(policy, reader=reader)
    return [
        local_volume(policy, prepare=prepare, reader=reader, csi_driver=csi_driver),
        *([] if work is None else [work]),
        *([] if reader else [{"name": "ckptdrain-share", "downwardAPI": {"items": [{
            "path": "bandwidth",
            "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_BANDWIDTH}']"}}]}}]),
        {"name": "ckptdrain-tmp", "emptyDir": {}},
        *storage_options.volumes(policy.storage_options),
        *peer_tier.volumes(policy.peer, policy.name),
    ]


def peer_sidecar(shared: list[dict[str, Any]], policy: Policy,
                 config: OperatorConfig, *, equal: bool = False) -> dict[str, Any]:
    """`ckptdrain peer`: serves the partner area and, read-only, this writer's
    local tier. It mounts the local tier (the partner area lives in it), the
    peer credentials and the peers document; no work dir, no share, and it
    gets no store credentials: it never talks to the store."""
    store_keys = {c.value for c in CREDENTIALS}
    env = [e for e in shared if e["name"] not in store_keys]
    sidecar = _container(peer_tier.PEER, "peer", env, config, [
        ("ckptdrain-local", LOCAL_DIR), ("ckptdrain-tmp", "/tmp")], sidecar=True,
        resources=resources.injected(containers.PEER, policy.containers, equal=equal))
    sidecar["volumeMounts"] += peer_tier.mounts(policy.peer)
    sidecar["ports"] = peer_tier.sidecar_ports()
    return sidecar


def is_injected(pod: Mapping[str, Any]) -> bool:
    annotations = pod.get("metadata", {}).get("annotations") or {}
    names = {c.get("name") for c in pod.get("spec", {}).get("initContainers") or []}
    return ANNOTATION_INJECTED in annotations or AGENT in names


def build_pod_patch(pod: Mapping[str, Any], policy: Policy, config: OperatorConfig,
                    default_rate: float, rank: int | None = None,
                    workload_writers: int | None = None, *, reader: bool = False,
                    readers_alongside: bool = False,
                    earlier: Sequence[EarlierStore] = (),
                    placement: Placement = ANYWHERE) -> JSONPatch:
    """JSONPatch ops that inject ckptdrain into `pod`; [] if already injected.
    With a `rank`, the pod also gets the `ckptdrain.io/writer` label, which
    admission selects on to find a live pod already holding that rank;
    `workload_writers` (what the workload says) is kept as an annotation for
    the operator's WritersConsistent condition. A `reader` (its `rank` is the
    shard it reads) gets restore alone, with the local tier read-only: no
    agent, no peer server, no root container, no writer label. `earlier`:
    where the policy's checkpoints were before its store moved, for restore;
    `placement`: its class's nodes (policy/class_placement.py)."""
    if is_injected(pod):
        return []
    spec = pod.get("spec", {})
    ops: JSONPatch = []
    shared = agent_env(pod, policy, default_rate, rank, reader=reader,
                       readers_alongside=readers_alongside)
    # On the node, agent and restore see the work dir inside /ckptdrain/local.
    work = [] if work_on_node(policy, reader=reader) else [("ckptdrain-work", WORK_DIR)]
    # Limits equal to requests where the pod is (or must be) Guaranteed.
    equal = resources.stays_guaranteed(pod, policy.containers)
    restore = _container(RESTORE, "restore", [
        *shared, restore_mode_env(), *earlier_stores_env(earlier),
        *work_dir.group_env(pod, policy, reader=reader)], config, [
        ("ckptdrain-local", LOCAL_DIR), *work, ("ckptdrain-tmp", "/tmp")], sidecar=False,
        resources=resources.injected(containers.RESTORE, policy.containers, equal=equal))
    if reader:  # it reads the writer's copies on this node, never changes them
        restore["volumeMounts"][0]["readOnly"] = True
    agent = None if reader else _container(AGENT, "agent", shared, config, [
        ("ckptdrain-local", LOCAL_DIR), *work,
        ("ckptdrain-share", SHARE_DIR), ("ckptdrain-tmp", "/tmp")], sidecar=True,
        resources=resources.injected(containers.AGENT, policy.containers, equal=equal))
    stores = [restore] if agent is None else [restore, agent]
    # The platform's identity for this namespace, in our containers alone;
    # else the one a platform webhook that ran before ours gave the trainer.
    tenant = tenant_identity.chosen(policy, config.identities)
    google = tenant_identity.google_env(tenant_identity.google_account(
        policy, config.google_accounts))
    identity = cloud_identity.ambient(pod)
    for container in stores:  # a private CA, by reference
        container["volumeMounts"] += storage_options.mounts(policy.storage_options)
        container["volumeMounts"] += peer_tier.mounts(policy.peer)
        env, mounts = (cloud_identity.additions(container, identity) if tenant is None else
                       (tenant_identity.env(tenant, policy.namespace), [tenant_identity.mount()]))
        container["env"] = [*container["env"], *env, *google]  # the agent's is `shared`
        container["volumeMounts"] += mounts
    # The reason restore failed, as the container's last state on the pod.
    restore["terminationMessagePolicy"] = "FallbackToLogsOnError"
    request = work_dir.ephemeral_request(policy, reader=reader)
    if request is not None:
        # A disk emptyDir counts against the pod's ephemeral storage: the
        # scheduler must find a node with room for it.
        resources.add_request(stores[-1]["resources"], "ephemeral-storage", request)
    ours = list(stores)
    if policy.peer.enabled and not reader:
        # Before restore: after a node loss the whole job restarts, and every
        # pod's restore asks the other nodes' peer servers (docs/peer-tier.md).
        ours.insert(0, peer_sidecar(shared, policy, config, equal=equal))
    # The CSI driver owns the data, restore makes the work dir: no root container.
    if config.prepare_local_tier and not config.csi and not reader:
        ours.insert(0, prepare.container(policy, config, work_dir.shared_group(pod), rank,
                                         equal=equal))
    if spec.get("initContainers") is None:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": ours})
    else:
        ops.extend({"op": "add", "path": f"/spec/initContainers/{i}", "value": c}
                   for i, c in enumerate(ours))
    # A pod volume named like one of ours is kept: admission refuses a pod
    # whose token volume is not exactly ours (tenant_identity.volume_problem).
    taken = {v.get("name") for v in spec.get("volumes") or []}
    append(ops, "/spec/volumes", spec.get("volumes"),
            [v for v in [*volumes(policy, prepare=config.prepare_local_tier, reader=reader,
                                  csi_driver=config.csi_driver if config.csi else None),
                         *([] if tenant is None else [tenant_identity.volume(tenant)])]
             if v["name"] not in taken])
    # Only where the policy asks: else the trainer holds no store credentials.
    trainer_identity = tenant_identity.for_trainer(policy, tenant)
    given: list[str] = []
    for i, container in enumerate(spec.get("containers") or []):
        ours_env = trainer_env(pod, policy, rank, reader=reader)
        id_env, id_mounts = ([], []) if trainer_identity is None else \
            tenant_identity.trainer_additions(container, trainer_identity, policy.namespace)
        if id_mounts:
            given.append(container.get("name"))
        owned = {e["name"] for e in ours_env} & WEBHOOK_OWNED
        # The pod's own entries of what the work dir's mount reads go (from
        # the end, so each index still holds), and ours are appended: another
        # value would mount another dir than the agent's (rules.py warns).
        ops.extend({"op": "remove", "path": f"/spec/containers/{i}/env/{j}"}
                   for j in _owned_entries(container, owned)[::-1])
        have = {e.get("name") for e in container.get("env") or []} - owned
        append(ops, f"/spec/containers/{i}/env", container.get("env"),
                [*(e for e in ours_env if e["name"] not in have), *id_env])
        mounted = {m.get("mountPath") for m in container.get("volumeMounts") or []}
        append(ops, f"/spec/containers/{i}/volumeMounts", container.get("volumeMounts"),
                [*([] if WORK_DIR in mounted
                   else [work_dir.trainer_mount(policy, reader=reader)]),
                 *id_mounts])
    ops.extend(work_dir.security_context_ops(pod))
    ops.extend(placement_ops(spec, policy, placement))
    # With a Secret, or the namespace's own identity, restore and the agent
    # use that: a platform webhook after ours must leave them alone, and the
    # application containers given the namespace's identity too.
    reach_store = [] if policy.credentials is not None or tenant is not None else stores
    ops.extend(_metadata_ops(pod, policy, default_rate, rank, workload_writers, reader,
                             skip=[*(c["name"] for c in ours if c not in reach_store), *given],
                             image=config.image))
    return ops


def _owned_entries(container: Mapping[str, Any], owned: set[str]) -> list[int]:
    return [j for j, e in enumerate(container.get("env") or []) if e.get("name") in owned]


def replaced_env(pod: Mapping[str, Any], policy: Policy, *,
                 reader: bool = False) -> list[str]:
    """One line per trainer container's own entry that build_pod_patch
    replaces with the webhook's (WEBHOOK_OWNED), naming it: said as an
    admission warning, never silently."""
    if not work_on_node(policy, reader=reader):
        return []
    return [f"ckptdrain: spec.containers[{i}].env: {e['name']} is set by ckptdrain (the work "
            f"dir's subPathExpr reads it); the pod's own value {_shown(e)} is replaced"
            for i, c in enumerate(pod.get("spec", {}).get("containers") or [])
            for e in (c.get("env") or []) if e.get("name") in WEBHOOK_OWNED]


def _shown(entry: Mapping[str, Any]) -> str:
    return repr(entry["value"]) if "value" in entry else "(from valueFrom)"


def _metadata_ops(pod: Mapping[str, Any], policy: Policy, default_rate: float,
                  rank: int | None, workload_writers: int | None, reader: bool,
                  skip: list[str], image: str) -> JSONPatch:
    """The labels and annotations an injected pod gets; `skip`: the
    containers that never reach the store (cloud_identity.skip_annotation)."""
    ops: JSONPatch = []
    labels: dict[str, str] = {}
    if rank is not None and reader:
        labels[LABEL_READER] = str(rank)
    elif rank is not None:
        labels[LABEL_WRITER] = str(rank)
        if policy_labelled(policy.name):
            # What admission finds a rank's holders by (apiserver/reads.writer_selectors).
            labels[LABEL_WRITER_POLICY] = policy.name
    if policy.peer.enabled or policy_labelled(policy.name):
        # What policy admission finds this policy's live pods by
        # (apiserver/reads.first_injected_pod), and what a NetworkPolicy
        # selects to let only this policy's pods reach each other's peer
        # port (docs/peer-tier.md).
        labels[LABEL_POLICY] = policy.name
    if labels and pod.get("metadata", {}).get("labels") is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
    elif labels:
        ops.extend({"op": "add", "path": f"/metadata/labels/{pointer(k)}", "value": v}
                   for k, v in labels.items())
    annotations = {ANNOTATION_POLICY: policy.name, ANNOTATION_INJECTED: "true"}
    if not reader:
        annotations[ANNOTATION_BANDWIDTH] = str(int(default_rate))
    if workload_writers is not None and not reader:
        annotations[ANNOTATION_WORKLOAD_WRITERS] = str(workload_writers)
    existing = pod.get("metadata", {}).get("annotations")
    skipped = cloud_identity.skip_annotation(existing, skip)
    # What the pod runs, whatever its template said (admission/agent_pin.py).
    ran = {ANNOTATION_AGENT_IMAGE: image}
    if existing is None:
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {**annotations, **skipped, **ran}})
    else:
        ops.extend({"op": "add", "path": f"/metadata/annotations/{pointer(k)}", "value": v}
                   for k, v in annotations.items() if k not in existing)
        ops.extend({"op": "add", "path": f"/metadata/annotations/{pointer(k)}", "value": v}
                   for k, v in {**skipped, **ran}.items())  # added to, or over, the pod's own
    return ops


def reinvocation_patch(pod: Mapping[str, Any]) -> JSONPatch:
    """JSONPatch ops for an injected pod that webhooks after ours changed
    (the apiserver calls ours again: reinvocationPolicy IfNeeded). The
    identity a platform webhook gave the trainer reaches restore and the
    agent (admission/cloud_identity.py); a sidecar whose `restartPolicy: Always` a
    webhook built on older Kubernetes types dropped gets it back, else it
    would run as a plain init container that never exits and the pod would
    never start. A container holding its namespace's own identity
    (admission/tenant_identity.py) gets nothing of the trainer's. [] when
    nothing needs doing."""
    ops: JSONPatch = []
    identity = cloud_identity.ambient(pod)
    for i, container in enumerate(pod.get("spec", {}).get("initContainers") or []):
        name = container.get("name")
        if name in (AGENT, peer_tier.PEER) and container.get("restartPolicy") != "Always":
            ops.append({"op": "add", "path": f"/spec/initContainers/{i}/restartPolicy",
                        "value": "Always"})
        if name in (RESTORE, AGENT) and not tenant_identity.holds(container):
            env, mounts = cloud_identity.additions(container, identity)
            append(ops, f"/spec/initContainers/{i}/env", container.get("env"), env)
            append(ops, f"/spec/initContainers/{i}/volumeMounts",
                    container.get("volumeMounts"), mounts)
    return ops


def grace_problem(pod: Mapping[str, Any], policy: Policy, share: float,
                  config: OperatorConfig) -> str | None:
    """Why the pod's grace period cannot flush one shard at `share` bytes/s, or None."""
    if not policy.sigterm:
        return None
    shard = policy.checkpoint_bytes / policy.writers
    needed = shard / share / config.grace_margin
    have = grace_seconds(pod)
    if have >= needed:
        return None
    return (f"spec.terminationGracePeriodSeconds: {have}s is too short to flush one checkpoint "
            f"shard ({units.format_bytes(shard)}) at this pod's share "
            f"({units.format_rate(share)}); expected at least {int(needed) + 1}s "
            f"(with a {units.format_percent(config.grace_margin)} margin)")
