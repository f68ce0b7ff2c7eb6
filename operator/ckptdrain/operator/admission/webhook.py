"""Admission as Kopf serves it, and what the operator's process keeps for
it: the webhook handlers (registered always, so that where Kopf manages the
webhook configurations it describes them), the policies filed by label for
them, the server's certificate files. The rules are in admission/rules.py.

Where admission runs: by default in a process of its own
(admission/process.py), with its own view of the policies and the
apiserver's watch cache for rank holders, so that an admission never waits
for the operator's event loop; with CKPTDRAIN_WEBHOOK_PROCESS=false, here,
on Kopf's server, reading the operator's indexes.

Scope: the pod webhook's objectSelector matches only pods labelled
`ckptdrain.io/inject=true`, so it never blocks an unrelated pod; its
failurePolicy is Fail by default (an opted-in pod is not created
unprotected while no replica answers; admission/sweep.py flags any that slip through
with Ignore). Every replica serves both webhooks (apiserver/leadership.py). The
policy webhook fails closed: a policy the operator cannot check is refused.
Neither has side effects, so dry-run requests are answered the same way.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonpatch
import kopf

from ckptdrain.contract import api
from ckptdrain.operator import heap, metrics
from ckptdrain.operator.admission import agent_images, holder_mirror
from ckptdrain.operator.admission.policy_rules import admit_policy, default_class_patch
from ckptdrain.operator.admission.rules import (
    MUTATE_ID,
    MUTATE_POLICY_ID,
    VALIDATE_ID,
    LabelKey,
    Refused,
    admit_pod,
    label_key,
)
from ckptdrain.operator.apiserver import leadership, policy_edge, slim
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import version_messages
from ckptdrain.operator.tls import webhook_certs as webhook_tls
from ckptdrain.operator.tls.webhook_address import WebhookAddress

#: Watched (the index) at v1beta1, the storage version (apiserver/policy_edge.py).
POLICIES = policy_edge.RESOURCE


def admitted(resource: kopf.Resource) -> bool:
    """The resources the policy webhooks are for: CheckpointPolicy at every
    version served. Where Kopf writes the webhook configurations itself
    (CKPTDRAIN_WEBHOOK_MANAGED, development) it lists a rule for each, as
    the chart does, so the apiserver sends each request as written, never
    converted (a rule for one version would, matchPolicy Equivalent), and
    a problem is said in the version and spelling its writer used."""
    return resource.group == api.GROUP and resource.plural == api.POLICIES


# The handlers below name the group beside `admitted`: a selector by function
# alone has no group, and Kopf then discovers every API group at startup. An
# aggregated API that is down (Kueue's visibility API, a metrics server: 503)
# fails that discovery after its retries and the operator with it, again at
# each restart (tests/unit/opcore/test_op_api_groups.py).


def _key_directory() -> Path:
    """A private directory (0700) for the webhook's certificate and key, removed
    when the process exits: a key must not outlive the server that used it
    (in a pod the filesystem goes with it; on a developer's machine, or a
    test run that starts hundreds of operators, it would stay in /tmp)."""
    directory = Path(tempfile.mkdtemp(prefix="ckptdrain-webhook-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _self_signed(host: str) -> tuple[str, str]:
    """A development certificate for `host` (kopf's own generator needs extras)."""
    directory = _key_directory()
    cert, key = directory / "tls.crt", directory / "tls.key"
    san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
         "-addext", f"subjectAltName={san},DNS:localhost"],
        check=True, capture_output=True)
    return str(cert), str(key)


def certificate_files(cfg: OperatorConfig, logger: logging.Logger
                      ) -> tuple[str, str, str | None]:
    """(certificate, key, CA) files for the webhook server: the ones the
    operator keeps in its Secret (tls/webhook_certs.py, renewed in place),
    cert-manager's mounted files, or a self-signed pair."""
    cert, key, ca = cfg.webhook_cert, cfg.webhook_key, cfg.webhook_ca
    if cfg.webhook_secret:
        directory = _key_directory()
        webhook_tls.start(cfg.webhook_secret, cfg.webhook_configs,
                          WebhookAddress(cfg.webhook_host, cfg.webhook_port), directory, logger)
        cert, key, ca = (str(directory / n) for n in ("tls.crt", "tls.key", "ca.crt"))
    elif cert is None or key is None:
        cert, key = _self_signed(cfg.webhook_host)
        ca = cert
    return cert, key, ca


def build_server(cfg: OperatorConfig, files: tuple[str, str, str | None]
                 ) -> kopf.WebhookServer:
    """Kopf's webhook server on `files`; it re-reads them when they change
    (renewals)."""
    cert, key, ca = files
    return kopf.WebhookServer(addr=cfg.webhook_addr, port=cfg.webhook_port,
                              host=cfg.webhook_host, certfile=cert, pkeyfile=key, cafile=ca,
                              file_check_interval=webhook_tls.CHECK_S)


@kopf.index(*POLICIES)
def policy_by_label(namespace: str, body: kopf.Body, spec: kopf.Spec,
                    **_: Any) -> dict[LabelKey, dict[str, Any]]:
    """Policies filed by a label pair they require, so an admission reads the
    few that could select the pod, not every policy of the namespace (at a
    thousand policies that scan was a fifth of the event loop's time)."""
    selector = spec.get("selector")
    # With the version each field was written at, for the words of an
    # invalid policy's problem at pod admission (policy/version_messages.py).
    return {label_key(namespace, selector if isinstance(selector, Mapping) else None):
            version_messages.kept_versions(slim.kept_copy(policy_edge.seen(body)), body)}


def _candidates(namespace: str, labels: Mapping[str, str],
                policies: kopf.Index[LabelKey, Any]) -> list[dict[str, Any]]:
    """Every indexed policy of the namespace that could select a pod with `labels`."""
    keys = [(namespace, k, v) for k, v in labels.items()] + [(namespace, None, None)]
    return [b for key in keys if key in policies for b in policies.get(key, [])]


def _every(policies: kopf.Index[LabelKey, Any]) -> list[dict[str, Any]]:
    """Every indexed policy, of all watched namespaces."""
    return [b for key in policies for b in policies.get(key, [])]


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


#: Agent image pinning for admission served here (CKPTDRAIN_WEBHOOK_PROCESS=
#: false): the record as this process reads it, and a watch of the writer
#: pods of its own (the operator's pod index does not keep their images).
#: The admission process keeps its own of both.
PINNING: agent_images.Pinning | None = None


@kopf.on.startup()
def agent_images_startup(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Every replica records the agent image it injects (admission/agent_images.py)."""
    cfg: OperatorConfig = memo.config
    global PINNING
    agent_images.start_recording(cfg)
    if cfg.agent_images and not cfg.webhook_process:
        allowed = agent_images.AllowedImages(cfg)
        agent_images.follow(allowed, threading.Event())
        writers = holder_mirror.HolderMirror(cfg.namespace)
        holder_mirror.start(writers, cfg.namespace, logger, threading.Event())
        PINNING = agent_images.Pinning(allowed, writers.running)


@contextmanager
def _as_kopf() -> Iterator[None]:
    """A refusal as Kopf answers one."""
    try:
        yield
    except Refused as refused:
        raise kopf.AdmissionError(str(refused), code=refused.code) from None


# -- Kopf's own webhook server: used only when admission runs in the
# operator's process (CKPTDRAIN_WEBHOOK_PROCESS=false). By default a process
# of its own serves these paths (admission/process.py); the handlers stay
# registered either way, so that Kopf describes them when it manages the
# webhook configurations itself.


@kopf.on.mutate("v1", "pods", id=MUTATE_ID, operations=["CREATE"],
                labels={api.LABEL_INJECT: "true"}, ignore_failures=True,
                side_effects=False)
async def pod_mutate(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: kopf.Memo,
                     logger: logging.Logger, policy_by_label: kopf.Index[LabelKey, Any],
                     pod_index: kopf.Index[Any, Any], **_: Any) -> None:
    """Inject the agent, restore and volumes into a pod one policy selects.

    Async on purpose: pure and quick, so it runs on the event loop and never
    queues behind sync handlers in Kopf's thread pool."""
    heap.busy()  # no heap trim while admissions come in
    namespace = body.metadata.namespace or ""
    # A standby replica's indexes are empty or frozen (Kopf pauses its watches
    # but not its webhook server): only the active replica's are trusted.
    trusted = leadership.active()
    labels = dict(body.metadata.labels)
    with metrics.admitting("pod"), _as_kopf():
        ops = await admit_pod(
            dict(body), namespace, memo.config, warnings, logger,
            _candidates(namespace, labels, policy_by_label) if trusted else None,
            (lambda policy: _indexed_holders(pod_index, namespace, policy))
            if trusted else None,
            PINNING,
            _every(policy_by_label) if trusted and not memo.config.csi else None)
    if ops:
        patch.fns.append(lambda doc: jsonpatch.apply_patch(doc, ops, in_place=True))


@kopf.on.mutate(admitted, group=api.GROUP, id=MUTATE_POLICY_ID, operations=["CREATE"],
                side_effects=False)
async def checkpointpolicy_mutate(body: kopf.Body, patch: kopf.Patch, warnings: list[str],
                                  namespace: str | None, **_: Any) -> None:
    """Bind a policy created without a class to the default class
    (admission/policy_rules.py default_class_patch); fails closed."""
    with metrics.admitting("policy-class"), _as_kopf():
        ops = await default_class_patch(dict(body), warnings, namespace or "")
    if ops:
        patch.fns.append(lambda doc: jsonpatch.apply_patch(doc, ops, in_place=True))


@kopf.on.validate(admitted, group=api.GROUP, id=VALIDATE_ID, operations=["CREATE", "UPDATE"])
async def checkpointpolicy_validate(body: kopf.Body, old: kopf.Body | None, operation: str,
                                    namespace: str | None, memo: kopf.Memo,
                                    warnings: list[str], **_: Any) -> None:
    """Refuse a policy the operator cannot honour, one whose selector overlaps
    another's, or an update that would move checkpoints or change the writer
    count under live pods (admission/policy_rules.py); warn when no node
    reports room for one of its writers."""
    # Kopf does not pass the request's kind: problems are said in the body's
    # own version, the one written, as every version is registered
    # unconverted, by the chart and by Kopf (admitted).
    with metrics.admitting("policy"), _as_kopf():
        await admit_policy(dict(body), dict(old) if operation == "UPDATE" and old else None,
                           namespace or "", memo.config, warnings=warnings)
