"""Publishing each policy's share channel (contract/share.py): who is
admitted to drain, and the budget they split.

One write of one small object per change of a policy's budget or drainer
set, whatever the number of writers; never a write to a pod. Admission is
two-step so the shares never add up to more than the budget: a pod that
starts draining is first counted (everyone's share shrinks), then admitted
in a later pass, `JOIN_DELAY_S` after its count was published.

While anyone drains, the channel is rewritten at least every HEARTBEAT_S
(spec.heartbeat), so agents can tell a quiet operator from a gone one.

Each namespace's factor of the cluster cap (the largest of its draining
policies', `namespace_factors`) is published once per namespace
(`publish_scale`), before any channel computed with it; a lighter policy's
channel claims less, so that claim × factor is its own part (`claims`).
A scale can only
lower a budget (the agent takes the smaller of the channel's and claim ×
factor), so a channel is rewritten when its budget grows, when more than
the factor moved, or when it shrinks by its policy's own change, never for
a shrink the scale carries: a new job under the cap costs one write per
namespace, not one per policy. Where the scale is not in place, or a pod's
agent predates it, the channel carries no claim and is rewritten for every
change of budget.

`admit` and `allocation` are pure; `publish` keeps the last state per policy
in memory. A restarted operator (or a replica that just became the active
one) starts with nobody admitted: every drainer waits one `JOIN_DELAY_S` and
goes on (never more than the budget, at the price of a second's pause).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptdrain.contract import share as sh
from ckptdrain.contract.record import owner_reference
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.bandwidth.placed_scale import placed_factor

Key = tuple[str, str]


@dataclass(frozen=True)
class Drainer:
    """A pod with bytes pending, as the channel sees it."""

    pod: str
    rank: int | None


@dataclass
class ChannelState:
    active: frozenset[str] = frozenset()
    #: Pod → when the publication that first counted it was written (monotonic).
    joining_since: dict[str, float] = field(default_factory=dict)
    published: dict[str, Any] | None = None
    #: When this replica last wrote the channel (monotonic): heartbeats follow
    #: it; and the budget it wrote (a scale may lower it, never raise it).
    written_at: float | None = None
    written_budget: int | None = None
    #: The claim that write carried (its agents may apply less), or None.
    written_wanted: int | None = None


def rank_of(label: str | None) -> int | None:
    """A writer rank from the pod's `ckptdrain.io/writer` label; None if absent or odd."""
    if label is None or not label.strip().isdigit():
        return None
    return int(label.strip())


def admit(state: ChannelState, draining: Sequence[Drainer], now: float,
          delay: float = sh.JOIN_DELAY_S) -> tuple[frozenset[str], dict[str, float],
                                                   float | None]:
    """(admitted pods, joining pods → counted since, seconds until the next
    may be admitted or None). Admitted pods that stopped draining leave; a
    joining pod is admitted once its count has been out for `delay`."""
    present = {d.pod for d in draining}
    active = set(state.active & present)
    joining = {p: state.joining_since.get(p, now) for p in present - active}
    for pod, since in list(joining.items()):
        if now - since >= delay:
            active.add(pod)
            del joining[pod]
    recheck = min((delay - (now - since) for since in joining.values()), default=None)
    return frozenset(active), joining, recheck


def allocation(policy: str, budget: float, cap: float | None, draining: Sequence[Drainer],
               active: frozenset[str], writers: int | None = None,
               heartbeat: str | None = None, wanted: float | None = None) -> sh.Allocation:
    """The publication. A rank two pods hold (a replacement beside the pod in
    its grace period, a collision) is never published as a rank: each such pod
    is admitted by its own name, so one's admission is not the other's."""
    held: dict[int, int] = {}
    for d in draining:
        if d.rank is not None:
            held[d.rank] = held.get(d.rank, 0) + 1
    ranked = [d.rank for d in draining
              if d.pod in active and d.rank is not None and held[d.rank] == 1]
    named = sorted(d.pod for d in draining
                   if d.pod in active and (d.rank is None or held[d.rank] > 1))
    return sh.Allocation(policy=policy, budget=max(1, int(budget)), drainers=len(draining),
                         active_ranks=sh.encode_ranks(ranked), active_pods=tuple(named),
                         per_drainer_cap=None if cap is None else max(1, int(cap)),
                         writers=None if writers is None else max(1, writers),
                         heartbeat=heartbeat,
                         wanted=None if wanted is None else max(1, int(wanted)))


#: What a shrink of the factor moves: the scale carries it, not the channel.
_SCALED = ("budgetBytes", "heartbeat")


def _own(spec: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if spec is None else {k: v for k, v in spec.items() if k not in _SCALED}


@dataclass
class ScaleState:
    #: Namespace → (factor, cluster cap) last written to it.
    last: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    #: When every namespace's scale was last written (a heartbeat).
    written_at: float | None = None
    #: Namespace → the spec its scale object holds, as this replica wrote it.
    placed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Namespace → when its scale last failed to be written (retried a heartbeat later).
    failed_at: dict[str, float] = field(default_factory=dict)


_scale = ScaleState()
_scale_lock = threading.Lock()

#: Each namespace's factor (namespaces weigh differently under the cluster
#: cap), or one factor for all of them.
Factors = float | Mapping[str, float]
#: A view of the whole cluster, taken when asked: (namespaces with a valid
#: policy, their factors, the cluster cap).
ScaleView = Callable[[], tuple[set[str], Factors, float | None]]


def _factor_of(factors: Factors, namespace: str) -> float | None:
    return factors.get(namespace) if isinstance(factors, Mapping) else factors


def publish_joint_scale(namespace: str, joint: Mapping[Key, tuple[Any, Any, Any]],
                        cluster_bandwidth: float | None,
                        budgets_now: Callable[[], Mapping[Key, tuple[Any, Any, Any]]], *,
                        may_raise: bool = False, active: Callable[[], bool] = lambda: True,
                        log: Callable[[str], None] = lambda _: None) -> bool:
    """`publish_scale` from joint budgets (bandwidth/budgets.py: key →
    (sizing, cluster share, policy)); `budgets_now()` gives them afresh."""
    factors = namespace_factors

    def fresh() -> tuple[set[str], dict[str, float], float | None]:
        now = budgets_now()
        if not now:
            return set(), {}, cluster_bandwidth
        return {key[0] for key in now}, factors(now), next(iter(now.values()))[1].cluster_cap

    cluster = next(iter(joint.values()))[1]
    mine = factors(joint)
    if namespace:
        # A policy's own pass sees its own share only: a factor in place
        # at its level (the heaviest's of its namespace) is the one it
        # would choose, not a reason to ask every policy's budgets again.
        with _scale_lock:
            last = _scale.last.get(namespace)
        if last is not None and any(key[0] == namespace and share.claim_under(last[0]) is not None
                                    for key, (_, share, _) in joint.items()):
            mine[namespace] = last[0]
    return publish_scale(namespace, mine, cluster.cluster_cap, fresh,
                         may_raise=may_raise, active=active, log=log)


def namespace_factors(joint: Mapping[Key, tuple[Any, Any, Any]]) -> dict[str, float]:
    """Each namespace's factor: the largest of its draining policies' (of all
    its policies' while none drains). Every policy's channel claims its
    part of it (`ClusterShare.claim_under`: CLAIM × its weight ÷ the
    heaviest's, never above CLAIM, so wantedBytes stays a whole number the
    API keeps), so a new level costs one write per namespace, however the
    weights mix; a policy that starts or stops draining moves the claims of
    its namespace's channels only when it is, or was, the heaviest."""
    out: dict[str, float] = {}
    counted = {key[0] for key, (_, share, _) in joint.items() if share.counted}
    for key, (_, share, _) in joint.items():
        if share.counted or key[0] not in counted:
            out[key[0]] = max(out.get(key[0], share.factor), share.factor)
    return out


def claims(namespace: str, share: Any) -> int | None:
    """The claim a channel of `namespace` with cluster share `share` may
    carry, leaving its cuts to the scale: claim × the factor its
    namespace's scale holds, as this replica wrote it, is its fair part;
    None where no claim is (the scale not in place, or at another level)."""
    with _scale_lock:
        last = _scale.last.get(namespace)
        if last is None or namespace not in _scale.placed:
            return None
    return share.claim_under(last[0])


def placed(namespace: str) -> bool:
    """Whether `namespace`'s scale holds what this replica last chose for it
    (its last write did not fail)."""
    with _scale_lock:
        return namespace in _scale.placed


def publish_scale(namespace: str, factor: Factors, cluster_cap: float | None,
                  fresh: ScaleView, *, may_raise: bool = False,
                  active: Callable[[], bool] = lambda: True,
                  log: Callable[[str], None] = lambda _: None) -> bool:
    """Whether `namespace`'s scale object holds a factor no larger than its
    own now (its channels may then leave shrinks to it), after writing what
    moved. A factor unlike the last written to its namespace (or the last
    writing HEARTBEAT_S old, which also mends a scale edited by hand or
    written by a replica that lost its lease) makes this take every
    namespace's factor from `fresh()` under the lock and write each one that
    moved, so a pass that read the cluster before a new policy never writes
    an older, larger factor over a newer one. Channel publications wait
    behind it (they call this first). A smaller factor goes out at once; a
    larger one only with `may_raise`, which the joint pass gives once the
    channels that shrink are out (larger than what is placed, where this
    process wrote none: bandwidth/placed_scale.py). No cluster cap: no scale. A namespace whose
    write fails is retried a heartbeat later (logged): its channels carry
    their whole budget meanwhile."""
    if cluster_cap is None:
        return False
    with _scale_lock:
        now = time.monotonic()
        due = _scale.written_at is None or now - _scale.written_at >= sh.HEARTBEAT_S
        mine = _factor_of(factor, namespace)
        if not due and mine is not None and _scale.last.get(namespace) == (mine, cluster_cap) \
                and namespace in _scale.placed:
            return True
        namespaces, factors, cluster_cap = fresh()
        if cluster_cap is None:
            return False
        chosen: dict[str, tuple[float, float | None]] = {}
        for target in namespaces:
            wanted = _factor_of(factors, target)
            if wanted is None:
                continue
            if not may_raise:
                # Held back until the shrinking channels are out; a factor this
                # process never wrote is the one placed (a restart, a new
                # release), None where that cannot be told: nothing is written.
                held = _scale.last[target][0] if target in _scale.last \
                    else placed_factor(target)
                if held is None:
                    continue
                wanted = min(wanted, held)
            chosen[target] = (wanted, cluster_cap)
        specs = {n: sh.scale_spec(*value) for n, value in chosen.items()}
        for gone in set(_scale.placed) - namespaces:
            del _scale.placed[gone]
        for gone in set(_scale.last) - namespaces:
            del _scale.last[gone]
        targets = set(specs) if due else {
            n for n, spec in specs.items()
            if _scale.last.get(n) != chosen[n] or (
                n == namespace and _scale.placed.get(n) != spec)}
        for target in sorted(targets):
            spec = specs[target]
            moved = _scale.last.get(target) != chosen[target]
            failed = _scale.failed_at.get(target)
            if failed is not None and now - failed < sh.HEARTBEAT_S and not (due or moved):
                continue
            if not active():  # a replica that lost its lease writes nothing more
                return False
            _scale.last[target] = chosen[target]
            try:
                kube.write_object(sh.SHARES, target, sh.scale_body(target, spec),
                                  {"spec": spec})
                _scale.placed[target] = spec
                _scale.failed_at.pop(target, None)
            except Exception as err:  # one namespace's trouble is not every other's
                _scale.placed.pop(target, None)
                _scale.failed_at[target] = now
                log(f"cluster scale in {target} not written ({err}); its channels carry "
                    "their whole budget")
        if due:
            _scale.written_at = now
        return namespace in specs and _scale.placed.get(namespace) == specs[namespace]


_states: dict[Key, ChannelState] = {}
_lock = threading.Lock()


def publish(key: Key, budget: float, cap: float | None, draining: Sequence[Drainer],
            writers: int, owner: Mapping[str, Any] | None, now: float,
            stamp: Callable[[], str], wanted: float | None = None,
            carried: bool = True) -> tuple[bool, float | None]:
    """Write the policy's channel if it changed (a smaller budget, when it has a
    `wanted` claim and the scale `carried` the shrink, is the scale's to
    carry: `publish_scale` first; a policy the cap does not cut shrinks by
    its own change, which no factor says), or if anyone drains and the last
    write is HEARTBEAT_S old. Returns (written,
    seconds until it should be looked at again: a joiner to admit or a
    heartbeat due). The caller serialises calls per policy."""
    with _lock:
        state = _states.setdefault(key, ChannelState())
    active, joining, recheck = admit(state, draining, now)
    alloc = allocation(key[1], budget, cap, draining, active, writers, wanted=wanted)
    spec = sh.to_spec(alloc)
    beat_due = bool(draining) and (state.written_at is None
                                   or now - state.written_at >= sh.HEARTBEAT_S)
    moved = _own(spec) != _own(state.published) or state.written_budget is None \
        or (spec["budgetBytes"] > state.written_budget if wanted is not None and carried
            else spec["budgetBytes"] != state.written_budget)
    written = False
    if moved or beat_due:
        stamped = dataclasses.replace(alloc, heartbeat=stamp())
        body = sh.body(key[0], stamped, owner)
        patch = {"metadata": {k: v for k, v in body["metadata"].items()
                              if k in ("labels", "ownerReferences")},
                 "spec": sh.to_spec(stamped)}
        kube.write_object(sh.SHARES, key[0], body, patch)
        written = True
        # The join delay counts from when the count was out, not from before
        # the write: those counted now start their wait only here.
        after = time.monotonic()
        joining = {p: (after if p not in state.joining_since else since)
                   for p, since in joining.items()}
        state.written_at, state.written_budget = after, int(stamped.budget)
        state.written_wanted = stamped.wanted
    # Only what was written counts: a failed write (an exception above) leaves
    # the state as it was, and the next pass counts the joiners again.
    state.active, state.joining_since, state.published = active, joining, spec
    if draining:
        beat = sh.HEARTBEAT_S - (now - (state.written_at or now))
        recheck = beat if recheck is None else min(recheck, beat)
    return written, recheck


def written(key: Key) -> tuple[int, int | None] | None:
    """What this replica last wrote to the policy's channel: (its budget,
    the claim it carried or None); None if it has not written it."""
    with _lock:
        state = _states.get(key)
    if state is None or state.written_budget is None:
        return None
    return state.written_budget, state.written_wanted


def ceiling(key: Key) -> float | None:
    """The most the policy's agents may apply now, as this replica wrote its
    channel and its namespace's scale: the channel's budget, or claim × the
    scale's factor where that is smaller; None if it has not written it."""
    with _lock:
        state = _states.get(key)
        budget, wanted = (None, None) if state is None else (state.written_budget,
                                                             state.written_wanted)
    if budget is None:
        return None
    with _scale_lock:
        last = _scale.last.get(key[0])
    if wanted is None or last is None:
        return float(budget)
    return min(float(budget), wanted * last[0])


def forget(key: Key | None = None) -> None:
    """The policy is gone (its object goes with it, by owner reference), or
    with no key, every policy (this replica stopped being the active one)."""
    with _lock:
        if key is None:
            _states.clear()
        else:
            _states.pop(key, None)
    if key is None:
        with _scale_lock:
            global _scale
            _scale = ScaleState()


# Standby, then active again: the other replica wrote channels and scales
# meanwhile, so what this one last wrote is no reason to skip a write.
leadership.on_new_term(forget)


def owner_of(policy_body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The channel's controller, its policy at the storage version (not the
    body's own: the core holds it at v1alpha1); None before it has a uid."""
    meta = policy_body.get("metadata") or {}
    if not meta.get("uid"):
        return None
    return {**owner_reference(str(meta.get("name") or ""), meta["uid"]),
            "controller": True, "blockOwnerDeletion": False}
