"""The apiserver reads admission makes, on urllib3 alone
(apiserver/connection.py says how, and why not the `kubernetes` package).

Admission reads a few things (the policies of a namespace, a pod's owners,
the pods holding a writer rank) and watches two (policies, writer pods).
Every answer that is not 2xx raises ApiError with the apiserver's message;
anything else that fails (no connection, a timeout, an unreadable token,
an answer that is not JSON) raises urllib3's HTTPError (ReadFailed for
ours). Neither ever carries a credential.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from ckptdrain.contract.api import (
    ANNOTATION_INJECTED,
    ANNOTATION_POLICY,
    GROUP,
    LABEL_INJECT,
    LABEL_POLICY,
    LABEL_WRITER,
    LABEL_WRITER_POLICY,
    POLICIES,
    POLICY_VERSION,
    policy_labelled,
)
from ckptdrain.operator.apiserver.connection import ApiError, HTTPError, ReadFailed, connection
from ckptdrain.operator.apiserver.policy_edge import seen

__all__ = ["ApiError", "HTTPError", "ReadFailed", "connection", "first_injected_pod",
           "get_json", "job_or_none", "list_policies", "live_writers", "read_object", "stream",
           "watch_events", "watching", "writer_selectors"]

log = logging.getLogger(__name__)

#: Reads made inside an admission request, and all the reads of one policy
#: admission together: under the webhook's timeoutSeconds (the chart's
#: webhook.timeoutSeconds, 5), so that a slow apiserver gets the user our
#: refusal saying what could not be read, not the apiserver's deadline error.
ADMISSION_READ_TIMEOUT_S = 3.5
#: Pods a page when admission searches a namespace's pods.
POD_PAGE = 250


def _raise_for(response: Any) -> None:
    if 200 <= response.status < 300:
        return
    body = response.data  # read whole: the connection goes back to the pool
    message = ""
    try:
        found = json.loads(body)
        message = str(found.get("message") or "") if isinstance(found, dict) else ""
    except ValueError:
        message = body[:200].decode(errors="replace")
    raise ApiError(response.status, response.reason or "", message)


def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
    """GET `path` as JSON."""
    response = connection().request(path, query, timeout, preload=True)
    _raise_for(response)
    try:
        found = json.loads(response.data)
    except ValueError:
        raise ReadFailed(f"GET {path}: the answer is not JSON") from None
    return found if isinstance(found, dict) else {}


def stream(path: str, query: list[tuple[str, str]],
           timeout: float | tuple[float, float]) -> Any:
    """GET `path` unread (a watch): the urllib3 response, to read with
    watch_events and then release; raises ApiError on an error status."""
    response = connection().request(path, query, timeout, preload=False)
    if not 200 <= response.status < 300:
        try:
            _raise_for(response)
        finally:
            response.release_conn()
    return response


def watch_events(response: Any) -> Iterator[dict[str, Any]]:
    """The events of a watch's response, one JSON object a line."""
    pending = b""
    for chunk in response.stream(1 << 16):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from (json.loads(line) for line in whole if line.strip())
    if pending.strip():
        yield json.loads(pending)


@contextmanager
def watching(path: str, query: list[tuple[str, str]], version: str, seconds: int,
             timeout: tuple[float, float]) -> Iterator[Iterator[dict[str, Any]]]:
    """The events of a watch of `path` from `version` (bookmarks asked for,
    ended by the server after `seconds`); its connection is released after a
    watch read to its end, closed after one left mid-stream (not reusable)."""
    response = stream(path, [*query, ("watch", "true"), ("resourceVersion", version),
                             ("allowWatchBookmarks", "true"),
                             ("timeoutSeconds", str(seconds))], timeout)
    try:
        yield watch_events(response)
    except BaseException:
        response.close()
        raise
    response.release_conn()


def policies_path(namespace: str) -> str:
    """Where the CheckpointPolicies of `namespace` (all: "") are listed, at
    their storage version (no conversion asked of anyone)."""
    where = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    return f"/apis/{GROUP}/{POLICY_VERSION}{where}/{POLICIES}"


def list_policies(namespace: str, timeout: float = ADMISSION_READ_TIMEOUT_S
                  ) -> list[dict[str, Any]]:
    """The CheckpointPolicies of a namespace, read from the apiserver, as the
    core reads them (v1alpha1's model: policy_edge.py)."""
    found = get_json(policies_path(namespace), [], timeout)
    return [seen(item) for item in found.get("items") or []]


def read_object(api_version: str, plural: str, namespace: str, name: str
                ) -> dict[str, Any] | None:
    """One namespaced object of a group's API (a Job, a JobSet) as a dict;
    None when it is absent, its API is not installed, we may not read it,
    or the read failed: the caller treats an owner as optional knowledge."""
    group, _, version = api_version.rpartition("/")
    path = (f"/apis/{quote(group, safe='')}/{quote(version, safe='')}/namespaces/"
            f"{quote(namespace, safe='')}/{quote(plural, safe='')}/{quote(name, safe='')}")
    try:
        return get_json(path, [], ADMISSION_READ_TIMEOUT_S)
    except ApiError as error:
        if error.status not in (403, 404):
            log.warning("could not read %s %s/%s: %s", plural, namespace, name, error)
    except Exception as error:  # no connection, a timeout, the SDK's own failures
        log.warning("could not read %s %s/%s: %s", plural, namespace, name, error)
    return None


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
        found = get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
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


def job_or_none(namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
    """A Job read from the apiserver by `deadline` (time.monotonic()); None
    when it is gone. Any other failure raises: a refusal rests on it."""
    try:
        return get_json(f"/apis/batch/v1/namespaces/{quote(namespace, safe='')}/jobs/"
                        f"{quote(name, safe='')}", [], _left(deadline, f"reading Job {name}"))
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ReadFailed(f"{what} took longer than an admission may wait")
    return left


def injected_pod_selectors(policy: str) -> list[str]:
    """The label selectors that together find every pod `policy` injected:
    its own label when its name fits one, then the opted-in pods carrying
    no policy label (injected before pods were labelled, or for a name too
    long for a label), which shrink to none as such pods end. Never every
    opted-in pod of the namespace: thousands of them would not be read
    within an admission's budget."""
    unlabelled = f"{LABEL_INJECT}=true,!{LABEL_POLICY}"
    if not policy_labelled(policy):
        return [unlabelled]
    return [f"{LABEL_INJECT}=true,{LABEL_POLICY}={policy}", unlabelled]


def first_injected_pod(namespace: str, policy: str, wanted: Callable[[dict[str, Any]], bool],
                       deadline: float) -> dict[str, Any] | None:
    """The first pod `policy` injected (opted in with `ckptdrain.io/inject=true`,
    annotated as injected by it), not Succeeded, for which `wanted(pod)`
    holds; None when there is none. Read from etcd (no watch cache: a refusal
    rests on it), POD_PAGE pods a page, by injected_pod_selectors in turn,
    stopping at the first; raises ReadFailed when `deadline`
    (time.monotonic()) passes first."""
    for selector in injected_pod_selectors(policy):
        found = _first_pod(namespace, selector, policy, wanted, deadline)
        if found is not None:
            return found
    return None


def _first_pod(namespace: str, selector: str, policy: str,
               wanted: Callable[[dict[str, Any]], bool],
               deadline: float) -> dict[str, Any] | None:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    # A Succeeded pod never writes again: the apiserver leaves it out.
    query = [("labelSelector", selector),
             ("fieldSelector", "status.phase!=Succeeded"), ("limit", str(POD_PAGE))]
    token = ""
    while True:
        found = get_json(path, [*query, *([("continue", token)] if token else [])],
                         _left(deadline, f"listing the pods of {namespace}"))
        for pod in found.get("items") or []:
            # The annotation decides: a label is the user's to edit.
            notes = (pod.get("metadata") or {}).get("annotations") or {}
            if notes.get(ANNOTATION_POLICY) == policy \
                    and notes.get(ANNOTATION_INJECTED) == "true" and wanted(pod):
                return dict(pod)
        token = str((found.get("metadata") or {}).get("continue") or "")
        if not token:
            return None
