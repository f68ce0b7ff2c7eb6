"""What the agents see of their shares: one watch on the injected pods (the
annotation `ckptdrain.io/bandwidth`, the value the kubelet copies into each
agent's share file) and one on the policies (their budget in status). From
them: when each pod's share changed, and the sum of applied shares against
each policy's budget and against the cluster cap at every change.

Times are when this process saw the change at the apiserver; a real agent
reads the file the kubelet refreshes from it, which adds the kubelet's
sync period (docs/scale.md).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ckptdrain.contract.api import (
    ANNOTATION_BANDWIDTH,
    ANNOTATION_POLICY,
    GROUP,
    LABEL_INJECT,
    POLICIES,
    VERSION,
)

#: The promise: the applied shares never sum to more than 5% over the budget.
LIMIT = 0.05


@dataclass
class Overshoot:
    """The worst sum of applied shares seen over a budget (ratio - 1), and where."""

    worst: float = 0.0
    where: str = ""

    #: For one budget (the cluster cap): how long the sum stayed over `LIMIT`.
    over_s: float = 0.0
    _over_since: float | None = None

    def see(self, total: float, budget: float | None, where: str) -> None:
        if not budget:
            return
        if total / budget - 1 > self.worst:
            self.worst, self.where = total / budget - 1, where
        now = time.monotonic()
        if total / budget - 1 > LIMIT and self._over_since is None:
            self._over_since = now
        elif total / budget - 1 <= LIMIT and self._over_since is not None:
            self.over_s += now - self._over_since
            self._over_since = None


@dataclass
class ShareWatch:
    namespace: str
    api_client: Any
    cluster_cap: float | None
    share: dict[str, float] = field(default_factory=dict)
    policy_of: dict[str, str] = field(default_factory=dict)
    budget: dict[str, float] = field(default_factory=dict)
    #: pod -> times (monotonic) its share changed
    changes: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: running sums of the applied shares, per policy and over the cluster
    policy_sum: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    total: float = 0.0
    per_policy: Overshoot = field(default_factory=Overshoot)
    cluster: Overshoot = field(default_factory=Overshoot)
    events: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True,
                                          name=f"watch-{kind}") for kind in ("pods", "policies")]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def _loop(self, kind: str) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(self.api_client)
        custom = client.CustomObjectsApi(self.api_client)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                if kind == "pods":
                    stream = w.stream(core.list_namespaced_pod, self.namespace,
                                      label_selector=f"{LABEL_INJECT}=true", timeout_seconds=5)
                else:
                    stream = w.stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                      self.namespace, POLICIES, timeout_seconds=5)
                for event in stream:
                    obj = event["object"]
                    if kind == "pods":
                        self._pod(obj.metadata.name, obj.metadata.annotations or {})
                    else:
                        self._policy(obj)
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch is restarted, as the kubelet's would be
                time.sleep(0.2)
            finally:
                w.stop()

    def _pod(self, name: str, annotations: dict[str, str]) -> None:
        text = annotations.get(ANNOTATION_BANDWIDTH)
        if text is None:
            return
        value, policy = float(text), annotations.get(ANNOTATION_POLICY, "")
        with self._lock:
            self.events += 1
            old = self.share.get(name)
            if old == value:
                return
            self.share[name], self.policy_of[name] = value, policy
            self.policy_sum[policy] += value - (old or 0.0)
            self.total += value - (old or 0.0)
            self.changes[name].append(time.monotonic())
            self._check(policy)

    def _policy(self, obj: dict[str, Any]) -> None:
        allowed = (obj.get("status") or {}).get("allowedBandwidthBytes")
        if allowed:
            with self._lock:
                self.budget[obj["metadata"]["name"]] = float(allowed)
                self._check(obj["metadata"]["name"])

    def _check(self, policy: str) -> None:
        self.per_policy.see(self.policy_sum[policy], self.budget.get(policy), policy)
        self.cluster.see(self.total, self.cluster_cap, "cluster")

    def visible(self, since: float, pods: set[str]) -> dict[str, float | int]:
        """For the pods whose share changed after `since`: how long until the
        last of them saw its final value (max) and the median pod did (p50)."""
        with self._lock:
            lasts = sorted(t[-1] - since for p, t in self.changes.items()
                           if p in pods and t and t[-1] > since)
        if not lasts:
            return {"affected": 0}
        return {"affected": len(lasts), "p50_s": round(lasts[len(lasts) // 2], 3),
                "max_s": round(lasts[-1], 3)}
