"""Reads and one-annotation patches of the objects that own training pods
(a Job, a JobSet, a TrainJob, a Kueue Workload: any kind, by apiVersion and
plural), for the recency annotation (recency/publish.py). Thin: each function
is one API call (discovery: two); 404 is an answer, anything else raises.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator.apiserver import kube


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
            group, version, namespace, plural, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def list_in(api_version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
    group, version = _split(api_version)
    found = kube._custom().list_namespaced_custom_object(group, version, namespace, plural)
    return [dict(item) for item in found.get("items") or []]


def annotate(api_version: str, plural: str, namespace: str, name: str, key: str,
             value: str) -> bool:
    """A JSON merge patch of one annotation; False when the object is gone."""
    group, version = _split(api_version)
    patch = {"metadata": {"annotations": {key: value}}}
    try:
        kube._custom().patch_namespaced_custom_object(group, version, namespace, plural, name,
                                                      patch, _content_type=kube.MERGE)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def served_version(group: str, plural: str) -> str | None:
    """The apiVersion ("group/version") under which the apiserver serves
    `plural` of `group` (its preferred version), or None when it does not."""
    groups = client.ApisApi(kube._api()).get_api_versions()
    found = next((g for g in groups.groups or [] if g.name == group), None)
    if found is None or found.preferred_version is None:
        return None
    version = found.preferred_version.version
    resources = kube._custom().get_api_resources(group, version)
    names = {r.name for r in (resources.resources or [])}
    return f"{group}/{version}" if plural in names else None
