"""What the Kueue checks read, cached: Kueue's Configuration (its manager
ConfigMap, where the chart grants `get` on exactly that one), the node
labels of ResourceFlavors (cluster-scoped, by name) and a Workload as it is
now. Thin: one API call each; what cannot be read is "not known", said
once in a log line, never raised again and again.

Kueue's ConfigMap is read at most once per CONFIG_S and a flavour once per
FLAVOR_S, whatever the number of policies and passes; a Workload is read
by name on each pass of its policy (passes are coalesced: recency/publish.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kubernetes import client

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.apiserver import kube, workload_objects
from ckptdrain.operator.kueue import settings
from ckptdrain.operator.kueue.settings import WaitForPodsReady

CONFIG_S = 30.0
FLAVOR_S = 300.0
FLAVORS = ("kueue.x-k8s.io", "resourceflavors")

log = logging.getLogger(__name__)
_lock = threading.Lock()
#: (when read, what it said, why it is not known ("" when it is)).
_config: tuple[float, WaitForPodsReady | None, str] | None = None
#: Per flavour: (when read, its nodeLabels or None when not known).
_flavors: dict[str, tuple[float, dict[str, str] | None]] = {}
#: What was said once already.
_said: set[str] = set()


def _once(what: str, message: str, *args: Any) -> None:
    with _lock:
        first = what not in _said
        _said.add(what)
    if first:
        log.warning(message, *args)


def wait_for_pods_ready(where: str) -> tuple[WaitForPodsReady | None, str]:
    """Kueue's waitForPodsReady from ConfigMap `where` ("namespace/name"),
    and, when not known, why ("" when `where` is empty: not configured)."""
    global _config
    if not where:
        return None, "Kueue's configuration is not read (chart value kueue.configMap unset)"
    now = time.monotonic()
    with _lock:
        cached = _config
    if cached is not None and now - cached[0] < CONFIG_S:
        return cached[1], cached[2]
    namespace, _, name = where.partition("/")
    found: WaitForPodsReady | None = None
    why = ""
    try:
        cm = client.CoreV1Api(kube._api()).read_namespaced_config_map(
            name, namespace, _request_timeout=workload_objects.TIMEOUT_S)
        text = (cm.data or {}).get(settings.CONFIG_KEY)
        if text is None:
            why = f"ConfigMap {where} has no key {settings.CONFIG_KEY}"
        else:
            found = settings.read(text)
    except kube.ApiException as error:
        why = f"ConfigMap {where} could not be read ({error.status} {error.reason})"
    except kube.HTTPError as error:
        why = f"ConfigMap {where} could not be read ({type(error).__name__})"
    except InvalidInput as error:
        why = f"Kueue's configuration in ConfigMap {where} is not understood: {error}"
    if why:
        _once(f"config:{why}", "waitForPodsReady not known: %s", why)
    else:
        with _lock:
            _said.difference_update({s for s in _said if s.startswith("config:")})
    with _lock:
        _config = (now, found, why)
    return found, why


def flavor_labels(api_version: str, name: str) -> dict[str, str] | None:
    """A ResourceFlavor's spec.nodeLabels ({} when it sets none), at Kueue's
    `api_version` (its Workloads'); None when it cannot be read (then no
    conflict is claimed)."""
    now = time.monotonic()
    with _lock:
        cached = _flavors.get(name)
    if cached is not None and now - cached[0] < FLAVOR_S:
        return cached[1]
    version = api_version.rpartition("/")[2]
    labels: dict[str, str] | None = None
    try:
        body = kube._custom().get_cluster_custom_object(
            FLAVORS[0], version, FLAVORS[1], name, _request_timeout=workload_objects.TIMEOUT_S)
        raw = (body.get("spec") or {}).get("nodeLabels") or {}
        labels = {str(k): str(v) for k, v in raw.items()}
    except kube.ApiException as error:
        _once(f"flavor:{name}:{error.status}", "ResourceFlavor %s could not be read (%s %s): "
              "its nodes are not checked against spec.placement", name, error.status,
              error.reason)
    except kube.HTTPError as error:
        _once(f"flavor:{name}:http", "ResourceFlavor %s could not be read: %s", name, error)
    with _lock:
        _flavors[name] = (now, labels)
        # A flavour not asked for within FLAVOR_S (deleted, or no longer
        # any policy's) goes, with what was said of it: bounded by the
        # flavours in use.
        for old in [n for n, (when, _) in _flavors.items() if now - when >= FLAVOR_S]:
            del _flavors[old]
            _said.difference_update({s for s in _said if s.startswith(f"flavor:{old}:")})
    return labels


def workload(api_version: str, namespace: str, name: str) -> dict[str, Any] | None:
    """A Kueue Workload as it is now; None when gone. Raises what the
    apiserver raises."""
    return workload_objects.read(api_version, "workloads", namespace, name)


def forget() -> None:
    """Read everything again (tests; a new term)."""
    global _config
    with _lock:
        _config = None
        _flavors.clear()
        _said.clear()
