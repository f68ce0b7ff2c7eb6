"""Publishing each policy's share channel (contract/share.py): who is
admitted to drain, and the budget they split.

One write of one small object per change of a policy's budget or drainer
set, whatever the number of writers; never a write to a pod. Admission is
two-step so the shares never add up to more than the budget: a pod that
starts draining is first counted (everyone's share shrinks), then admitted
in a later pass, `JOIN_DELAY_S` after its count was published.

`admit` is pure; `publish` keeps the last state per policy in memory. A
restarted operator starts with nobody admitted: every drainer waits one
`JOIN_DELAY_S` and goes on (never more than the budget, at the price of a
second's pause).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptdrain.contract import share as sh
from ckptdrain.operator import kube

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
               active: frozenset[str]) -> sh.Allocation:
    ranked = [d.rank for d in draining if d.pod in active and d.rank is not None]
    named = sorted(d.pod for d in draining if d.pod in active and d.rank is None)
    return sh.Allocation(policy=policy, budget=max(1, int(budget)), drainers=len(draining),
                         active_ranks=sh.encode_ranks(ranked), active_pods=tuple(named),
                         per_drainer_cap=None if cap is None else max(1, int(cap)))


_states: dict[Key, ChannelState] = {}
_lock = threading.Lock()


def publish(key: Key, budget: float, cap: float | None, draining: Sequence[Drainer],
            owner: Mapping[str, Any] | None, now: float) -> tuple[bool, float | None]:
    """Write the policy's channel if it changed. Returns (written, seconds until
    a joining drainer may be admitted). The caller serialises calls per policy."""
    with _lock:
        state = _states.setdefault(key, ChannelState())
    active, joining, recheck = admit(state, draining, now)
    alloc = allocation(key[1], budget, cap, draining, active)
    spec = sh.to_spec(alloc)
    written = False
    if spec != state.published:
        body = sh.body(key[0], alloc, owner)
        kube.write_object(sh.SHARES, key[0], body, spec)
        written = True
    # Only what was written counts: a failed write (an exception above) leaves
    # the state as it was, and the next pass counts the joiners again.
    state.active, state.joining_since, state.published = active, joining, spec
    return written, recheck


def forget(key: Key) -> None:
    """The policy is gone (its object goes with it, by owner reference)."""
    with _lock:
        _states.pop(key, None)


def owner_of(policy_body: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = policy_body.get("metadata") or {}
    if not meta.get("uid"):
        return None
    return {"apiVersion": policy_body.get("apiVersion") or "ckptdrain.io/v1alpha1",
            "kind": "CheckpointPolicy", "name": meta.get("name"), "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": False}
