"""Admission's rules, shared by the two places that serve it (the admission
process, admission/process.py, and Kopf's server in the operator's process,
admission/webhook.py), and free of Kopf: which policy selects a pod, the pod's role
(writer or reader) and rank, the patch that injects the policy, and whether a
policy can be honoured. The patch and the checks are pure (`injection`,
`policy`, `identity`, `roles`); the reads are the apiserver's (`kube`): the
namespace's policies when no view names one, the pod's owners (one GET
each, kept a few seconds), and the live holders of a rank.

Identity: the pod's rank comes from its workload (`identity`), its role
from its annotation and the policy (`roles`); a pod without a rank under a
multi-writer policy, one that can be neither writer nor reader, or a writer
claiming a rank a live pod of the policy holds (found by the
`ckptdrain.io/writer` and `ckptdrain.io/writer-policy` labels) is refused.
Two writers admitted at the same instant can both pass; the policy's
WritersConsistent condition shows that afterwards, and the writer lease
fences them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.admission import (
    agent_images,
    cloud_identity,
    injection,
    nesting,
    node_volume,
    own_mounts,
    tenant_identity,
    unselected,
)
from ckptdrain.operator.admission.owner_cache import OwnerCache
from ckptdrain.operator.admission.refusal import READ_ERRORS, Refused, named_namespace
from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import (
    class_placement,
    classes,
    history,
    identity,
    peer_tier,
    roles,
    version_messages,
)
from ckptdrain.operator.policy import spec as pol

#: The webhooks' ids, which are also the paths they are served at.
MUTATE_ID = "ckptdrain-inject"
VALIDATE_ID = "ckptdrain-policy"
#: A policy created without a class gets the default class's name.
MUTATE_POLICY_ID = "ckptdrain-policy-class"


def _selecting(labels: dict[str, str], bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [b for b in bodies
             if b and pol.selector_matches(b.get("spec", {}).get("selector") or {}, labels)]
    return sorted(found, key=lambda b: b["metadata"]["name"])


#: A policy as `policy_by_label` files it: its namespace and one label pair
#: its selector requires (None, None: its selector requires no label value).
LabelKey = tuple[str, str | None, str | None]


def label_key(namespace: str, selector: Mapping[str, Any] | None) -> LabelKey:
    """The first matchLabels pair (sorted) a policy's selector requires: a pod
    without that label cannot be selected, so admission need not look."""
    pairs = sorted(((selector or {}).get("matchLabels") or {}).items())
    if not pairs or not all(isinstance(v, str) for _, v in pairs):
        return (namespace, None, None)
    return (namespace, str(pairs[0][0]), pairs[0][1])


def default_share(p: pol.Policy, status: Mapping[str, Any] | None = None) -> float:
    """The share written into the pod at admission: the policy's budget split
    among its writers. It is what the agent uses when it cannot see its share
    channel, so it must fit the budget on its own: the joint budget the status
    reports when it is smaller than the policy's sizing alone (the cluster cap
    scaled every policy down)."""
    budget = sizing.compute(p.sizing_input).allowed_bandwidth
    joint = (status or {}).get("allowedBandwidthBytes")
    if isinstance(joint, int) and not isinstance(joint, bool) and 0 < joint < budget:
        budget = float(joint)
    share = budget / p.writers
    return min(share, p.per_drainer_cap) if p.per_drainer_cap else share


#: Owner kinds whose fields give the writer count, by the apiVersion/plural to read.
_PLURALS = {"Job": "jobs", "JobSet": "jobsets", "PyTorchJob": "pytorchjobs"}
LWS_API = "leaderworkerset.x-k8s.io/v1"


#: Owners read at admission, kept a few seconds: a job of N pods costs one
#: read of its Job and JobSet, not N (admission/owner_cache.py).
_owner_objects = OwnerCache(lambda *ref: apiserver_reads.read_object(*ref))


def _owner(namespace: str, obj: dict[str, Any], kind: str,
           fetch: bool = True) -> dict[str, Any] | None:
    ref = identity.controller_of(obj)
    if ref is None or ref[1] != kind:
        return None
    if not fetch:
        return _owner_objects.peek(ref[0], _PLURALS[kind], namespace, ref[2], ref[3])
    return _owner_objects.get(ref[0], _PLURALS[kind], namespace, ref[2], ref[3])


def _owners_known(namespace: str, pod: dict[str, Any]) -> identity.Owners | None:
    """The owners when no read is needed (none to read, or all kept): the
    admission then stays on the event loop, with no hop to a thread and back
    (which, on a busy loop, waits behind every event queued meanwhile).
    None: something must be read."""
    labels = pod.get("metadata", {}).get("labels") or {}
    if identity.LWS_NAME in labels:
        lws = _owner_objects.peek(LWS_API, "leaderworkersets", namespace,
                                  labels[identity.LWS_NAME])
        return None if lws is None else identity.Owners(leaderworkerset=lws)
    kind = "PyTorchJob" if identity.PYTORCH_TYPE in labels else "Job"
    if identity.controller_of(pod) is None or identity.controller_of(pod)[1] != kind:
        return identity.Owners()
    first = _owner(namespace, pod, kind, fetch=False)
    if first is None:
        return None
    if kind == "PyTorchJob":
        return identity.Owners(pytorchjob=first)
    if identity.controller_of(first) is None or identity.controller_of(first)[1] != "JobSet":
        return identity.Owners(job=first)
    jobset = _owner(namespace, first, "JobSet", fetch=False)
    return None if jobset is None else identity.Owners(job=first, jobset=jobset)


def _owners(namespace: str, pod: dict[str, Any]) -> identity.Owners:
    """The workload objects above a pod, as far as they can be read (best effort:
    what is missing makes the identity less certain, and `identity` says so)."""
    labels = pod.get("metadata", {}).get("labels") or {}
    if identity.LWS_NAME in labels:
        return identity.Owners(leaderworkerset=_owner_objects.get(
            LWS_API, "leaderworkersets", namespace, labels[identity.LWS_NAME]))
    if identity.PYTORCH_TYPE in labels:
        return identity.Owners(pytorchjob=_owner(namespace, pod, "PyTorchJob"))
    job = _owner(namespace, pod, "Job")
    jobset = _owner(namespace, job, "JobSet") if job is not None else None
    return identity.Owners(job=job, jobset=jobset)


def pod_label(pod: dict[str, Any]) -> str:
    """The pod's name; a controller's pod has only its generateName at admission."""
    meta = pod.get("metadata", {})
    return meta.get("name") or f"{meta.get('generateName', '')}<generated>"


async def _identity(pod: dict[str, Any], namespace: str, p: pol.Policy
                    ) -> identity.Identity | None:
    """The pod's identity from its workload (None: no rank, one writer).
    Refuses a pod without a rank when the policy has several writers."""
    owners = _owners_known(namespace, pod)
    if owners is None:
        owners = await asyncio.to_thread(_owners, namespace, pod)
    try:
        found = identity.derive(pod, p.identity, owners)
    except identity.RankMissing as error:
        if p.writers == 1:
            return None
        raise Refused(
            f"pod {pod_label(pod)} ({error.kind}) has no writer rank: {error.missing}; "
            f"policy {p.name} has {p.writers} writers", code=422) from None
    if found.rank is None and p.writers > 1:
        raise Refused(
            f"pod {pod_label(pod)} ({found.kind}) has no writer rank: none of the Job, JobSet, "
            "TrainJob, PyTorchJob or LeaderWorkerSet labels is set; name the label or "
            f"annotation that holds it in spec.identity of policy {p.name} "
            f"({p.writers} writers)", code=422)
    return found


async def pod_role(pod: dict[str, Any], namespace: str, p: pol.Policy, warnings: list[str],
                   holders_of: Callable[[int], list[str]] | None = None) -> roles.Role:
    """The pod's role under policy `p` (policy/roles.py): a writer of its
    rank, or a reader of a shard. Refuses (Refused) a pod that has no rank
    when the policy has several writers, one that can be neither role, and a
    writer whose rank a live pod of the policy holds (readers hold no rank:
    any number read one shard). `holders_of(rank)`: the live pods holding a
    rank, from the operator's own pod index (no API call when it names none);
    without it, the apiserver's watch cache is asked (a few matching pods, by
    label). When either names a holder, the apiserver is asked again for
    what is there now."""
    found = await _identity(pod, namespace, p)
    try:
        role = roles.assign(pod, found, p.writers, p.readers)
    except roles.RoleRefused as error:
        kind = found.kind if found is not None else "Pod"
        raise Refused(f"pod {pod_label(pod)} ({kind}): {error}", code=422) from None
    if role.warning:
        warnings.append(f"ckptdrain: policy {p.name}: {role.warning}; the checkpoint is "
                        f"complete only when {p.writers} writers committed it")
    if role.reader or role.shard is None or found is None:
        return role
    me = pod.get("metadata", {}).get("name")
    try:
        if holders_of is not None:
            live = holders_of(role.shard)
        else:  # a first look in the apiserver's watch cache: no read of etcd
            live = await asyncio.to_thread(apiserver_reads.live_writers, namespace, p.name,
                                           role.shard, True)
        if [n for n in live if n != me]:
            # No index, or the index names a holder: ask the apiserver. The
            # index may still hold a pod deleted a moment ago (a Job replacing
            # it), and a refusal must rest on what is there now.
            live = await asyncio.to_thread(apiserver_reads.live_writers, namespace, p.name,
                                           role.shard)
    except (apiserver_reads.ApiError, apiserver_reads.HTTPError) as error:
        # Unchecked is unsafe: refuse, and the pod's controller retries.
        raise Refused(
            f"pod {pod_label(pod)}: could not check whether a live pod already holds writer "
            f"{role.shard} of policy {p.name} ({error}); retry", code=503) from None
    holders = [n for n in live if n != me]
    if holders:
        raise Refused(
            f"pod {pod_label(pod)} ({found.kind}, {found.source}) claims writer {role.shard} "
            f"of policy {p.name}, which live pod {holders[0]} already holds; two pods must "
            "never write one shard", code=409)
    return role


def _identity_warnings(pod: dict[str, Any]) -> list[str]:
    return [f"ckptdrain: {problem}" for problem in cloud_identity.ambient(pod).problems]


async def class_catalogue(timeout: float = class_view.LIST_TIMEOUT_S) -> classes.Catalogue:
    """The CheckpointClasses: the process's view, or listed (within
    `timeout`) when it lags. Raises Refused (503, retry) naming the field
    and the kind when they cannot be read, never a bare error."""
    made = class_view.CLASSES.made(classes.catalogue)
    if made is not None:
        return made
    try:
        return await asyncio.to_thread(class_view.current, classes.catalogue,
                                       class_view.CLASSES, timeout)
    except READ_ERRORS as error:
        raise Refused(f"{classes.CLASS_FIELD}: could not read the CheckpointClasses "
                      f"({error}); retry", code=503) from None


async def admit_pod(pod: dict[str, Any], namespace: str, cfg: OperatorConfig,
                    warnings: list[str], logger: logging.Logger,
                    candidates: list[dict[str, Any]] | None,
                    holders: Callable[[str], Callable[[int], list[str]] | None] | None,
                    pinning: agent_images.Pinning | None = None,
                    every: list[dict[str, Any]] | None = None,
                    ) -> list[dict[str, Any]]:
    """The JSON patch that injects the policy selecting `pod` ([] to leave it
    as it is); raises Refused to refuse it (also, under
    CKPTDRAIN_UNSELECTED_PODS=Refuse, when no policy selects it). `candidates`: the
    policies of the namespace that could select the pod, from a view kept
    by a watch (None: no view to trust, ask the apiserver). `holders(policy)`:
    the live holders of each rank from a pod index (None: ask the apiserver).
    `pinning`: a writer keeps the agent image of its workload's other live
    writers (admission/agent_pin.py). `every`: the policies of all watched
    namespaces from a current view (None: ask the apiserver), for the node
    directory check of hostPath mode (policy/node_dirs.py)."""
    namespace = named_namespace(namespace, "Pod")
    if injection.is_injected(pod):
        # Called again after later webhooks changed the pod: follow them.
        ops = injection.reinvocation_patch(pod)
        tenant = any(tenant_identity.holds(c)
                     for c in pod.get("spec", {}).get("initContainers") or [])
        if tenant:
            # A webhook after ours may have given the trainer a role of its own.
            warnings.extend(tenant_identity.own_identities(pod, namespace))
        if ops:
            logger.info("pod injected earlier: %d ops after later webhooks", len(ops))
            if not tenant:
                warnings.extend(_identity_warnings(pod))
        return ops
    labels = dict(pod.get("metadata", {}).get("labels") or {})
    matches = _selecting(labels, candidates) if candidates is not None else []
    if not matches:
        # The view may lag (a policy created a moment ago) or be absent: ask
        # the apiserver before leaving a pod bare.
        listed = await asyncio.to_thread(apiserver_reads.list_policies, namespace)
        matches = _selecting(labels, listed)
    if not matches:
        # The apiserver's own answer (a quorum read), never a view that may
        # lag: a pod is refused only when no policy selects it now.
        if unselected.refuses(cfg):
            raise Refused(unselected.refusal(namespace, pod_label(pod), labels, listed),
                          code=422)
        warnings.append(unselected.admission_warning(namespace))
        return []
    if len(matches) > 1:
        names = ", ".join(m["metadata"]["name"] for m in matches)
        raise Refused(
            f"metadata.labels: expected exactly one CheckpointPolicy to select the pod, "
            f"got {len(matches)} ({names})", code=422)
    chosen = matches[0]
    catalogue = await class_catalogue()
    namespace_seen: dict[str, str] = {}
    if classes.needs_labels(chosen.get("spec", {}), catalogue):
        try:
            namespace_seen = await asyncio.to_thread(namespace_labels.recent, namespace,
                                                     cfg.namespace_recheck_s)
        except namespace_labels.LabelsUnreadable as error:
            # Never read, or not read for longer than a reading is trusted:
            # a retry, neither the policy invalid nor the namespace allowed.
            raise Refused(f"{classes.CLASS_FIELD}: {error}; retry", code=503) from None
    try:
        # Its class's settings (root, resources, image, stores) in place of
        # the operator's; a class that does not take it is as an invalid spec.
        resolution = classes.resolved(namespace, chosen.get("spec", {}), cfg, catalogue,
                                      lambda: namespace_seen)
        cfg = resolution.config
        p = pol.parse(namespace, chosen["metadata"]["name"], resolution.spec, cfg)
    except InvalidInput as error:
        # Said as the policy's own status says it: each problem in the
        # version its field was written at (policy/version_messages.py).
        problem = version_messages.message(error, version_messages.versions_of(chosen))
        if unselected.refuses(cfg):
            raise Refused(unselected.invalid_refusal(
                namespace, pod_label(pod), chosen["metadata"]["name"], problem),
                code=422) from None
        warnings.append(f"ckptdrain: policy {chosen['metadata']['name']} is invalid "
                        f"({problem}); not injected")
        return []
    # Never on the class's nodes: injected, it would wait forever
    # unscheduled. Pure, so before any read of the apiserver.
    off_nodes = class_placement.conflicts(pod.get("spec") or {}, resolution.placement,
                                          resolution.class_name)
    if off_nodes:
        raise Refused(f"pod {pod_label(pod)}, selected by CheckpointPolicy {p.name}: "
                      + "; ".join(map(str, off_nodes)), code=422)
    if not cfg.csi:
        await nesting.refuse_pod(p, namespace, chosen, cfg, every, logger)
    warnings.extend(f"ckptdrain: policy {p.name}: {note}" for note in p.resource_notes)
    peer_problem = peer_tier.not_ready(p.peer, chosen.get("status") or {})
    if peer_problem:
        # The pod would wait forever for a Secret volume that is not there.
        warnings.append(f"ckptdrain: policy {p.name}: {peer_problem}; "
                        "the pod runs without the peer tier")
        p = dataclasses.replace(p, peer=dataclasses.replace(p.peer, enabled=False))
    share = default_share(p, chosen.get("status"))
    role = await pod_role(pod, namespace, p, warnings,
                          holders(p.name) if holders is not None else None)
    # A reader flushes nothing: its grace period is its own business.
    problem = None if role.reader else injection.grace_problem(pod, p, share, cfg)
    if problem and p.grace_policy == "Refuse":
        raise Refused(problem, code=422)
    if problem:
        warnings.append(problem)
    warnings.extend(injection.replaced_env(pod, p, reader=role.reader))
    tenant = tenant_identity.chosen(p, cfg.identities)
    clash = own_mounts.problem(pod, {v["name"] for v in injection.volumes(
        p, reader=role.reader, csi_driver=cfg.csi_driver if cfg.csi else None)})
    clash = clash or (None if tenant is None else tenant_identity.volume_problem(pod, tenant))
    if clash is not None:
        raise Refused(f"pod {pod_label(pod)}: {clash}", code=422)
    group_problem = node_volume.mount_group_problem(pod, cfg.csi_min_mount_group) \
        if cfg.csi else None
    if group_problem is not None:
        raise Refused(f"pod {pod_label(pod)}: {group_problem}", code=422)
    choice = await agent_images.image_for(pod, namespace, p.name,
                                          not role.reader and role.shard is not None, cfg,
                                          pinning)
    if choice.note:
        warnings.append(f"ckptdrain: policy {p.name}: {choice.note}")
    if choice.image != cfg.image:
        logger.info("agent image %s for a pod of policy %s: %s", choice.image, p.key,
                    choice.note or "the newest recorded")
        cfg = dataclasses.replace(cfg, image=choice.image)
    ops = injection.build_pod_patch(
        pod, p, cfg, default_rate=share, rank=role.shard,
        workload_writers=role.workload_writers, reader=role.reader,
        readers_alongside=role.readers_alongside,
        earlier=history.told_to_restore(chosen, p, datetime.now(UTC)),
        placement=resolution.placement)
    if tenant is not None:
        # Nothing of the trainer's is carried; what the trainer holds is said.
        warnings.extend(tenant_identity.trainer_warnings(pod, p))
    elif p.credentials is None:  # with a Secret nothing is carried either
        warnings.extend(_identity_warnings(pod))
    logger.info("injecting policy %s into a pod (%d ops)", p.key, len(ops))
    return ops


