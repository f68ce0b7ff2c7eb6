"""A CheckpointClass's spec.bandwidthCap through the real operator and
apiserver, with no cluster cap: two policies of a capped class with pods
share its cap and say so naming the class, a classless policy beside them
keeps all it wants, and an edit of the cap moves both policies' budgets
and statuses with no change to them.

The session's operator serves every test; the class is deleted when the
test ends."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cluster_helpers import CLASSES, INJECT, POLICIES, get, pod, policy, wait_for

from support.apiserver import Cluster

ROOT = "/mnt/class-nvme"
#: What each policy (405B, 15m, 10%) wants alone.
WANTED = 63_000_000_000


def _capped_class(cap: object) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": "capped-batch"},
            "spec": {"nodeTier": {"root": ROOT}, "bandwidthCap": cap}}


def _constrained(cluster: Cluster, namespace: str, name: str) -> tuple[str, str, int, str]:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    cond = next((c for c in status.get("conditions") or []
                 if c["type"] == "BandwidthConstrained"), {})
    return (status.get("phase", ""), cond.get("reason", ""),
            status.get("allowedBandwidthBytes", 0), cond.get("message", ""))


def _figures(cluster: Cluster, namespace: str, name: str) -> tuple[str, str, int]:
    return _constrained(cluster, namespace, name)[:3]


def test_a_class_cap_is_shared_by_its_policies_and_an_edit_moves_it(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    classes(_capped_class("50G"))
    for name in ("c0", "c1"):
        apply(policy(name, checkpointClassName="capped-batch",
                     localTier={"path": f"{ROOT}/{name}"}))
    apply(policy("free"))
    for name in ("c0", "c1", "free"):  # a pod each: only policies with pods count
        cluster.kubectl("create", "-n", namespace, "-f", "-",
                        input=json.dumps(pod(f"{name}-0", {"app": name, **INJECT})))
    for name in ("c0", "c1"):
        wait_for(lambda n=name: _figures(cluster, namespace, n)
                 == ("Constrained", "ClassCap", 25_000_000_000), timeout_s=60, what=name)
    message = _constrained(cluster, namespace, "c0")[3]
    assert message.startswith(
        "the cap of CheckpointClass capped-batch (spec.bandwidthCap 50.0 GB/s, for its "
        "policies together), split fairly (equal weights) with 1 other policy of the class "
        "with pods wanting 63.0 GB/s together, allows 25.0 GB/s"), message
    assert _figures(cluster, namespace, "free") == ("Ready", "WithinCaps", WANTED)

    # The class edited, the policies not: both budgets follow the new cap.
    cluster.kubectl("patch", CLASSES, "capped-batch", "--type=merge",
                    "-p", json.dumps({"spec": {"bandwidthCap": 80_000_000_000}}))
    for name in ("c0", "c1"):
        wait_for(lambda n=name: _figures(cluster, namespace, n)
                 == ("Constrained", "ClassCap", 40_000_000_000), timeout_s=60, what=name)
    cluster.kubectl("patch", CLASSES, "capped-batch", "--type=merge",
                    "-p", json.dumps({"spec": {"bandwidthCap": "200G"}}))
    for name in ("c0", "c1"):
        wait_for(lambda n=name: _figures(cluster, namespace, n)
                 == ("Ready", "WithinCaps", WANTED), timeout_s=60, what=name)
