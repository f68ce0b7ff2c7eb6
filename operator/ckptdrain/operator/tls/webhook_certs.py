"""The webhook certificates the operator manages itself (tls/certs.py plans
them): the Secret that holds them, the caBundle of both webhook
configurations and of the CheckpointPolicy CRD's conversion webhook, and
the files the webhook server serves.

Every replica runs this, active or standby: each serves admission. They
agree through the Secret: whoever writes first wins (a create or an update
carrying the resourceVersion it read), the others read the winner's. Kopf
re-reads the certificate files when they change, so a renewal needs no
restart. The caBundle is put back whenever something (a `helm upgrade
--force`, a GitOps sync) reset it.
"""

from __future__ import annotations

import base64
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
from ckptdrain.operator.tls import certs

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


def ensure_crd_ca_bundle(ca_pem: bytes, logger: logging.Logger, quiet: bool = False,
                        crd: str = POLICY_CRD) -> tuple[bool, bool]:
    """Set the conversion webhook's caBundle of the CRD `crd` to `ca_pem`;
    returns (changed, missing). Missing: the CRD is not there or we may not
    read or patch it (crds.install off and not applied yet, RBAC not
    granted), logged at debug level when `quiet` (reported already). A CRD
    without a conversion webhook (an older one) is left alone: a caBundle
    there is refused."""
    crds = _crds()
    wanted = base64.b64encode(ca_pem).decode()
    try:
        # Read as JSON, not the SDK's models: a CRD's schema is large, and
        # only these few fields matter here.
        found = json.loads(crds.read_custom_resource_definition(
            crd, _preload_content=False).data)
        conversion = (found.get("spec") or {}).get("conversion") or {}
        webhook = conversion.get("webhook")
        if conversion.get("strategy") != "Webhook" or not isinstance(webhook, dict):
            logger.debug("CRD %s converts without a webhook; no caBundle to keep", crd)
            return False, False
        if (webhook.get("clientConfig") or {}).get("caBundle") == wanted:
            return False, False
        # A merge patch of that one field: the rest of the CRD is the chart's.
        crds.patch_custom_resource_definition(
            crd, {"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": wanted}}}}},
            _content_type=MERGE)
    except ApiException as error:
        if error.status not in (403, 404):
            raise
        what = "not found" if error.status == 404 else "forbidden"
        (logger.debug if quiet else logger.warning)(
            "CRD %s %s; its conversion caBundle not set yet", crd, what)
        return False, True
    logger.info("conversion caBundle set on CRD %s", crd)
    return True, False


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


def _keep_crd(ca_pem: bytes, logger: logging.Logger, quiet: bool) -> bool:
    """ensure_crd_ca_bundle, its trouble logged and retried like the others;
    True while the CRD is missing (or a read failed)."""
    try:
        return ensure_crd_ca_bundle(ca_pem, logger, quiet=quiet)[1]
    except (ApiException, urllib3.exceptions.HTTPError) as error:
        (logger.debug if quiet else logger.warning)(
            "keeping the CRD %s's conversion caBundle failed (%s); retrying", POLICY_CRD, error)
        return True


def start(secret: str, config: str, host: str, directory: Path,
          logger: logging.Logger) -> None:
    """Make the certificates ready now (the server starts with them), then
    keep Secret, files and caBundles in step in a daemon thread."""
    namespace, _, name = secret.partition("/")
    names = dns_names(host)
    directory.mkdir(parents=True, exist_ok=True)
    data = ensure_secret(namespace, name, names, logger)
    write_files(directory, data)
    missing = ensure_ca_bundle(config, data["ca.crt"], logger)[1] if config else 0
    crd_missing = _keep_crd(data["ca.crt"], logger, quiet=False)

    def loop() -> None:
        nonlocal missing, crd_missing
        while True:
            time.sleep(MISSING_RETRY_S if missing or crd_missing else CHECK_S)
            try:
                fresh = ensure_secret(namespace, name, names, logger)
                write_files(directory, fresh)
                if config:
                    missing = ensure_ca_bundle(config, fresh["ca.crt"], logger,
                                               quiet=bool(missing))[1]
                crd_missing = _keep_crd(fresh["ca.crt"], logger, quiet=crd_missing)
            except (ApiException, OSError, RuntimeError, urllib3.exceptions.HTTPError) as error:
                logger.warning("keeping the webhook certificate failed (%s); retrying in %ss",
                               error, CHECK_S)

    threading.Thread(target=loop, name="ckptdrain-webhook-tls", daemon=True).start()
