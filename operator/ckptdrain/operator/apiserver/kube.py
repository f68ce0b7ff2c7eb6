"""The few writes the operator makes outside Kopf's own patching, through the
official client. Thin: every function is one API call; 404 on something that
is already gone is not an error. CheckpointPolicies are read and written at
their storage version, v1beta1, and seen by the caller at v1alpha1
(policy_edge.py): what callers pass and get is the core's model.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ckptdrain import kubeclient
from ckptdrain.contract.api import (
    GROUP,
    POLICY_API_VERSION,
    VERSION,
)
from ckptdrain.operator.apiserver.policy_edge import read, version_of, written

__all__ = ["ApiException", "HTTPError", "delete", "event_body", "events_posted",
           "patch_object", "patch_status", "post_event", "read_peering"]

#: The source.component of every Event the operator posts outside Kopf.
EVENT_SOURCE = "ckptdrain-operator"

log = logging.getLogger(__name__)

#: Concurrent writes when many pods change at once (a rebalance of hundreds).
PARALLEL_WRITES = 4

#: Say it: the generated client would otherwise pick JSON Patch for a dict body.
MERGE = "application/merge-patch+json"


@functools.cache
def _api() -> Any:
    return kubeclient.api_client(pool_size=PARALLEL_WRITES * 2)


@functools.cache
def _clients() -> tuple[client.CoreV1Api, client.CustomObjectsApi]:
    return client.CoreV1Api(_api()), _custom()


@functools.cache
def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_api())


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
    return _gone_ok(custom.patch_namespaced_custom_object, GROUP, version_of(plural),
                    namespace, plural, name, written(plural, patch), _content_type=MERGE)


def patch_status(plural: str, namespace: str, name: str, status: dict[str, Any]) -> bool:
    custom = _custom()
    return _gone_ok(custom.patch_namespaced_custom_object_status, GROUP, version_of(plural),
                    namespace, plural, name, written(plural, {"status": status}),
                    _content_type=MERGE)


def patch_cluster_status(plural: str, name: str, status: dict[str, Any],
                         version: str = VERSION) -> bool:
    """Merge-patch the status of one of our cluster-scoped objects (a
    CheckpointClass); False when it is gone."""
    custom = _custom()
    return _gone_ok(custom.patch_cluster_custom_object_status, GROUP, version, plural, name,
                    {"status": status}, _content_type=MERGE)


def read_own(plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """One of our custom objects, fresh from the apiserver; None when absent."""
    custom = _custom()
    try:
        return read(plural, custom.get_namespaced_custom_object(
            GROUP, version_of(plural), namespace, plural, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def list_own(plural: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """Our custom objects in `namespace` that match `label_selector`, fresh
    from the apiserver."""
    found = _custom().list_namespaced_custom_object(GROUP, version_of(plural), namespace,
                                                    plural, label_selector=label_selector)
    return [read(plural, item) for item in found.get("items") or []]


#: Pods a page when the census lists the opted-in pods.
POD_PAGE = 500
#: Each page's (connect, read) timeout, in seconds: a LIST on a half-open
#: connection fails instead of holding the census for ever.
POD_PAGE_TIMEOUT = (5.0, 30.0)
#: The pods' metadata only (names and uids), not their specs and statuses:
#: a page of 500 full pods is megabytes to read and parse in the process
#: that serves the admission webhooks.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def list_pod_names(namespace: str | None, label_selector: str) -> set[tuple[str, str]]:
    """(namespace, name) of every pod matching `label_selector`, in
    `namespace` (None: all), fresh from the apiserver, POD_PAGE a page, each
    within POD_PAGE_TIMEOUT. An expired continue token (410) raises: the
    caller lists again."""
    core, _ = _clients()
    names: set[tuple[str, str]] = set()
    token = None
    options = {"label_selector": label_selector, "limit": POD_PAGE,
               "_preload_content": False, "_request_timeout": POD_PAGE_TIMEOUT,
               "_headers": {"Accept": METADATA_ONLY}}
    while True:
        if namespace:
            found = core.list_namespaced_pod(namespace, _continue=token, **options)
        else:
            found = core.list_pod_for_all_namespaces(_continue=token, **options)
        page, token = pod_names_of(json.loads(found.data))
        names.update(page)
        if not token:
            return names


def pod_names_of(page: Mapping[str, Any]) -> tuple[set[tuple[str, str]], str | None]:
    """(namespace, name) of each pod of one page of a list (full pods or
    their metadata only), and its continue token (None: the last page)."""
    names = {(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
             for meta in ((item or {}).get("metadata") or {}
                          for item in page.get("items") or [])}
    return names, ((page.get("metadata") or {}).get("continue") or None)


def create_own(plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """Create one of our custom objects; None when it exists already."""
    custom = _custom()
    try:
        return read(plural, custom.create_namespaced_custom_object(
            GROUP, version_of(plural), namespace, plural, written(plural, body)))
    except ApiException as error:
        if error.status == 409:
            return None
        raise


def patch_status_at(plural: str, namespace: str, name: str, status: dict[str, Any],
                    resource_version: str) -> str:
    """Merge-patch the status of the object as read at `resource_version`:
    "ok", "conflict" (it changed since: read it again) or "gone"."""
    custom = _custom()
    body = {"metadata": {"resourceVersion": resource_version},
            **written(plural, {"status": status})}
    try:
        custom.patch_namespaced_custom_object_status(GROUP, version_of(plural), namespace,
                                                     plural, name, body, _content_type=MERGE)
    except ApiException as error:
        if error.status == 404:
            return "gone"
        if error.status == 409:
            return "conflict"
        raise
    return "ok"


def write_status_from(plural: str, namespace: str, body: dict[str, Any],
                      change_of: Callable[[dict[str, Any]], dict[str, Any] | None],
                      attempts: int) -> bool:
    """Write `change_of(body)` to the object's status at the version `body`
    was read at; on a conflict read it again and ask `change_of` anew (what
    to write may differ now). True when written, False when nothing was to
    write or the object is gone; RuntimeError after `attempts` conflicts, for
    the caller's retry."""
    name = body["metadata"]["name"]
    for _ in range(attempts):
        change = change_of(body)
        if change is None:
            return False
        version = str(body["metadata"].get("resourceVersion") or "")
        result = patch_status_at(plural, namespace, name, change, version)
        if result == "ok":
            return True
        if result == "gone":
            return False
        fresh = read_own(plural, namespace, name)
        if fresh is None:
            return False
        body = fresh
    raise RuntimeError(f"{plural} {namespace}/{name} changed under {attempts} status "
                       "writes in a row; trying again later")


def write_object(plural: str, namespace: str, body: dict[str, Any],
                 patch: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge-patch a custom object in place (`patch`, where None removes a
    field; default the body's spec), or create it when absent (the steady
    state is a patch: one write, no conflict to handle). Returns the object
    as the apiserver stored it."""
    custom = _custom()
    name, version = body["metadata"]["name"], version_of(plural)
    change = written(plural, {"spec": body["spec"]} if patch is None else patch)
    try:
        return read(plural, custom.patch_namespaced_custom_object(
            GROUP, version, namespace, plural, name, change, _content_type=MERGE))
    except ApiException as error:
        if error.status != 404:
            raise
    try:
        return read(plural, custom.create_namespaced_custom_object(
            GROUP, version, namespace, plural, written(plural, body)))
    except ApiException as error:
        if error.status != 409:
            raise
    # Created by someone in between (another replica): ours is the newer one.
    return read(plural, custom.patch_namespaced_custom_object(
        GROUP, version, namespace, plural, name, change, _content_type=MERGE))


def delete(plural: str, namespace: str, name: str) -> bool:
    custom = _custom()
    return _gone_ok(custom.delete_namespaced_custom_object, GROUP, version_of(plural),
                    namespace, plural, name)


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


def event_body(body: Mapping[str, Any], kind: str, reason: str, message: str,
               now: datetime, type_: str = "Warning",
               api_version: str = POLICY_API_VERSION) -> client.CoreV1Event:
    """The Event `post_event` creates, about `body` of `kind` at `api_version`:
    by default a policy, named at its storage version whatever form the
    caller holds it in (the core's is v1alpha1: policy_edge.py). Pure."""
    meta = body["metadata"]
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}."),
        involved_object=client.V1ObjectReference(
            api_version=api_version, kind=kind, name=meta["name"],
            namespace=meta["namespace"], uid=meta.get("uid")),
        reason=reason, message=message[:1024], type=type_, count=1,
        first_timestamp=now, last_timestamp=now,
        source=client.V1EventSource(component=EVENT_SOURCE))


def post_event(body: Mapping[str, Any], kind: str, reason: str, message: str,
               type_: str = "Warning", api_version: str = POLICY_API_VERSION) -> None:
    """An Event about an object (a policy, or a pod with api_version "v1"), from
    outside a Kopf handler (the watchdog, the sweep)."""
    core, _ = _clients()
    core.create_namespaced_event(body["metadata"]["namespace"], event_body(
        body, kind, reason, message, datetime.now(UTC), type_, api_version))


def events_posted(namespace: str, reason: str) -> set[str]:
    """The uids of the objects in `namespace` that carry an Event of `reason`
    posted by the operator (core/v1 Events can be selected by reason and
    source on the server, so one list per namespace, not one per object)."""
    core, _ = _clients()
    found = core.list_namespaced_event(
        namespace, field_selector=f"reason={reason},source={EVENT_SOURCE}")
    return {e.involved_object.uid for e in found.items
            if e.involved_object is not None and e.involved_object.uid}
