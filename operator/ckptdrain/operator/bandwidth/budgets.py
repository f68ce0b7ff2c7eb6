"""Every policy's joint budget, recomputed only where something changed.

Each rebalance and each reconcile needs its policy's budget under the
cluster cap applied to all policies together, so it needs every policy's
sizing. Parsing and sizing a thousand policies takes tens of milliseconds;
asked once per policy per burst, that is quadratic in the number of
policies and was most of the operator's work at a thousand of them. Here a
policy is parsed again only when its spec changed (its uid or generation),
and the joint split is redone only when some policy's sizing input changed,
or a policy's first pod arrived or its last left (only policies with pods
take part in the split: operator/policy/fair_share.py). Any other pod
arriving or leaving changes only its own policy's per-drainer figure, never
the split: the model's budgets do not depend on the drainer count.
What remains per ask is a pass over the index, a lookup per policy; and a
rebalance of one policy while no policy changed (bandwidth/rebalance.py) skips even
that: it takes the last answer and recounts its own drainers (`recounted`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import allocation
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy.class_shares import ClassCap

Key = tuple[str, str]
Budget = tuple[sizing.Sizing, allocation.ClusterShare, pol.Policy]
Split = dict[Key, tuple[sizing.Sizing, allocation.ClusterShare]]
#: What the split depends on per policy: its one-drainer sizing input,
#: whether it has pods, its weight, and its class's cap (None: none).
_Part = tuple[sizing.SizingInput, bool, int, ClassCap | None]


def spec_stamp(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(uid, generation): what a policy's spec, and so its sizing input, is
    known by; None for a body without both, never taken for unchanged."""
    meta = body.get("metadata") or {}
    uid, generation = meta.get("uid"), meta.get("generation")
    return (uid, generation) if isinstance(uid, str) and type(generation) is int else None


def no_more_than(mine: Budget, last: tuple[sizing.Sizing, allocation.ClusterShare] | None
                 ) -> Budget | None:
    """`mine`, from a split made without the policies of namespaces whose
    labels were not reached in time (their parts went to the others: the
    whole cap, to the first policy after a start), cut to `last`, the last
    joint pass's sizing and share, where it gives more (a larger budget, or
    a larger cluster scale for its namespace); None where that pass gave
    none (the channel and status stay as they are) until it settles the split."""
    if last is None:
        return None
    sized, share, policy = mine
    if sized.allowed_bandwidth <= last[0].allowed_bandwidth and share.factor <= last[1].factor:
        return mine
    return (last[0], last[1], policy)


class JointBudgets:
    """Parsed policies and the last joint split, remembered. Safe to share
    between threads (one lock; the private helpers run under it). Every
    answer equals `allocation.joint_sizing` over freshly parsed policies
    (tests/unit/opcore/test_op_budgets.py)."""

    def __init__(self) -> None:
        #: What parsed the memo's policies (the operator's configuration):
        #: another one starts a new memo.
        self._context: object = None
        self._parse: Callable[[Mapping[str, Any], int], pol.Policy] = _unset
        #: key -> ((uid, generation), the policy parsed for one drainer, or None)
        self._parsed: dict[Key, tuple[tuple[str, int], pol.Policy | None]] = {}
        #: key -> (drainers, the policy for that many, the base it came from)
        self._counted: dict[Key, tuple[int, pol.Policy, pol.Policy]] = {}
        #: key -> (the split's sizing, drainers, that sizing for that many)
        self._spread: dict[Key, tuple[sizing.Sizing, int, sizing.Sizing]] = {}
        #: ((cluster cap, every valid policy's (one-drainer input, counted,
        #: weight, class cap)), their split)
        self._split: tuple[tuple[float | None, tuple[tuple[Key, _Part], ...]],
                           Split] | None = None
        self._lock = threading.Lock()

    def _base(self, key: Key, body: Mapping[str, Any]) -> pol.Policy | None:
        """`key`'s policy parsed for one drainer; None when invalid. Parsed
        again only when the spec may have changed (a new uid or generation;
        a body without both is never taken from the memo)."""
        stamp = spec_stamp(body)
        trusted = stamp is not None
        if trusted:
            cached = self._parsed.get(key)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        try:
            parsed: pol.Policy | None = self._parse(body, 1)
        except InvalidInput:
            parsed = None
        if trusted:
            self._parsed[key] = (stamp, parsed)  # type: ignore[assignment]
        return parsed

    def _counted_policy(self, key: Key, base: pol.Policy, drainers: int) -> pol.Policy:
        if drainers == base.sizing_input.drainers:
            return base
        cached = self._counted.get(key)
        if cached is not None and cached[0] == drainers and cached[2] is base:
            return cached[1]
        counted = dataclasses.replace(
            base, sizing_input=dataclasses.replace(base.sizing_input, drainers=drainers))
        self._counted[key] = (drainers, counted, base)
        return counted

    def _joint(self, inputs: dict[Key, _Part], cluster_cap: float | None) -> Split:
        ordered = (cluster_cap, tuple(sorted(inputs.items(), key=lambda kv: kv[0])))
        last = self._split
        if last is not None and last[0] == ordered:
            return last[1]
        joint = allocation.joint_sizing(
            {k: part[0] for k, part in ordered[1]}, cluster_cap,
            counted={k for k, part in ordered[1] if part[1]},
            weights={k: part[2] for k, part in ordered[1]},
            classes={k: part[3] for k, part in ordered[1] if part[3] is not None})
        self._split = (ordered, joint)
        return joint

    def compute(self, bodies: Mapping[Key, Mapping[str, Any]], drainers: Mapping[Key, int],
                cluster_cap: float | None,
                parse: Callable[[Mapping[str, Any], int], pol.Policy], context: object,
                fresh: Mapping[Key, pol.Policy] | None = None,
                weights: Mapping[str | Key, int] | None = None,
                caps: Mapping[Key, ClassCap] | None = None) -> dict[Key, Budget]:
        """Each valid policy's sizing under the joint budget, for its number of
        pods (at least one; a policy with none takes no part in the split).
        `parse(body, drainers)` raises InvalidInput
        for an invalid spec and depends on nothing but its arguments and
        `context` (compared by identity); `fresh` overrides what `bodies`
        hold (a reconcile's own just-parsed policy); `weights` are the
        weights under the cluster cap of policies (by key: their class's) or
        else of their namespaces (default 1)."""
        with self._lock:  # the memo is one state: one ask at a time
            if context is not self._context:
                self._context, self._parse = context, parse
                self._parsed.clear()
                self._counted.clear()
                self._spread.clear()
                self._split = None
            return self._compute(bodies, drainers, cluster_cap, fresh or {}, weights or {},
                                 caps or {})

    def _compute(self, bodies: Mapping[Key, Mapping[str, Any]], drainers: Mapping[Key, int],
                 cluster_cap: float | None, fresh: Mapping[Key, pol.Policy],
                 weights: Mapping[str | Key, int], caps: Mapping[Key, ClassCap]
                 ) -> dict[Key, Budget]:
        policies: dict[Key, pol.Policy] = {}
        #: One-drainer sizing inputs (the split does not depend on drainers),
        #: whether the policy has pods, its weight and its class's cap.
        inputs: dict[Key, _Part] = {}
        for key, body in bodies.items():
            base = self._base(key, body)
            if base is not None:
                policies[key] = self._counted_policy(key, base, max(1, drainers.get(key, 0)))
                inputs[key] = (base.sizing_input, drainers.get(key, 0) > 0,
                               weights.get(key, weights.get(key[0], 1)), caps.get(key))
        for key, given in fresh.items():
            policies[key] = given
            inputs[key] = (dataclasses.replace(given.sizing_input, drainers=1),
                           drainers.get(key, 0) > 0, weights.get(key, weights.get(key[0], 1)),
                           caps.get(key))
        if len(self._parsed) > 2 * len(bodies) + 64:  # policies gone without a word
            for gone in set(self._parsed) - set(bodies):
                self._forget_locked(gone)
        out: dict[Key, Budget] = {}
        for key, (sized, share) in self._joint(inputs, cluster_cap).items():
            policy = policies[key]
            out[key] = (self._spread_over(key, sized, policy.sizing_input.drainers), share,
                        policy)
        return out

    def _spread_over(self, key: Key, sized: sizing.Sizing, drainers: int) -> sizing.Sizing:
        """`sized` (for one drainer) for `drainers`, as `sizing.compute` gives it."""
        if drainers == sized.drainers:
            return sized
        cached = self._spread.get(key)
        if cached is not None and cached[0] is sized and cached[1] == drainers:
            return cached[2]
        spread = dataclasses.replace(sized, drainers=drainers,
                                     per_drainer_bandwidth=sized.allowed_bandwidth / drainers)
        self._spread[key] = (sized, drainers, spread)
        return spread

    def recounted(self, key: Key, budget: Budget, drainers: int) -> Budget:
        """`budget` (one of compute's answers) for `drainers` (at least
        one): as compute would give it while no policy changed."""
        sized, share, policy = budget
        with self._lock:
            counted = self._counted_policy(key, policy, max(1, drainers))
            return (self._spread_over(key, sized, counted.sizing_input.drainers), share,
                    counted)

    def forget(self, key: Key) -> None:
        """A deleted policy's memo (its name may come back as another policy)."""
        with self._lock:
            self._forget_locked(key)

    def _forget_locked(self, key: Key) -> None:
        self._parsed.pop(key, None)
        self._counted.pop(key, None)
        self._spread.pop(key, None)


def _unset(body: Mapping[str, Any], drainers: int) -> pol.Policy:
    raise AssertionError("JointBudgets.compute sets the parser first")
