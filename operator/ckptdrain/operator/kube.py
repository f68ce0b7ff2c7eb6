"""The few writes the operator makes outside Kopf's own patching, through the
official client. Thin: every function is one API call; 404 on something that
is already gone is not an error.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ckptdrain import kubeclient
from ckptdrain.contract.api import (
    ANNOTATION_POLICY,
    API_VERSION,
    GROUP,
    LABEL_WRITER,
    LABEL_WRITER_POLICY,
    POLICIES,
    VERSION,
    policy_labelled,
)

__all__ = ["ApiException", "HTTPError", "delete", "list_policies", "live_writers",
           "patch_object", "patch_status", "post_event", "read_object", "read_peering"]

log = logging.getLogger(__name__)

#: Concurrent writes when many pods change at once (a rebalance of hundreds).
PARALLEL_WRITES = 4

#: Reads made inside an admission request: well under the webhook's timeout.
ADMISSION_READ_TIMEOUT_S = 5

#: Say it: the generated client would otherwise pick JSON Patch for a dict body.
MERGE = "application/merge-patch+json"


#: urllib3 retries for this process's client; None: urllib3's default (three,
#: each with the whole timeout again). The admission process sets one retry
#: of a failed connection and none of a read, so that a read inside an
#: admission is bounded by its timeout (configure_reads).
_RETRIES: Any = None


def configure_reads(retries: Any) -> None:
    """Set the client's retries; before its first use."""
    global _RETRIES
    _RETRIES = retries


@functools.cache
def _api() -> Any:
    return kubeclient.api_client(pool_size=PARALLEL_WRITES * 2, retries=_RETRIES)


@functools.cache
def _clients() -> tuple[client.CoreV1Api, client.CustomObjectsApi]:
    return client.CoreV1Api(_api()), _custom()


@functools.cache
def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_api())


def _get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
    """GET `path` as JSON through the shared client, without the generated
    API class (the core one costs 21 MiB to load: the admission process
    reads pods with this alone)."""
    api = _api()
    method, url, headers, body, post = api.param_serialize(
        "GET", path, query_params=query, header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post, _request_timeout=timeout)
    response.read()
    if not 200 <= response.status < 300:
        raise ApiException(http_resp=response)  # with the apiserver's message
    found = json.loads(response.data)
    return found if isinstance(found, dict) else {}


def _stream(path: str, query: list[tuple[str, str]],
            timeout: float | tuple[float, float]) -> Any:
    """GET `path` unread (a watch): the urllib3 response, to read in chunks
    and release; raises ApiException on an error status."""
    api = _api()
    method, url, headers, body, post = api.param_serialize(
        "GET", path, query_params=query, header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"])
    response = api.call_api(method, url, headers, body, post, _request_timeout=timeout)
    if not 200 <= response.status < 300:
        response.read()
        raise ApiException(http_resp=response)
    return response.response


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(PARALLEL_WRITES, thread_name_prefix="ckptdrain-write")


def _gone_ok(call: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        call(*args, **kwargs)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def patch_object(plural: str, namespace: str, name: str, patch: dict[str, Any]) -> bool:
    custom = _custom()
    return _gone_ok(custom.patch_namespaced_custom_object, GROUP, VERSION, namespace, plural,
                    name, patch, _content_type=MERGE)


def patch_status(plural: str, namespace: str, name: str, status: dict[str, Any]) -> bool:
    custom = _custom()
    return _gone_ok(custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                    plural, name, {"status": status}, _content_type=MERGE)


def read_own(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One of our custom objects, fresh from the apiserver; None when absent."""
    custom = _custom()
    try:
        return dict(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def create_own(plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """Create one of our custom objects; None when it exists already."""
    custom = _custom()
    try:
        return dict(custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                           body))
    except ApiException as error:
        if error.status == 409:
            return None
        raise


def patch_status_at(plural: str, namespace: str, name: str, status: dict[str, Any],
                    resource_version: str) -> str:
    """Merge-patch the status of the object as read at `resource_version`:
    "ok", "conflict" (it changed since: read it again) or "gone"."""
    custom = _custom()
    body = {"metadata": {"resourceVersion": resource_version}, "status": status}
    try:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name,
                                                     body, _content_type=MERGE)
    except ApiException as error:
        if error.status == 404:
            return "gone"
        if error.status == 409:
            return "conflict"
        raise
    return "ok"


def write_object(plural: str, namespace: str, body: dict[str, Any],
                 patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge-patch a custom object in place (`patch`, where None removes a
    field; default the body's spec), or create it when absent (the steady
    state is a patch: one write, no conflict to handle). Returns the object
    as the apiserver stored it."""
    custom = _custom()
    name = body["metadata"]["name"]
    change = {"spec": body["spec"]} if patch is None else patch
    try:
        return dict(custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name, change, _content_type=MERGE))
    except ApiException as error:
        if error.status != 404:
            raise
    try:
        return dict(custom.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                           plural, body))
    except ApiException as error:
        if error.status != 409:
            raise
    # Created by someone in between (another replica): ours is the newer one.
    return dict(custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                      name, change, _content_type=MERGE))


def delete(plural: str, namespace: str, name: str) -> bool:
    custom = _custom()
    return _gone_ok(custom.delete_namespaced_custom_object, GROUP, VERSION, namespace,
                    plural, name)


def list_policies(namespace: str) -> list[dict[str, Any]]:
    """The CheckpointPolicies of a namespace, read from the apiserver."""
    custom = _custom()
    found = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, POLICIES,
                                                 _request_timeout=ADMISSION_READ_TIMEOUT_S)
    return list(found.get("items", []))


def read_peering(name: str, namespace: str | None) -> dict[str, Any] | None:
    """Kopf's peering object (ClusterKopfPeering, or KopfPeering in `namespace`);
    None when it (or its CRD) does not exist."""
    custom = _custom()
    try:
        if namespace:
            found = custom.get_namespaced_custom_object("kopf.dev", "v1", namespace,
                                                        "kopfpeerings", name)
        else:
            found = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings",
                                                     name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return dict(found)


def post_event(body: Mapping[str, Any], kind: str, reason: str, message: str,
               type_: str = "Warning", api_version: str = API_VERSION) -> None:
    """An Event about an object (a policy, or a pod with api_version "v1"), from
    outside a Kopf handler (the watchdog, the sweep)."""
    core, _ = _clients()
    meta = body["metadata"]
    now = datetime.now(UTC)
    core.create_namespaced_event(meta["namespace"], client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}."),
        involved_object=client.V1ObjectReference(
            api_version=api_version, kind=kind, name=meta["name"],
            namespace=meta["namespace"], uid=meta.get("uid")),
        reason=reason, message=message[:1024], type=type_, count=1,
        first_timestamp=now, last_timestamp=now,
        source=client.V1EventSource(component="ckptdrain-operator")))


def read_object(api_version: str, plural: str, namespace: str, name: str
                ) -> dict[str, Any] | None:
    """One namespaced object as a dict; None when it is absent, its API is not
    installed, the operator may not read it, or the read failed: the caller
    treats an owner as optional knowledge."""
    custom = _custom()
    group, _, version = api_version.rpartition("/")
    try:
        found = custom.get_namespaced_custom_object(
            group, version, namespace, plural, name,
            _request_timeout=ADMISSION_READ_TIMEOUT_S)
    except ApiException as error:
        if error.status not in (403, 404):
            log.warning("could not read %s %s/%s: %s", plural, namespace, name, error.reason)
        return None
    except HTTPError as error:  # no connection, or a timeout
        log.warning("could not read %s %s/%s: %s", plural, namespace, name, error)
        return None
    return dict(found)


def writer_selectors(policy: str, rank: int) -> list[str]:
    """The label selectors that find every pod of `policy` holding writer
    `rank` (the caller filters by the policy annotation): by writer and
    writer-policy label (pods admitted since every writer carries both), and
    by the writer label among pods without a writer-policy label (admitted
    before that). Each returns the few pods that match, not every pod
    holding that rank under any policy of the namespace. A policy whose name
    is too long for a label value has its writers found by rank alone."""
    if not policy_labelled(policy):
        return [f"{LABEL_WRITER}={rank}"]
    return [f"{LABEL_WRITER}={rank},{LABEL_WRITER_POLICY}={policy}",
            f"{LABEL_WRITER}={rank},!{LABEL_WRITER_POLICY}"]


def live_writers(namespace: str, policy: str, rank: int, cached: bool = False) -> list[str]:
    """Live pods of `policy` labelled with writer `rank`: not Succeeded or
    Failed, not being deleted. `cached`: as the apiserver's watch cache has
    them (resourceVersion 0: no read of etcd, possibly a moment old), for a
    first look; a refusal must rest on a read without it."""
    names: list[str] = []
    for selector in writer_selectors(policy, rank):
        # Raw JSON: the client's model decoding costs more than the read.
        found = _get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
                          [("labelSelector", selector),
                           *([("resourceVersion", "0")] if cached else [])],
                          ADMISSION_READ_TIMEOUT_S)
        for pod in found.get("items") or []:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if ((meta.get("annotations") or {}).get(ANNOTATION_POLICY) == policy
                    and not meta.get("deletionTimestamp")
                    and status.get("phase") not in ("Succeeded", "Failed")):
                names.append(meta.get("name", ""))
    return sorted(names)
