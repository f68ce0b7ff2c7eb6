"""What the agents see of their shares: one watch on the policies' share
channels and the namespace's cluster scale (CheckpointShare,
contract/share.py: what every agent of a policy watches and derives its
share from) and one on the policies (their budget in status). From them:
when each policy's per-agent share changed, and the sum of applied shares
(the share times the agents admitted) against each policy's budget and
against the cluster cap at every change.

Times are when this process saw the change at the apiserver; a real agent
watches the same object, so it sees it one watch delivery later.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ckptdrain.contract import share as sh
from ckptdrain.contract.api import GROUP, POLICIES, VERSION
from ckptdrain.errors import InvalidInput

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
    #: policy -> (per-agent share, agents admitted), as its channel says now
    applied: dict[str, tuple[float, int]] = field(default_factory=dict)
    budget: dict[str, float] = field(default_factory=dict)
    #: policy -> times (monotonic) its agents' share or admitted set changed
    changes: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    total: float = 0.0
    per_policy: Overshoot = field(default_factory=Overshoot)
    cluster: Overshoot = field(default_factory=Overshoot)
    events: int = 0
    malformed: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen: dict[str, sh.Allocation] = {}
        self._scale: sh.Scale | None = None
        self._threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True,
                                          name=f"watch-{kind}")
                         for kind in (sh.SHARES, POLICIES)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def _loop(self, plural: str) -> None:
        from kubernetes import client, watch

        custom = client.CustomObjectsApi(self.api_client)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                      self.namespace, plural, timeout_seconds=5):
                    obj = event["object"]
                    if plural == POLICIES:
                        self._policy(obj)
                    elif event["type"] != "DELETED":
                        self._channel(obj)
                    elif (obj.get("metadata") or {}).get("name") == sh.SCALE_NAME:
                        with self._lock:
                            self._scaled(None)
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch is restarted, as an agent's would be
                time.sleep(0.2)
            finally:
                w.stop()

    def _channel(self, obj: dict[str, Any]) -> None:
        scale = (obj.get("metadata") or {}).get("name") == sh.SCALE_NAME
        try:
            parsed = sh.scale_from_object(obj) if scale else sh.from_object(obj)
        except InvalidInput:
            with self._lock:
                self.malformed += 1
            return
        with self._lock:
            self.events += 1
            if isinstance(parsed, sh.Scale):
                self._scaled(parsed)
            else:
                self._apply(parsed.policy, parsed, time.monotonic())

    def _scaled(self, scale: sh.Scale | None) -> None:
        """A new factor: every policy's agents take it at once, their channels
        unwritten; called with the lock held."""
        old, self._scale = self._scale, scale
        now = time.monotonic()
        for policy, a in list(self._seen.items()):
            if a.share(old) != a.share(scale):
                self._apply(policy, a, now, moved=True)

    def _apply(self, policy: str, a: sh.Allocation, now: float, moved: bool = False) -> None:
        """The policy's agents apply `a` under the scale seen; called with the lock held."""
        admitted = sum(high - low + 1 for low, high in sh.decode_ranks(a.active_ranks)) \
            + len(a.active_pods)
        previous = self._seen.get(policy)
        self._seen[policy] = a
        old_share, old_n = self.applied.get(policy, (0.0, 0))
        new_share = a.share(self._scale) if admitted else 0.0
        self.applied[policy] = (new_share, admitted)
        self.total += new_share * admitted - old_share * old_n
        if moved or previous is None or previous.share(self._scale) != a.share(self._scale) \
                or previous.active_ranks != a.active_ranks:
            self.changes[policy].append(now)
        self._check(policy)

    def _policy(self, obj: dict[str, Any]) -> None:
        allowed = (obj.get("status") or {}).get("allowedBandwidthBytes")
        if allowed:
            with self._lock:
                self.budget[obj["metadata"]["name"]] = float(allowed)
                self._check(obj["metadata"]["name"])

    def _check(self, policy: str) -> None:
        share, admitted = self.applied.get(policy, (0.0, 0))
        self.per_policy.see(share * admitted, self.budget.get(policy), policy)
        self.cluster.see(self.total, self.cluster_cap, "cluster")

    def visible(self, since: float, pods: dict[str, str]) -> dict[str, float | int]:
        """For the pods (name -> policy) whose policy's share changed after
        `since`: how long until the last of them could see its final value
        (max) and the median pod could (p50)."""
        with self._lock:
            last = {p: t[-1] - since for p, t in self.changes.items() if t and t[-1] > since}
        lasts = sorted(last[policy] for policy in pods.values() if policy in last)
        if not lasts:
            return {"affected": 0}
        return {"affected": len(lasts), "p50_s": round(lasts[len(lasts) // 2], 3),
                "max_s": round(lasts[-1], 3)}
