"""The `resources` of each container ckptdrain injects into a pod, and the
pod's QoS class as the kubelet computes it. Pure.

The amounts come from the policy's effective block (operator/containers.py:
the platform's, with the policy's `spec.resources` merged and bounded). The
block's `qos` decides their shape in this pod:

- `MatchPod` (default): a pod that is Guaranteed before injection gets
  containers whose cpu and memory requests and limits are both the block's
  `guaranteed` amounts, so it stays Guaranteed (and keeps static CPU pinning
  under the kubelet's static CPU manager policy); any other pod gets the
  configured `requests` and `limits`.
- `Burstable`: the configured `requests` and `limits`, always (a Guaranteed
  pod becomes Burstable).
- `Guaranteed`: the `guaranteed` amounts, always.

`guaranteed` has amounts of its own because the configured shape's are a
floor under a ceiling: held to a 100m CPU limit, the agent's checksum,
upload and flush after SIGTERM would crawl. A pod with pod-level resources
takes its QoS class from them, not from its containers: there the
configured shape is kept, as equal amounts would buy nothing and could pass
the pod-level requests (the apiserver refuses such a pod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ckptdrain import units
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.containers import QOS_RESOURCES, Containers
from ckptdrain.quantity import parse_quantity

GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"


def _amount(value: object) -> Fraction:
    try:
        return parse_quantity("", value)
    except InvalidInput:  # the apiserver decodes every quantity before admission
        return Fraction(0)


def _positive(amounts: Mapping[str, Any] | None) -> dict[str, Fraction]:
    """The cpu and memory amounts above zero: all the kubelet counts."""
    return {name: _amount(value) for name, value in (amounts or {}).items()
            if name in QOS_RESOURCES and _amount(value) > 0}


def _add(total: dict[str, Fraction], amounts: Mapping[str, Fraction]) -> None:
    for name, value in amounts.items():
        total[name] = total.get(name, Fraction(0)) + value


def qos_class(pod: Mapping[str, Any]) -> str:
    """Guaranteed, Burstable or BestEffort, as the kubelet's ComputePodQOS
    says: pod-level resources when the pod has them, else every container and
    every init container (sidecar or not), each request defaulted to its
    limit as the apiserver does. Requests and limits are compared summed over
    the containers; Guaranteed needs a cpu and a memory limit everywhere."""
    spec = pod.get("spec") or {}
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    pod_level = spec.get("resources") or {}
    if pod_level.get("requests") or pod_level.get("limits"):
        _add(requests, _positive(pod_level.get("requests")))
        if pod_level.get("limits"):
            found = _positive(pod_level["limits"])
            _add(limits, found)
            guaranteed = set(QOS_RESOURCES) <= set(found)
    else:
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            resources = container.get("resources") or {}
            found = _positive(resources.get("limits"))
            _add(requests, _positive({**(resources.get("limits") or {}),
                                      **(resources.get("requests") or {})}))
            _add(limits, found)
            if not set(QOS_RESOURCES) <= set(found):
                guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    if guaranteed and all(limits.get(name) == value for name, value in requests.items()) \
            and len(requests) == len(limits):
        return GUARANTEED
    return BURSTABLE


def has_pod_level_resources(pod: Mapping[str, Any]) -> bool:
    resources = (pod.get("spec") or {}).get("resources") or {}
    return bool(resources.get("requests") or resources.get("limits"))


def stays_guaranteed(pod: Mapping[str, Any], containers: Containers) -> bool:
    """Whether injected containers get their `guaranteed` amounts in `pod`
    (as it is before injection): never with pod-level resources."""
    if has_pod_level_resources(pod):
        return False
    if containers.qos == "Guaranteed":
        return True
    return containers.qos == "MatchPod" and qos_class(pod) == GUARANTEED


def injected(name: str, containers: Containers, *, equal: bool) -> dict[str, Any]:
    """The `resources` of injected container `name` (agent, restore, peer,
    prepare); with `equal`, its `guaranteed` cpu and memory as both requests
    and limits."""
    block = containers.of(name)
    requests, limits = dict(block.requests), dict(block.limits)
    if equal:
        for resource in QOS_RESOURCES:
            amount = block.guaranteed.get(resource)
            if amount is not None:
                requests[resource] = limits[resource] = amount
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def add_request(resources: dict[str, Any], resource: str, amount: str) -> None:
    """Adds `amount` (bytes, e.g. a disk work dir's size) to the request of
    `resource`, raising a limit the sum would pass."""
    requests = resources.setdefault("requests", {})
    total = _amount(amount) + _amount(requests.get(resource, 0))
    requests[resource] = units.format_quantity(math.ceil(total))
    limit = (resources.get("limits") or {}).get(resource)
    if limit is not None and _amount(limit) < total:
        resources["limits"][resource] = requests[resource]
