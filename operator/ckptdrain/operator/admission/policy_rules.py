"""Admission of a CheckpointPolicy (CREATE and UPDATE), shared by the
admission process (admission/process.py) and Kopf's server
(admission/webhook.py). Three refusals, in order:

1. a spec the operator cannot honour (validate_policy);
2. a selector that can pick a pod another policy of the namespace also
   picks (policy/conflicts.py), that one being deleted included, as pod
   admission counts it: such a pod could never be injected, so the policy
   is refused with one label set both would pick;
3. in hostPath mode, a `spec.localTier.path` that would make the
   namespace's node directory equal to, inside or around another
   namespace's (policy/node_dirs.py), judged against the admission
   process's view of every policy (admission/policy_mirror.py), or the
   apiserver's list while that view is not current; refused without
   naming the other namespace (the tenant may not read it);
4. a change of where checkpoints live (`spec.storage.uri`,
   `spec.localTier.path`) or of `spec.writers` while pods the policy
   injected live (policy/relocation.py): an UPDATE changing them, or a
   CREATE of a policy whose namesake's live pods were injected with other
   values (a policy deleted and created again, as `kubectl replace --force`
   does); refused naming one pod, with the way to move.

Beside the refusals, one warning: in CSI mode, when fresh reports of the
drivers' free space exist and no node has room for one writer
(admission/node_room.py); never a refusal.

An UPDATE that leaves the spec alone (labels, annotations, finalizers) or
of a policy being deleted is admitted unchecked: its spec was admitted
before, and refusing it under a maximum lowered since would leave the
object stuck (a finalizer never removed, a deletion never ending).

Refusals are 403 (the request is well formed, but not allowed now) or 422
(the spec itself is wrong), never 409: kubectl takes 409 for a write race,
retries it, and with --force deletes and recreates the object.

For the selector overlap, the other policies and the live pods are read
from the apiserver, not a watched view: policies are written rarely, and a view could miss a policy
created a moment ago, which is the very race (two creates at once) this
check exists for. All reads of one admission share one time budget, under
the webhook's timeout. A read that fails refuses (503): the policy webhook
fails closed. What still slips through (the webhook down, two creates at the
same instant) pod admission refuses pod by pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ckptdrain.contract.policy_versions import V1ALPHA1, VERSIONS, convert
from ckptdrain.operator.admission import node_room_read
from ckptdrain.operator.admission.nesting import every_policy
from ckptdrain.operator.admission.refusal import named_namespace
from ckptdrain.operator.admission.rules import (
    READ_ERRORS,
    Refused,
    class_catalogue,
)
from ckptdrain.operator.apiserver import namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import classes, conflicts, node_dirs, relocation, version_messages
from ckptdrain.operator.policy import spec as pol

log = logging.getLogger("ckptdrain.admission")
#: Not allowed now (a 409 would have kubectl retry, or recreate with --force).
FORBIDDEN = 403
Pod = dict[str, Any]


def moves_refused(name: str, fields: list[str], pod: str, *, creating: bool = False,
                  why: str = "") -> str:
    """The message refusing guarded `fields` while `pod` of policy `name`
    lives (`why`: relocation.why_live's reason, when known); `creating`: a
    CREATE whose namesake's pods live."""
    named = f"pod {pod}: {why}" if why else f"pod {pod}"
    ways = []
    if relocation.WRITERS_FIELD in fields:
        ways.append("to change spec.writers, suspend the job (its pods end), change the "
                    "policy, then resume: restore hands the newest step to the new writers "
                    "to reshard")
    if any(f != relocation.WRITERS_FIELD for f in fields):
        ways.append("to move checkpoints, create a policy of another name for the new "
                    "location, or set spec.relocation.reason ("
                    + ("any text" if creating else "a new text, in the same update")
                    + "); a pod's store is fixed when it is injected: running pods keep "
                    "writing to the old location and only pods created afterwards use the "
                    "new one, so restart the whole job together after the move (a single "
                    "recreated pod would write elsewhere than its peers)")
    if creating:
        head = (f"{', '.join(fields)}: pods injected for an earlier CheckpointPolicy "
                f"{name} still live ({named}) with another value, and a policy of the "
                "same name would change it under them")
    else:
        head = f"{', '.join(fields)}: cannot change while pods of policy {name} live ({named})"
    return f"{head}; {'; '.join(ways)}"


async def admit_policy(body: Mapping[str, Any], old: Mapping[str, Any] | None,
                       namespace: str, cfg: OperatorConfig,
                       written_in: str | None = None,
                       every: list[dict[str, Any]] | None = None,
                       warnings: list[str] | None = None) -> None:
    """Refuse (Refused) a policy CREATE or UPDATE (`old`: the stored object).
    `written_in`: the apiVersion the request was made at, when the body
    was converted for this webhook (the body and `old` are judged converted
    back to it); None: the body's own. The spec's problems are said in it
    (policy/version_messages.py). `every`: the
    policies of all watched namespaces from a current view (None: ask the
    apiserver). `warnings` gets what the admission answer should warn of
    (admission/node_room_read.py: no node reports room for one writer)."""
    body = as_written(body, written_in)
    old = None if old is None else as_written(old, written_in)
    meta = body.get("metadata") or {}
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    name = str(meta.get("name") or "")
    namespace = named_namespace(namespace or str(meta.get("namespace") or ""),
                                "CheckpointPolicy")
    old_spec = (old or {}).get("spec")
    old_spec = old_spec if isinstance(old_spec, Mapping) else None
    if old is not None and (meta.get("deletionTimestamp") or old_spec == spec):
        # Metadata or finalizers only (a label, a GitOps annotation, the
        # garbage collector removing its finalizer), or any update of a
        # policy being deleted: the spec was admitted before, and refusing
        # it now (a maximum lowered since) would leave the object stuck.
        return
    # One budget for every read below (the classes first), within the
    # webhook's timeout.
    deadline = time.monotonic() + apiserver_reads.ADMISSION_READ_TIMEOUT_S
    base = cfg
    cfg, classed = await _class_of(spec, namespace, base, deadline)
    validate_policy(classed, name, cfg, written_in or str(body.get("apiVersion") or V1ALPHA1))
    selector = spec.get("selector")
    if old_spec is None or old_spec.get("selector") != selector:
        await _refuse_overlap(name, namespace,
                              selector if isinstance(selector, Mapping) else {}, deadline)
    path = (classed.get("localTier") or {}).get("path")
    if not cfg.csi and isinstance(path, str) and (
            old_spec is None or (old_spec.get("localTier") or {}).get("path") != path):
        await _refuse_nesting(name, namespace, path, cfg, every, deadline)
    if old_spec is not None:
        await _refuse_moves(name, namespace, relocation.refused(old_spec, spec), deadline)
    else:
        await _refuse_create_over_live(name, namespace, classed, cfg, deadline)
    # Checked before the old spec's class is resolved (it may read the
    # namespace's labels): no read for a warning that is off.
    if warnings is not None and cfg.csi and cfg.csi_capacity_namespace:
        said = await _room_warning(classed, old_spec, namespace, name, base, cfg, deadline)
        if said is not None:
            warnings.append(said)


async def _room_warning(classed: Mapping[str, Any], old_spec: Mapping[str, Any] | None,
                        namespace: str, name: str, base: OperatorConfig, cfg: OperatorConfig,
                        deadline: float) -> str | None:
    """The free-space warning, for a CREATE or an UPDATE that changes what
    one writer keeps: both specs compared with their class applied, as they
    are judged (a class may fill in what the bare spec needs to parse)."""
    if old_spec is not None:
        try:
            old_cfg, old_classed = await _class_of(old_spec, namespace, base, deadline)
        except Refused:
            old_cfg, old_classed = cfg, None  # its class gone or changed: judged anew
        if not node_room_read.need_changed(classed, old_classed, namespace, name, cfg,
                                           old_cfg):
            return None
    return await node_room_read.room_warning(classed, namespace, name, cfg, deadline)


def as_written(obj: Mapping[str, Any], written_in: str | None) -> Mapping[str, Any]:
    """`obj` in `written_in`, the version the request was made at, when the
    apiserver sent it converted (a webhook registered for one version, with
    matchPolicy Equivalent; neither the chart nor Kopf's own registration
    does that: webhook.admitted), so that each field is judged and named in
    the version written; otherwise `obj` itself. Converted there and back, a
    value is the same but may be respelled (a v1alpha1 perDrainer "2GB/s"
    is said as '2G', "1d" as '24h'): only a request sent as written is said
    as written."""
    if written_in not in VERSIONS or obj.get("apiVersion") not in VERSIONS \
            or obj.get("apiVersion") == written_in:
        return obj
    return convert(obj, written_in)


def validate_policy(spec: Mapping[str, Any], name: str, cfg: OperatorConfig,
                    written_in: str = V1ALPHA1) -> None:
    """Refuse (Refused) a policy the schema admits but the operator cannot
    honour, each problem said in `written_in`, the version of the request
    (policy/version_messages.py)."""
    errors = pol.validate(dict(spec), cfg, name=name)
    if errors:
        raise Refused("; ".join(str(version_messages.in_version(e, written_in))
                                for e in errors), code=422)


async def default_class_patch(body: Mapping[str, Any], warnings: list[str],
                              namespace: str = "") -> list[dict[str, Any]]:
    """The JSON patch binding a policy created without spec.checkpointClassName
    to the default class for its namespace: the oldest default class that
    allows it ([] without one: it stays classless for good). Raises Refused
    (503) when the classes, or the namespace's labels a default class asks
    for, cannot be read: a policy is never created classless while a
    default may exist."""
    spec = body.get("spec")
    if not isinstance(spec, Mapping) or spec.get("checkpointClassName"):
        return []
    namespace = named_namespace(
        namespace or str((body.get("metadata") or {}).get("namespace") or ""),
        "CheckpointPolicy")
    deadline = time.monotonic() + apiserver_reads.ADMISSION_READ_TIMEOUT_S
    catalogue = await class_catalogue(apiserver_reads.ADMISSION_READ_TIMEOUT_S)
    labels = None
    if classes.needs_labels(spec, catalogue):
        labels = await _labels(namespace, deadline)
    choice = classes.default_choice(catalogue, labels)
    if choice.cls is None:
        return []
    if choice.warning:
        warnings.append(f"ckptdrain: {choice.warning}")
    return [{"op": "add", "path": "/spec/checkpointClassName", "value": choice.cls.name}]


async def _class_of(spec: Mapping[str, Any], namespace: str, cfg: OperatorConfig,
                    deadline: float) -> tuple[OperatorConfig, Mapping[str, Any]]:
    """The configuration and spec its class makes of the policy; refuses
    (Refused) a policy its class does not take, naming the field and class,
    and (503) when the classes cannot be read by `deadline`."""
    catalogue = await class_catalogue(max(deadline - time.monotonic(), 0.001))
    labels: dict[str, str] = {}
    if classes.needs_labels(spec, catalogue):
        labels = await _labels(namespace, deadline)
    resolution = classes.resolve(namespace, spec, cfg, catalogue, lambda: labels)
    if not resolution.resolved:
        raise Refused(classes.condition(resolution)["message"], code=422)
    return resolution.config, resolution.spec


async def _labels(namespace: str, deadline: float) -> dict[str, str]:
    """The namespace's labels now (its class allows namespaces by label);
    Refused (503) when they cannot be read by `deadline`."""
    try:
        return await asyncio.to_thread(namespace_labels.fresh, namespace,
                                       max(deadline - time.monotonic(), 0.001))
    except READ_ERRORS as error:
        raise Refused(f"{classes.CLASS_FIELD}: could not read the labels of namespace "
                      f"{namespace}, which its CheckpointClass allows by label ({error}); retry",
                      code=503) from None


async def _refuse_overlap(name: str, namespace: str, selector: Mapping[str, Any],
                          deadline: float) -> None:
    try:
        others = await asyncio.to_thread(apiserver_reads.list_policies, namespace,
                                         max(deadline - time.monotonic(), 0.001))
    except READ_ERRORS as error:
        raise Refused(f"spec.selector: could not read the other CheckpointPolicies of "
                      f"{namespace} to check for overlap ({error}); retry", code=503) from None
    found = conflicts.first_overlap(name, selector, others)
    if found is not None:
        other, witness = found
        going = (" (being deleted: pod admission counts it until it is gone, and so an "
                 "overlapping policy waits until then)" if conflicts.deleting(other, others)
                 else "")
        raise Refused(
            f"spec.selector: overlaps CheckpointPolicy {other}{going} in {namespace}: a pod "
            f"labelled {conflicts.labels_text(witness)} would be selected by both, and a "
            "pod two policies select cannot be injected; make the selectors exclusive (e.g. "
            "a label one requires and the other excludes with NotIn)", code=FORBIDDEN)


async def _refuse_nesting(name: str, namespace: str, path: str, cfg: OperatorConfig,
                          every: list[dict[str, Any]] | None, deadline: float) -> None:
    others = await every_policy(cfg, every, max(deadline - time.monotonic(), 0.001),
                                node_dirs.FIELD)
    clash = node_dirs.first_clash(namespace, path, others)
    if clash is not None:
        # The platform team reads which policy is in the way here; the tenant
        # is not told (policy/node_dirs.py policy_refusal).
        log.info("policy %s/%s refused: %s %s nests with %s/%s's node directory %s",
                 namespace, name, node_dirs.FIELD, path, clash.namespace, clash.policy,
                 clash.directory)
        raise Refused(node_dirs.policy_refusal(namespace, path), code=FORBIDDEN)


def _live(namespace: str, deadline: float) -> Callable[[Pod], bool]:
    """counts_as_live with the controlling Job of a Failed pod read once."""
    jobs: dict[str, dict[str, Any] | None] = {}

    def live(pod: Pod) -> bool:
        job = relocation.controlling_job(pod)
        if (pod.get("status") or {}).get("phase") == "Failed" and job is not None \
                and job not in jobs:
            jobs[job] = apiserver_reads.job_or_none(namespace, job, deadline)
        return relocation.counts_as_live(pod, jobs.get(job) if job else None)
    return live


async def _first_live(name: str, namespace: str, fields: list[str], deadline: float,
                      wanted: Callable[[Pod], bool]) -> Pod | None:
    """The first live pod of `name` that is `wanted`: one search, page by page."""
    live = _live(namespace, deadline)
    try:
        return await asyncio.to_thread(apiserver_reads.first_injected_pod, namespace, name,
                                       lambda pod: wanted(pod) and live(pod), deadline)
    except READ_ERRORS as error:
        raise Refused(f"{', '.join(fields)}: could not check for live pods of policy {name} "
                      f"({error}); retry", code=503) from None


async def _refuse_moves(name: str, namespace: str, fields: list[str], deadline: float) -> None:
    if not fields:
        return
    pod = await _first_live(name, namespace, fields, deadline, lambda _: True)
    if pod is not None:
        raise Refused(moves_refused(name, fields, _pod_name(pod), why=relocation.why_live(pod)),
                      code=FORBIDDEN)


def expected_injection(spec: Mapping[str, Any], namespace: str, name: str,
                       cfg: OperatorConfig) -> dict[str, str]:
    """What a pod injected now under this (valid) spec is given, by guarded
    field, as relocation.injected_with reads it back from a pod."""
    p = pol.parse(namespace, name, spec, cfg)
    return {"spec.storage.uri": p.store_prefix(), "spec.localTier.path": p.node_path(),
            relocation.WRITERS_FIELD: str(p.writers)}


async def _refuse_create_over_live(name: str, namespace: str, spec: Mapping[str, Any],
                                   cfg: OperatorConfig, deadline: float) -> None:
    # A policy of this name deleted a moment ago may leave pods it injected:
    # they keep its store, path and writer count, whatever this one says.
    expected = expected_injection(spec, namespace, name, cfg)
    checked = relocation.refused_on_create(list(expected), spec)

    def wrong(pod: Pod) -> bool:
        return bool(relocation.refused_on_create(relocation.differs(pod, expected), spec))

    pod = await _first_live(name, namespace, checked, deadline, wrong)
    if pod is not None:
        fields = relocation.refused_on_create(relocation.differs(pod, expected), spec)
        raise Refused(moves_refused(name, fields, _pod_name(pod), creating=True,
                                    why=relocation.why_live(pod)), code=FORBIDDEN)


def _pod_name(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")
