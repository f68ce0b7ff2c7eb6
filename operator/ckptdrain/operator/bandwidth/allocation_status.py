"""The joint allocation's part of a policy's status, written: the budget
fields, BandwidthConstrained, the live drainer count and WritersConsistent
(policy/status.py computes them), in one status write at the
resourceVersion they were computed from."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ckptdrain import sizing
from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import allocation
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st

Key = tuple[str, str]
#: Status writes that lost to a newer version in a row before a pass gives
#: up (its Coalescer retries it).
WRITE_ATTEMPTS = 5


def _now() -> datetime:
    return datetime.now(UTC)


def disagrees(body: Mapping[str, Any], sized: sizing.Sizing,
               cluster: allocation.ClusterShare) -> bool:
    """The policy's status says another budget or constraint than the joint one."""
    status = body.get("status") or {}
    return status.get("allowedBandwidthBytes") != int(sized.allowed_bandwidth) or \
        st.with_cluster(status, sized, cluster, body.get("metadata", {}).get("generation"),
                        _now()) is not None


def write(key: Key, body: Mapping[str, Any], sized: sizing.Sizing,
          cluster: allocation.ClusterShare, p: pol.Policy,
          drainers: list[allocation.DrainingPod]) -> None:
    """The joint allocation's part of the policy's status (budget fields,
    BandwidthConstrained, the live drainer count) and WritersConsistent, in
    one write at the resourceVersion it was computed from (recomputed on a
    conflict, so no other writer's condition is lost); a Warning event when
    WritersConsistent turns False. A policy whose spec changed since the
    index's copy is left to the newer spec's reconcile."""
    check = st.writers_check([(d.pod, d.writer, d.workload_writers) for d in drainers],
                             p.writers)
    generation = (body.get("metadata") or {}).get("generation")
    turned_false: list[bool] = []

    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        if (current.get("metadata") or {}).get("generation") != generation:
            return None
        status = current.get("status") or {}
        change = st.with_cluster(status, sized, cluster, generation, _now()) or {}
        if status.get("phase") in ("Ready", "Constrained", "Conflicting", "Unprotected") \
                and status.get("drainers") != len(drainers):
            change["drainers"] = len(drainers)
        writers = st.with_writers({**status, **change}, check, generation, _now())
        turned_false[:] = [writers is not None and not check[0]]
        return {**change, **(writers or {})} or None

    if kube.write_status_from(api.POLICIES, key[0], dict(body), change_of, WRITE_ATTEMPTS) \
            and turned_false == [True]:
        kube.post_event(body, api.KIND_POLICY, check[1], check[2])
