"""Reads and one-annotation patches of the objects that own training pods
(a Job, a JobSet, a TrainJob, a Kueue Workload: any kind, by apiVersion and
plural), for the recency annotation (recency/publish.py). Thin: each function
is one API call (discovery: two; a list: one per page); 404 is an answer,
anything else raises. Every call gives up after TIMEOUT_S: a pass waiting on
a stuck connection would hold its policy's worker.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator.apiserver import kube

#: Per call; a pass that times out is tried again later (recency/publish.py).
TIMEOUT_S = 10.0
#: Objects per page of a list: a namespace may hold thousands of finished
#: Kueue Workloads, and the selector may match more than a few.
PAGE = 500


def _split(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def read(api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None when there is none. A pod (a LeaderWorkerSet's
    leader, which owns its group's worker StatefulSet) is listed by name:
    the operator may list pods, never get one."""
    group, version = _split(api_version)
    if not group and plural == "pods":
        core = client.CoreV1Api(kube._api())
        found = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}",
                                         _request_timeout=kube.POD_PAGE_TIMEOUT)
        items = kube._api().sanitize_for_serialization(found).get("items") or []
        return dict(items[0]) if items else None
    try:
        return dict(kube._custom().get_namespaced_custom_object(
            group, version, namespace, plural, name, _request_timeout=TIMEOUT_S))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def list_in(api_version: str, plural: str, namespace: str,
            label_selector: str) -> list[dict[str, Any]] | None:
    """The objects the selector matches, page by page; None when the
    apiserver does not serve that kind (any more) at that version."""
    group, version = _split(api_version)
    out: list[dict[str, Any]] = []
    token = ""
    while True:
        try:
            found = kube._custom().list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=label_selector,
                limit=PAGE, _continue=token or None, _request_timeout=TIMEOUT_S)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        out.extend(dict(item) for item in found.get("items") or [])
        token = (found.get("metadata") or {}).get("continue") or ""
        if not token:
            return out


def annotate(api_version: str, plural: str, namespace: str, name: str, key: str,
             value: str) -> bool:
    """A JSON merge patch of one annotation; False when the object is gone."""
    group, version = _split(api_version)
    patch = {"metadata": {"annotations": {key: value}}}
    return kube._gone_ok(kube._custom().patch_namespaced_custom_object, group, version,
                         namespace, plural, name, patch, _content_type=kube.MERGE,
                         _request_timeout=TIMEOUT_S)


def served_version(group: str, plural: str) -> str | None:
    """The apiVersion ("group/version") under which the apiserver serves
    `plural` of `group` (its preferred version), or None when it does not."""
    groups = client.ApisApi(kube._api()).get_api_versions(_request_timeout=TIMEOUT_S)
    found = next((g for g in groups.groups or [] if g.name == group), None)
    if found is None or found.preferred_version is None:
        return None
    version = found.preferred_version.version
    resources = kube._custom().get_api_resources(group, version,
                                                 _request_timeout=TIMEOUT_S)
    names = {r.name for r in (resources.resources or [])}
    return f"{group}/{version}" if plural in names else None
