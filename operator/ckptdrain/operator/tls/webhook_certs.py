"""The webhook certificates the operator manages itself (tls/certs.py plans
them): the Secret that holds them, the caBundle of both webhook
configurations and of the CheckpointPolicy CRD's conversion webhook (where
that calls this replica's server: webhook_address.py), and the files the
webhook server serves.

Every replica runs this, active or standby: each serves admission. They
agree through the Secret: whoever writes first wins (a create or an update
carrying the resourceVersion it read), the others read the winner's. Kopf
re-reads the certificate files when they change, so a renewal needs no
restart. The caBundle is put back whenever something (a `helm upgrade
--force`, a GitOps sync) reset it.
"""

from __future__ import annotations

import base64
import enum
import functools
import json
import logging
import os
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ckptdrain import kubeclient
from ckptdrain.contract import api
from ckptdrain.operator.tls import certs, webhook_address

#: How often each replica checks the Secret (renewals by a peer) and the
#: caBundles (resets by a deployment tool).
CHECK_S = 30.0
#: How soon to look again for a webhook configuration that is not there yet:
#: Helm creates them after the Deployment, and until caBundle is set the API
#: server cannot call the webhooks (pods go uninjected, policies unchecked).
MISSING_RETRY_S = 1.0
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
#: The CRD whose conversion webhook (served at /convert) we answer.
POLICY_CRD = f"{api.POLICIES}.{api.GROUP}"


def dns_names(host: str) -> list[str]:
    """The names the serving certificate covers: the Service's, short and long."""
    names = [host]
    if host.endswith(".svc"):
        names.append(f"{host}.cluster.local")
    return names


@functools.cache
def _apis() -> tuple[client.CoreV1Api, client.AdmissionregistrationV1Api]:
    shared = kubeclient.api_client()
    return client.CoreV1Api(shared), client.AdmissionregistrationV1Api(shared)


@functools.cache
def _crds() -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(kubeclient.api_client())


def _decode(secret: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def ensure_secret(namespace: str, name: str, names: list[str],
                  logger: logging.Logger) -> dict[str, bytes]:
    """The Secret's certificates, made or renewed first when needed."""
    core, _ = _apis()
    for _ in range(5):  # a lost race re-reads the winner's Secret
        try:
            secret = core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            secret = None
        data = _decode(secret) if secret is not None else {}
        change = certs.plan(data, names, datetime.now(UTC))
        if change is None:
            return data
        body = {k: base64.b64encode(v).decode() for k, v in change.data.items()}
        try:
            if secret is None:
                core.create_namespaced_secret(namespace, client.V1Secret(
                    metadata=client.V1ObjectMeta(name=name), type="Opaque", data=body))
            else:
                secret.data = body
                core.replace_namespaced_secret(name, namespace, secret)
        except ApiException as error:
            if error.status == 409:
                continue  # another replica wrote first
            raise
        logger.info("webhook certificate in %s/%s: %s", namespace, name, change.reason)
        return change.data
    raise RuntimeError(f"the webhook Secret {namespace}/{name} kept changing under us")


def ensure_ca_bundle(config: str, ca_pem: bytes, logger: logging.Logger,
                     quiet: bool = False) -> tuple[int, int]:
    """Set caBundle on every webhook of both configurations named `config`;
    returns (webhooks changed, configurations not found). `quiet`: a missing
    configuration is logged at debug level (it was reported already)."""
    _, admission = _apis()
    wanted = base64.b64encode(ca_pem).decode()
    changed = missing = 0
    for read, patch in (
            (admission.read_mutating_webhook_configuration,
             admission.patch_mutating_webhook_configuration),
            (admission.read_validating_webhook_configuration,
             admission.patch_validating_webhook_configuration)):
        try:
            found = read(config)
        except ApiException as error:
            if error.status != 404:
                raise
            missing += 1
            (logger.debug if quiet else logger.warning)(
                "webhook configuration %s not found; caBundle not set yet", config)
            continue
        stale = [w.name for w in found.webhooks or [] if w.client_config.ca_bundle != wanted]
        if stale:
            # Strategic merge by webhook name: only caBundle changes.
            patch(config, {"webhooks": [{"name": n, "clientConfig": {"caBundle": wanted}}
                                        for n in stale]}, _content_type=STRATEGIC)
            changed += len(stale)
    if changed:
        logger.info("caBundle set on %d webhook(s) of %s", changed, config)
    return changed, missing


class CrdCa(enum.Enum):
    """What a check of the CRD's conversion caBundle found."""

    IN_STEP = "in step"
    SET = "set"
    #: Not there yet (crds.install off, applied later), or the read failed:
    #: looked at again within MISSING_RETRY_S.
    MISSING = "missing"
    #: RBAC refuses get or patch: looked at again at CHECK_S, each time warned.
    FORBIDDEN = "forbidden"
    #: It calls another server (another release's Service): left alone.
    NOT_OURS = "not ours"
    #: No conversion webhook (an older CRD): a caBundle there is refused.
    NO_WEBHOOK = "no webhook"


class CrdCaKeeper:
    """Keeps the conversion caBundle of the CRD `crd` equal to our CA, where
    its conversion webhook calls this replica (webhook_address.py), and says
    once what it cannot do, or every check where a right is lacking."""

    def __init__(self, ours: webhook_address.WebhookAddress, logger: logging.Logger,
                 crd: str = POLICY_CRD) -> None:
        self.ours, self.logger, self.crd = ours, logger, crd
        self.missing_reported = False
        self.others_reported: set[str] = set()
        self._verb = "get"  # the request under way, for a 403's warning

    def keep(self, ca_pem: bytes) -> CrdCa:
        """One check, and a patch of caBundle alone where it is stale."""
        try:
            found = self._check(ca_pem)
        except ApiException as error:
            if error.status == 403:
                return self._forbidden(error)
            self._missing("not found" if error.status == 404 else f"not read ({error.reason})")
            return CrdCa.MISSING
        except urllib3.exceptions.HTTPError as error:
            self._missing(f"not read ({error})")
            return CrdCa.MISSING
        except (ValueError, AttributeError) as error:  # not a CRD's JSON (a proxy's page)
            self._missing(f"not read as a CustomResourceDefinition ({error})")
            return CrdCa.MISSING
        self.missing_reported = False
        if found is CrdCa.SET:
            self.logger.info("conversion caBundle set on CRD %s", self.crd)
        return found

    def _check(self, ca_pem: bytes) -> CrdCa:
        crds = _crds()
        wanted = base64.b64encode(ca_pem).decode()
        self._verb = "get"
        # Read as JSON, not the SDK's models: a CRD's schema is large, and
        # only these few fields matter here.
        found = json.loads(crds.read_custom_resource_definition(
            self.crd, _preload_content=False).data)
        conversion = (found.get("spec") or {}).get("conversion") or {}
        webhook = conversion.get("webhook")
        if conversion.get("strategy") != "Webhook" or not isinstance(webhook, dict):
            self.logger.debug("CRD %s converts without a webhook; no caBundle to keep", self.crd)
            return CrdCa.NO_WEBHOOK
        client_config = webhook.get("clientConfig") or {}
        other = webhook_address.other_webhook(client_config, self.ours)
        if other is not None:
            if other not in self.others_reported:
                self.others_reported.add(other)
                self.logger.warning(
                    "CRD %s converts through %s, not this replica's %s; its caBundle is "
                    "left to that server (another release owns the CRD)",
                    self.crd, other, self.ours.describe())
            return CrdCa.NOT_OURS
        if client_config.get("caBundle") == wanted:
            return CrdCa.IN_STEP
        self._verb = "patch"
        # A merge patch of that one field: the rest of the CRD is the chart's.
        crds.patch_custom_resource_definition(
            self.crd, {"spec": {"conversion": {"webhook": {"clientConfig": {
                "caBundle": wanted}}}}}, _content_type=MERGE)
        return CrdCa.SET

    def _forbidden(self, error: ApiException) -> CrdCa:
        # Not missing: no amount of retrying grants a right, so the normal
        # interval, and a warning at every check until someone grants it.
        self.logger.warning(
            "may not %s customresourcedefinitions %s (403: %s): grant get and patch on it "
            "(docs/rbac.md); until then its conversion caBundle is not kept, and every "
            "conversion (reads of v1alpha1) fails whenever it is not this replica's CA",
            self._verb, self.crd, error.reason)
        return CrdCa.FORBIDDEN

    def _missing(self, what: str) -> None:
        (self.logger.debug if self.missing_reported else self.logger.warning)(
            "CRD %s %s; its conversion caBundle not set yet", self.crd, what)
        self.missing_reported = True


def next_check_s(configs_missing: int, crd: CrdCa) -> float:
    """How long until the next check: soon while something may appear any
    moment (Helm creates the webhook configurations after the Deployment),
    else the normal interval."""
    return MISSING_RETRY_S if configs_missing or crd is CrdCa.MISSING else CHECK_S


def write_files(directory: Path, data: dict[str, bytes]) -> None:
    """tls.crt, tls.key and ca.crt, each replaced atomically (key first, so
    the server never pairs a new certificate with an old key for long)."""
    for key in ("tls.key", "tls.crt", "ca.crt"):
        target = directory / key
        if target.exists() and target.read_bytes() == data[key]:
            continue
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key}.")
        with os.fdopen(fd, "wb") as out:
            out.write(data[key])
        os.replace(tmp, target)


def start(secret: str, config: str, ours: webhook_address.WebhookAddress, directory: Path,
          logger: logging.Logger) -> None:
    """Make the certificates ready now (the server starts with them), then
    keep Secret, files and caBundles in step in a daemon thread. `ours`:
    where the apiserver reaches this replica's server (the CRD's caBundle is
    kept only where the CRD calls it)."""
    namespace, _, name = secret.partition("/")
    names = dns_names(ours.host)
    directory.mkdir(parents=True, exist_ok=True)
    data = ensure_secret(namespace, name, names, logger)
    write_files(directory, data)
    missing = ensure_ca_bundle(config, data["ca.crt"], logger)[1] if config else 0
    crd = CrdCaKeeper(ours, logger)
    crd_state = crd.keep(data["ca.crt"])

    def loop() -> None:
        nonlocal missing, crd_state
        while True:
            time.sleep(next_check_s(missing, crd_state))
            try:
                fresh = ensure_secret(namespace, name, names, logger)
                write_files(directory, fresh)
                if config:
                    missing = ensure_ca_bundle(config, fresh["ca.crt"], logger,
                                               quiet=bool(missing))[1]
                crd_state = crd.keep(fresh["ca.crt"])
            except Exception as error:  # this thread renews the certificate: it must not end
                logger.warning("keeping the webhook certificate failed (%r); retrying in %ss",
                               error, next_check_s(missing, crd_state))

    threading.Thread(target=loop, name="ckptdrain-webhook-tls", daemon=True).start()
