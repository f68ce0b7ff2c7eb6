"""The peer tier's objects in the API (peers/sync.py's thin edge): the pods'
Secret, created and replaced whole but never read; the policies' CAs in the
CA namespace, the only Secrets read; the peers ConfigMap; a node's zone.
Every function is one API call (a replace that finds nothing creates); an
error about a Secret names the Secret only, never its data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ckptdrain.kube_rest import status_message
from ckptdrain.operator.apiserver.kube import MERGE, ApiException, _clients

log = logging.getLogger(__name__)
T = TypeVar("T")


def _absent_is_none(read: Callable[[], T], secret: str | None = None) -> T | None:
    """`read()`, None on a 404. Reading a `secret`, any other error is raised
    again naming the Secret only: the client's would carry the response."""
    try:
        return read()
    except ApiException as error:
        if error.status == 404:
            return None
        if secret is None:
            raise
        raise ApiException(status=error.status, reason=f"reading Secret {secret}: "
                           f"{error.reason}") from None


#: What a person does about a refusal (docs/rbac.md, "The peer tier").
_WHERE_RIGHTS_ARE = ("the operator's peer-tier rights reach the namespaces of the chart's "
                     "agent.namespaces and operator.peerTierNamespaces (cluster-wide when "
                     "both are empty), and its write policy only the peer tier's own objects")


def refused(error: ApiException, doing: str) -> str:
    """Why the apiserver refused `doing`, in its own words (a Status
    object's message: the right RBAC lacks, or the admission policy that
    refused and why), and where the rights come from. Never the request's
    body: a Secret's data is in no Status."""
    said = status_message(error.body, 400) or str(error.reason or error.status)
    hint = f" ({_WHERE_RIGHTS_ARE})" if error.status == 403 else ""
    return f"the operator could not {doing}: {said}{hint}"


def create_secret(namespace: str, body: dict[str, Any]) -> bool:
    """Create a Secret; False when one of that name exists already."""
    core, _ = _clients()
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as error:
        if error.status == 409:
            return False
        raise ApiException(status=error.status, reason=(
            f"creating Secret {namespace}/{body['metadata']['name']}: {error.reason}")) from None
    return True


def replace_secret(namespace: str, body: dict[str, Any]) -> None:
    """Replace a Secret's content whole (PUT; created when it is gone). A PUT
    answers with what was written, so it reads nothing the operator did not
    already hold: renewing the pods' peer Secret needs no get on secrets.
    With `metadata.resourceVersion` in `body`, only that version is
    replaced (409 otherwise, and no create)."""
    core, _ = _clients()
    name = body["metadata"]["name"]
    try:
        core.replace_namespaced_secret(name, namespace, body)
    except ApiException as error:
        if error.status == 404 and not body["metadata"].get("resourceVersion") \
                and create_secret(namespace, body):
            return
        raise ApiException(status=error.status, reason=(
            f"replacing Secret {namespace}/{name}: {error.reason}")) from None


def read_own_secret_data(namespace: str, name: str) -> tuple[dict[str, str], str] | None:
    """(a Secret's base64 data, its resourceVersion) from the namespace the
    chart's Role allows (the peer tier's CAs); None when not there."""
    core, _ = _clients()
    found = _absent_is_none(lambda: core.read_namespaced_secret(name, namespace),
                            f"{namespace}/{name}")
    return None if found is None else (dict(found.data or {}),
                                       found.metadata.resource_version or "")


def own_secret_labels(namespace: str, selector: str) -> dict[str, dict[str, str]]:
    """name → labels of the Secrets in the operator's own namespace matching
    `selector` (metadata only is used; nothing of their data is kept)."""
    core, _ = _clients()
    found = core.list_namespaced_secret(namespace, label_selector=selector)
    return {item.metadata.name: dict(item.metadata.labels or {}) for item in found.items}


def delete_own_secret(namespace: str, name: str) -> None:
    """Delete a Secret of the operator's own namespace (gone already: fine)."""
    core, _ = _clients()
    try:
        core.delete_namespaced_secret(name, namespace)
    except ApiException as error:
        if error.status != 404:
            raise


def read_configmap_data(namespace: str, name: str) -> dict[str, str] | None:
    """A ConfigMap's data; None when it does not exist."""
    core, _ = _clients()
    found = _absent_is_none(lambda: core.read_namespaced_config_map(name, namespace))
    return None if found is None else dict(found.data or {})


def write_configmap(namespace: str, body: dict[str, Any]) -> None:
    """Create the ConfigMap, or merge-patch its data, labels and owners in place."""
    core, _ = _clients()
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as error:
        if error.status != 409:
            raise
        patch = {"metadata": {k: v for k, v in body["metadata"].items()
                              if k in ("labels", "ownerReferences")}, "data": body["data"]}
        core.patch_namespaced_config_map(body["metadata"]["name"], namespace, patch,
                                         _content_type=MERGE)


def node_labels(name: str) -> dict[str, str] | None:
    """A node's labels; None when it is gone or the operator may not read
    nodes (placement then pairs by node only, not by zone)."""
    core, _ = _clients()
    try:
        found = core.read_node(name)
    except ApiException as error:
        if error.status not in (403, 404):
            raise
        log.warning("could not read node %s (%s): pairing ignores its zone", name,
                    error.reason)
        return None
    return dict(found.metadata.labels or {})
