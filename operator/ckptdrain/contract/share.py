"""The share channel: one small object per policy from which every agent
derives its own bandwidth share. Pure.

The operator publishes a CheckpointShare named after the policy:

    spec.budgetBytes          the policy's joint budget (bytes/s)
    spec.perDrainerCapBytes   no drainer above this (absent: no cap)
    spec.drainers             pods counted in the split: admitted + joining
    spec.activeRanks          admitted writer ranks, as ranges ("0-9,12")
    spec.activePods           admitted pods by name: those without a rank,
                              and those sharing a rank with another pod
    spec.writers              pods that may drain (the policy's writers, or
                              more pods if there are): the fallback split
    spec.heartbeat            when the operator last wrote it; rewritten at
                              least every HEARTBEAT_S while anyone drains
    spec.wantedBytes          the policy's claim on the cluster cap:
                              allocation.CLAIM for its namespace's heaviest
                              draining policy, CLAIM × weight ÷ that one's
                              for a lighter one (absent: the channel's
                              budget is all there is)

The cluster cap is split fairly by weight among the policies with pods
(operator/policy/fair_share.py): each gets min(what it wants, weight × λ)
for one level λ; weights are per namespace or class. The operator
publishes each namespace's heaviest draining weight × λ ÷ CLAIM once, in
the CheckpointShare named SCALE_NAME (a name no policy may take):

    spec.clusterScale.factor          heaviest weight × λ ÷ CLAIM: claim ×
                                      factor is the fair part of each of its
                                      policies
    spec.clusterScale.clusterCapBytes the cap it keeps (absent: no cap)

An agent watches both objects and takes the smaller of its channel's budget
and `wantedBytes × factor` (`Allocation.budget_under`): a smaller factor
(a new job under the cap, or a namespace's weight lowered) reaches every
agent of the namespace in that one write, while no scale, however stale or
hand-edited, can raise a budget above what the channel says. A claim
is the same whatever the cap and the level, so a channel written before
either changed is cut by the factor that follows; it moves only with the
ratio of its policy's weight to its namespace's heaviest draining one, and
never passes CLAIM. The operator rewrites a channel when its claim moves,
when its budget grows, when more than the factor moved, and when it
shrinks by the policy's own change (a policy the cap does not cut wants
less: no factor says that) (`operator/bandwidth/share_channel.py`). It
writes the smaller factor before any channel computed with it; a new
policy's drainers are admitted JOIN_DELAY_S after they were counted, and a
policy's first pod is counted only after the joint pass that shrinks every
other channel, so every agent has seen the smaller factor or share first.
A channel with `wantedBytes` and no scale to go with it is not current (the
scale deleted, or its watch down). Where the scale cannot be written, where
there is no cluster cap, or while a pod's agent has not said it reads it
(annotation `ckptdrain.io/share-scale`, in its own report), the operator
leaves `wantedBytes` out and rewrites the channel for every change of
budget.

Why the sum of applied shares stays within the budget: a new drainer is
first counted in `drainers` (everyone's share shrinks) and admitted only in a
later publication, at least `JOIN_DELAY_S` after, by which time every agent
watching has seen the smaller share. A drainer leaves the count only after it
reported nothing pending, i.e. after it stopped. When the channel cannot be
trusted (the watch broken, or no heartbeat for DEAD_AFTER_S while some drain:
the operator is gone) every agent drops to the fallback split, at most
budget / writers each; a drainer never counted waits ADMIT_TIMEOUT_S, longer
than that, before it takes its fallback share, so the admitted have dropped
first. The one exception is a SIGTERM flush, which starts at once at its
fallback share (a second or two over, until it is counted, rather than a
lost emergency checkpoint). The object's size does not grow with writers
beyond the rank ranges (a few bytes while ranks are contiguous; at most ~6
bytes a writer when every other rank drains).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptdrain.contract.api import GROUP, LABEL_POLICY, VERSION, policy_labelled
from ckptdrain.errors import InvalidInput

SHARES = "checkpointshares"
KIND_SHARE = "CheckpointShare"
#: A joining drainer is admitted no sooner than this after it was counted:
#: the time every watcher has to see the smaller share first.
JOIN_DELAY_S = 1.0
#: The operator rewrites a channel with drainers at least this often, and an
#: agent that has seen nothing from it for DEAD_AFTER_S takes it for gone.
HEARTBEAT_S = 10.0
DEAD_AFTER_S = 30.0
#: How long a counted-or-not drainer waits to be admitted before it takes its
#: fallback share: past DEAD_AFTER_S, so those admitted have dropped first.
ADMIT_TIMEOUT_S = DEAD_AFTER_S + 5.0
#: The rate a waiting agent's limiter is set to (a rate must be positive);
#: as good as paused, and left within the limiter's 0.1 s when admitted.
PAUSED_RATE = 1.0

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


#: The namespace's cluster scale: a CheckpointShare no policy may be named as.
SCALE_NAME = "cluster-scale.ckptdrain.io"


def share_name(policy: str) -> str:
    """The CheckpointShare of a policy: the policy's own name (one per policy
    and namespace, like the policy; never SCALE_NAME, which policy validation
    refuses)."""
    return policy


def reserved_name_problem(policy: str) -> InvalidInput | None:
    """Why a policy cannot be named so (its channel would be the scale), or None."""
    if policy == SCALE_NAME:
        return InvalidInput("metadata.name", "any name but the namespace's cluster scale "
                            "channel's", policy)
    return None


def encode_ranks(ranks: Iterable[int]) -> str:
    """Sorted ranks as ranges: {0,1,2,5,7,8} → "0-2,5,7-8"."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def decode_ranks(text: str, field_name: str = "spec.activeRanks") -> list[tuple[int, int]]:
    """"0-2,5" → [(0, 2), (5, 5)]; InvalidInput naming the field otherwise."""
    spans: list[tuple[int, int]] = []
    if not text.strip():
        return spans
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise InvalidInput(field_name, "ranges of ranks like 0-9,12", text[:80])
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low:
            raise InvalidInput(field_name, "ranges whose end is not below their start",
                               part)
        spans.append((low, high))
    return spans


@dataclass(frozen=True)
class Allocation:
    """One publication of a policy's share channel."""

    policy: str
    budget: int
    drainers: int
    active_ranks: str = ""
    active_pods: tuple[str, ...] = ()
    per_drainer_cap: int | None = None
    #: Pods that may drain (None: not said, an older operator's object).
    writers: int | None = None
    heartbeat: str | None = None
    #: The policy's claim on the cluster cap: 10^18 × its weight ÷ the
    #: heaviest draining policy's weight in its namespace (never above 10^18),
    #: so claim × the namespace's factor is its fair part (None: no scale
    #: applies).
    wanted: int | None = None
    _spans: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)

    def admits(self, rank: int | None, pod: str) -> bool:
        """Whether this agent (its writer rank, if it has one, and pod name) may drain."""
        if pod in self.active_pods:
            return True
        if rank is None:
            return False
        spans = self._spans or tuple(decode_ranks(self.active_ranks))
        return any(low <= rank <= high for low, high in spans)

    def budget_under(self, scale: Scale | None) -> float:
        """The policy's budget now: the smaller of the one published and its
        claim times the namespace's scale. The scale only ever lowers it."""
        if scale is None or self.wanted is None:
            return float(self.budget)
        return max(min(float(self.budget), self.wanted * scale.factor), PAUSED_RATE)

    def share(self, scale: Scale | None = None) -> float:
        """What each admitted drainer may use, bytes/s (> 0)."""
        each = self.budget_under(scale) / max(self.drainers, 1)
        if self.per_drainer_cap is not None:
            each = min(each, self.per_drainer_cap)
        return max(each, PAUSED_RATE)

    def fallback_cap(self, scale: Scale | None = None) -> float | None:
        """The most a fallback share may be: the budget over every pod that may
        drain (so fallback shares alone never sum above the budget)."""
        if not self.writers:
            return None
        return max(self.budget_under(scale) / self.writers, PAUSED_RATE)


@dataclass(frozen=True)
class Scale:
    """The namespace's cluster scale, as published."""

    factor: float
    cluster_cap: int | None = None


def to_spec(a: Allocation) -> dict[str, Any]:
    spec: dict[str, Any] = {"policy": a.policy, "budgetBytes": int(a.budget),
                            "drainers": int(a.drainers), "activeRanks": a.active_ranks,
                            "activePods": list(a.active_pods)}
    # Explicitly null when absent, so a merge patch removes a cap that was dropped.
    spec["perDrainerCapBytes"] = None if a.per_drainer_cap is None else int(a.per_drainer_cap)
    spec["writers"] = None if a.writers is None else int(a.writers)
    spec["heartbeat"] = a.heartbeat
    spec["wantedBytes"] = None if a.wanted is None else max(1, int(a.wanted))
    return spec


def scale_spec(factor: float, cluster_cap: float | None) -> dict[str, Any]:
    """The scale object's spec (factor in (0, 1]). Nothing that moves without
    the factor moving: every write is one every agent must see."""
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise InvalidInput("spec.clusterScale.factor", "a number in (0, 1]", factor)
    return {"clusterScale": {"factor": factor,
                             "clusterCapBytes": None if cluster_cap is None
                             else max(1, int(cluster_cap))}}


def scale_body(namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    scale = {k: v for k, v in spec["clusterScale"].items() if v is not None}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND_SHARE,
            "metadata": {"name": SCALE_NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "ckptdrain"}},
            "spec": {"clusterScale": scale}}


def scale_from_object(obj: Mapping[str, Any]) -> Scale:
    """The scale as read from the API; InvalidInput naming the field if malformed
    (the agent then treats its channel as not current)."""
    spec = obj.get("spec")
    scale = spec.get("clusterScale") if isinstance(spec, Mapping) else None
    if not isinstance(scale, Mapping):
        raise InvalidInput("spec.clusterScale", "an object", type(scale).__name__)
    factor = scale.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not math.isfinite(factor) or not 0 < factor <= 1:
        raise InvalidInput("spec.clusterScale.factor", "a number in (0, 1]", factor)
    cap = scale.get("clusterCapBytes")
    if cap is not None:
        cap = _int(scale, "clusterCapBytes", 1, "spec.clusterScale")
    return Scale(factor=float(factor), cluster_cap=cap)


def body(namespace: str, a: Allocation, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """The whole object, owned by its policy so it goes when the policy does.
    Labelled with the policy's name when it fits a label value: the apiserver
    refuses a longer one, and one refused write would fail the whole joint
    pass, every other policy's channel with it."""
    meta: dict[str, Any] = {"name": share_name(a.policy), "namespace": namespace}
    if policy_labelled(a.policy):
        meta["labels"] = {LABEL_POLICY: a.policy}
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    spec = {k: v for k, v in to_spec(a).items() if v is not None}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND_SHARE, "metadata": meta,
            "spec": spec}


def _int(spec: Mapping[str, Any], key: str, minimum: int, where: str = "spec") -> int:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{where}.{key}", f"a whole number ≥ {minimum}", value)
    return value


def from_object(obj: Mapping[str, Any]) -> Allocation:
    """An allocation as read from the API; InvalidInput naming the field if malformed
    (the agent then keeps its fallback share: never unlimited)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidInput("spec", "an object", type(spec).__name__)
    policy = spec.get("policy")
    if not isinstance(policy, str) or not policy:
        raise InvalidInput("spec.policy", "the policy's name", policy)
    budget = _int(spec, "budgetBytes", 1)
    drainers = _int(spec, "drainers", 0)
    cap = spec.get("perDrainerCapBytes")
    if cap is not None:
        cap = _int(spec, "perDrainerCapBytes", 1)
    ranks = spec.get("activeRanks") or ""
    if not isinstance(ranks, str):
        raise InvalidInput("spec.activeRanks", "a string of rank ranges", ranks)
    spans = tuple(decode_ranks(ranks))
    pods = spec.get("activePods") or []
    if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
        raise InvalidInput("spec.activePods", "a list of pod names", pods)
    writers = spec.get("writers")
    if writers is not None:
        writers = _int(spec, "writers", 1)
    heartbeat = spec.get("heartbeat")
    if heartbeat is not None and not isinstance(heartbeat, str):
        raise InvalidInput("spec.heartbeat", "a timestamp", heartbeat)
    wanted = spec.get("wantedBytes")
    if wanted is not None:
        wanted = _int(spec, "wantedBytes", 1)
    admitted = sum(high - low + 1 for low, high in spans) + len(pods)
    if admitted > drainers:
        # Could only come from a bug or a hand edit; trusting it would let the
        # admitted sum exceed the budget.
        raise InvalidInput("spec.drainers", f"at least the {admitted} admitted", drainers)
    return Allocation(policy=policy, budget=budget, drainers=drainers, active_ranks=ranks,
                      active_pods=tuple(pods), per_drainer_cap=cap, writers=writers,
                      heartbeat=heartbeat, wanted=wanted, _spans=spans)
