"""Admission: a mutating webhook that injects ckptdrain into the pods a policy
selects, and a validating webhook for policies. Thin: the patch and the
checks are pure (`injection`, `policy`).

Writer identity: the pod's rank comes from its workload (`identity`), read
with its owners (Job, JobSet, PyTorchJob, LeaderWorkerSet: one GET each, best
effort); a pod without one under a multi-writer policy, or claiming a rank a
live pod of the policy holds (found by the `ckptdrain.io/writer` label), is
refused. Two pods admitted at the same instant can both pass; the policy's
WritersConsistent condition shows that afterwards.

Scope: the pod webhook's objectSelector matches only pods labelled
`ckptdrain.io/inject=true`, so it never blocks an unrelated pod; its
failurePolicy is Fail by default (an opted-in pod is not created
unprotected while no replica answers; sweep.py flags any that slip through
with Ignore). Every replica serves both webhooks (leadership.py). The
policy webhook fails closed: a policy the operator cannot check is refused.
Neither has side effects, so dry-run requests are answered the same way.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import kopf

from ckptdrain import sizing
from ckptdrain.contract import api
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import (
    cloud_identity,
    heap,
    identity,
    injection,
    kube,
    leadership,
    metrics,
    peer_tier,
    webhook_tls,
)
from ckptdrain.operator import policy as pol
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.owner_cache import OwnerCache

POLICIES = (api.GROUP, api.VERSION, api.POLICIES)


def _self_signed(host: str) -> tuple[str, str]:
    """A development certificate for `host` (kopf's own generator needs extras)."""
    directory = Path(tempfile.mkdtemp(prefix="ckptdrain-webhook-"))
    cert, key = directory / "tls.crt", directory / "tls.key"
    san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
         "-addext", f"subjectAltName={san},DNS:localhost"],
        check=True, capture_output=True)
    return str(cert), str(key)


def build_server(cfg: OperatorConfig, logger: logging.Logger) -> kopf.WebhookServer:
    """Kopf's webhook server with the certificate the operator keeps in its
    Secret (webhook_tls.py), cert-manager's mounted files, or a self-signed one.
    Kopf re-reads the files when they change (renewals)."""
    cert, key, ca = cfg.webhook_cert, cfg.webhook_key, cfg.webhook_ca
    if cfg.webhook_secret:
        directory = Path(tempfile.mkdtemp(prefix="ckptdrain-webhook-"))
        webhook_tls.start(cfg.webhook_secret, cfg.webhook_configs, cfg.webhook_host,
                          directory, logger)
        cert, key, ca = (str(directory / n) for n in ("tls.crt", "tls.key", "ca.crt"))
    elif cert is None or key is None:
        cert, key = _self_signed(cfg.webhook_host)
        ca = cert
    return kopf.WebhookServer(addr=cfg.webhook_addr, port=cfg.webhook_port,
                              host=cfg.webhook_host, certfile=cert, pkeyfile=key, cafile=ca,
                              file_check_interval=webhook_tls.CHECK_S)


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


@kopf.index(*POLICIES)
def policy_by_label(namespace: str, body: kopf.Body, spec: kopf.Spec,
                    **_: Any) -> dict[LabelKey, dict[str, Any]]:
    """Policies filed by a label pair they require, so an admission reads the
    few that could select the pod, not every policy of the namespace (at a
    thousand policies that scan was a fifth of the event loop's time)."""
    selector = spec.get("selector")
    return {label_key(namespace, selector if isinstance(selector, Mapping) else None):
            copy.deepcopy(dict(body))}


def _candidates(namespace: str, labels: Mapping[str, str],
                policies: kopf.Index[LabelKey, Any]) -> list[dict[str, Any]]:
    """Every indexed policy of the namespace that could select a pod with `labels`."""
    keys = [(namespace, k, v) for k, v in labels.items()] + [(namespace, None, None)]
    return [b for key in keys if key in policies for b in policies.get(key, [])]


def _indexed_holders(pods: kopf.Index[Any, Any], namespace: str, policy: str
                     ) -> Callable[[int], list[str]]:
    """Live holders of a rank from the operator's pod index (finished pods
    are not in it; pods being deleted do not count). A pod admitted a moment
    before may not be indexed yet: the writer lease fences that race, as it
    fences pods admitted at the same instant."""
    def holders(rank: int) -> list[str]:
        return sorted(d.pod for d in pods.get((namespace, policy), [])
                      if d is not None and d.writer == str(rank) and not d.deleting)
    return holders


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
#: read of its Job and JobSet, not N (owner_cache.py).
_owner_objects = OwnerCache(lambda *ref: kube.read_object(*ref))


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


async def writer_identity(pod: dict[str, Any], namespace: str, p: pol.Policy,
                          warnings: list[str],
                          holders_of: Callable[[int], list[str]] | None = None,
                          ) -> identity.Identity | None:
    """The pod's writer identity under policy `p` (None: no rank, one writer).
    Refuses (AdmissionError) a pod that has no rank when the policy has several
    writers, a rank out of range, and a rank a live pod of the policy holds.
    `holders_of(rank)`: the live pods holding a rank, from the operator's own
    pod index (no API call when it names none: a list of every pod of the
    namespace at each admission grows with the job); without it, or when it
    names a holder, the apiserver is asked."""
    owners = _owners_known(namespace, pod)
    if owners is None:
        owners = await asyncio.to_thread(_owners, namespace, pod)
    try:
        found = identity.derive(pod, p.identity, owners)
    except identity.RankMissing as error:
        if p.writers == 1:
            return None
        raise kopf.AdmissionError(
            f"pod {pod_label(pod)} ({error.kind}) has no writer rank: {error.missing}; "
            f"policy {p.name} has {p.writers} writers", code=422) from None
    if found.rank is None and p.writers > 1:
        raise kopf.AdmissionError(
            f"pod {pod_label(pod)} ({found.kind}) has no writer rank: none of the Job, JobSet, "
            "TrainJob, PyTorchJob or LeaderWorkerSet labels is set; name the label or "
            f"annotation that holds it in spec.identity of policy {p.name} "
            f"({p.writers} writers)", code=422)
    problem = identity.out_of_range(found, p.writers)
    if problem:
        raise kopf.AdmissionError(f"pod {pod_label(pod)} ({found.kind}): {problem}", code=422)
    mismatch = identity.mismatch(found, p.writers)
    if mismatch:
        warnings.append(f"ckptdrain: policy {p.name}: {mismatch}; the checkpoint is complete "
                        f"only when {p.writers} writers committed it")
    if found.rank is None:
        return found
    me = pod.get("metadata", {}).get("name")
    try:
        live = holders_of(found.rank) if holders_of is not None else None
        if live is None or [n for n in live if n != me]:
            # No index, or the index names a holder: ask the apiserver. The
            # index may still hold a pod deleted a moment ago (a Job replacing
            # it), and a refusal must rest on what is there now.
            live = await asyncio.to_thread(kube.live_writers, namespace, p.name, found.rank)
    except (kube.ApiException, kube.HTTPError) as error:
        # Unchecked is unsafe: refuse, and the pod's controller retries.
        raise kopf.AdmissionError(
            f"pod {pod_label(pod)}: could not check whether a live pod already holds writer "
            f"{found.rank} of policy {p.name} ({error}); retry", code=503) from None
    holders = [n for n in live if n != me]
    if holders:
        raise kopf.AdmissionError(
            f"pod {pod_label(pod)} ({found.kind}, {found.source}) claims writer {found.rank} "
            f"of policy {p.name}, which live pod {holders[0]} already holds; two pods must "
            "never write one shard", code=409)
    return found


def _identity_warnings(pod: dict[str, Any]) -> list[str]:
    return [f"ckptdrain: {problem}" for problem in cloud_identity.ambient(pod).problems]


@kopf.on.mutate("v1", "pods", id="ckptdrain-inject", operations=["CREATE"],
                labels={api.LABEL_INJECT: "true"}, ignore_failures=True,
                side_effects=False)
async def pod_mutate(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: kopf.Memo,
               logger: logging.Logger, policy_by_label: kopf.Index[LabelKey, Any],
               pod_index: kopf.Index[Any, Any], **_: Any) -> None:
    """Inject the agent, restore and volumes into a pod one policy selects.

    Async on purpose: pure and quick, so it runs on the event loop and never
    queues behind sync handlers in Kopf's thread pool."""
    heap.busy()  # no heap trim while admissions come in
    cfg: OperatorConfig = memo.config
    pod = dict(body)
    namespace = body.metadata.namespace or ""
    with metrics.admitting("pod"):
        if injection.is_injected(pod):
            # Called again after later webhooks changed the pod: follow them.
            ops = injection.reinvocation_patch(pod)
            if ops:
                patch.fns.append(lambda doc: jsonpatch.apply_patch(doc, ops, in_place=True))
                logger.info("pod injected earlier: %d ops after later webhooks", len(ops))
                warnings.extend(_identity_warnings(pod))
            return
        labels = dict(body.metadata.labels)
        # A standby replica's index is empty or frozen (Kopf pauses its watches
        # but not its webhook server): only the active replica's is trusted.
        matches = _selecting(labels, _candidates(namespace, labels, policy_by_label)) \
            if leadership.active() else []
        if not matches:
            # The index may lag (a policy created a moment ago) or be a
            # standby's: ask the apiserver before leaving a pod bare.
            listed = await asyncio.to_thread(kube.list_policies, namespace)
            matches = _selecting(labels, listed)
        if not matches:
            warnings.append(f"ckptdrain: no CheckpointPolicy in {namespace} selects this pod; "
                            "not injected")
            return
        if len(matches) > 1:
            names = ", ".join(m["metadata"]["name"] for m in matches)
            raise kopf.AdmissionError(
                f"metadata.labels: expected exactly one CheckpointPolicy to select the pod, "
                f"got {len(matches)} ({names})", code=422)
        chosen = matches[0]
        try:
            p = pol.parse(namespace, chosen["metadata"]["name"], chosen.get("spec", {}), cfg)
        except InvalidInput as error:
            warnings.append(f"ckptdrain: policy {chosen['metadata']['name']} is invalid "
                            f"({error}); not injected")
            return
        peer_problem = peer_tier.not_ready(p.peer, chosen.get("status") or {})
        if peer_problem:
            # The pod would wait forever for a Secret volume that is not there.
            warnings.append(f"ckptdrain: policy {p.name}: {peer_problem}; "
                            "the pod runs without the peer tier")
            p = dataclasses.replace(p, peer=dataclasses.replace(p.peer, enabled=False))
        share = default_share(p, chosen.get("status"))
        problem = injection.grace_problem(pod, p, share, cfg)
        if problem and p.grace_policy == "Refuse":
            raise kopf.AdmissionError(problem, code=422)
        if problem:
            warnings.append(problem)
        writer = await writer_identity(pod, namespace, p, warnings,
                                       _indexed_holders(pod_index, namespace, p.name)
                                       if leadership.active() else None)
        ops = injection.build_pod_patch(
            pod, p, cfg, default_rate=share, rank=writer.rank if writer else None,
            workload_writers=writer.writers if writer else None)
        if p.credentials is None:  # with a Secret nothing is carried: nothing to say
            warnings.extend(_identity_warnings(pod))
        patch.fns.append(lambda doc: jsonpatch.apply_patch(doc, ops, in_place=True))
        logger.info("injecting policy %s into a pod (%d ops)", p.key, len(ops))


@kopf.on.validate(*POLICIES, id="ckptdrain-policy", operations=["CREATE", "UPDATE"])
async def checkpointpolicy_validate(spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo,
                                    **_: Any) -> None:
    """Refuse a policy the schema admits but the operator cannot honour."""
    with metrics.admitting("policy"):
        errors = pol.validate(dict(spec), memo.config, name=meta.get("name") or "")
        if errors:
            raise kopf.AdmissionError("; ".join(str(e) for e in errors), code=422)
