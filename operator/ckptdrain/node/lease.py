"""The writer fence: a coordination.k8s.io Lease per policy and writer rank,
held by the agent's pod (its uid), so two live pods that were both given one
rank (admission off, or admitted at the same instant) never both commit as
that writer.

    ckptdrain-<policy>-w<rank>   holderIdentity = pod uid, annotation
                                 ckptdrain.io/holder-node = its node; renewed
                                 every third of its duration, checked before
                                 each commit

The duration follows the checkpoint cadence (`lease_seconds`: three global
commit periods, at least LEASE_SECONDS, at most MAX_LEASE_SECONDS), so a
writer renews about once per global checkpoint, and the check before a commit
costs no write while the last renewal is younger than a third of the
duration: nobody may take a lease before it has gone unchanged for its whole
duration, so a renewal that recent still vouches for it.

A pod may take the lease when nobody holds it, it holds it already, the
holder stopped renewing for the lease's duration (it died, or is cut off), or
the holder's node is gone: its kubelet's node lease (kube-node-lease/<node>)
deleted or seen unchanged for NODE_DEAD_S. That is what makes a long lease
safe to fail over: a node lost with its pod frees the writer within about a
minute, not a duration later. "Stopped renewing" and "unchanged" are judged
as client-go's leader election does: by how long THIS process has seen the
lease unchanged (resourceVersion, holder, renewTime) on its own monotonic
clock, never by comparing the holder's renewTime with the local wall clock (a
node whose clock runs ahead would take a live lease). An agent that stops
cleanly frees it after its last commit (a pod still flushing within its grace
period keeps it until then); a pod whose agent restarts in place is the same
holder (the pod's uid) and keeps it.

Writes carry the resourceVersion read, so two takers racing for an expired
lease cannot both win.

What is not evidence of another holder does not stop a commit: without
rights on leases (403) fencing is off, said once in the log; without rights
on node leases the node test is off and only the duration frees a lease; a
failed renewal (the apiserver unreachable) keeps the last known answer, but
only while the last successful renewal is younger than the duration minus a
third of it: past that another pod may have taken the lease, so commits stop
(the drain retries; checkpoints stay local) until a renewal succeeds again.
Training and its checkpoints never wait on the apiserver.

Pure: names, the decision and the spec; `node/kube.WriterLease` makes the calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ckptdrain.errors import CkptdrainError

LEASE_API, LEASE_PLURAL = ("coordination.k8s.io", "v1"), "leases"
#: The shortest and the longest duration a writer lease is given.
LEASE_SECONDS = 60
MAX_LEASE_SECONDS = 3600
#: Where kubelets keep their node leases (renewed every 10 s), and how long
#: one must be seen unchanged before its node counts as gone (the node
#: controller's own grace is 40-50 s).
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_DEAD_S = 60.0
ANNOTATION_HOLDER_NODE = "ckptdrain.io/holder-node"
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class WriterFenced(CkptdrainError):
    """Another live pod holds this writer's lease: this one must not commit."""


def lease_name(policy: str, writer: int) -> str:
    """Deterministic per namespace, policy and writer (a DNS subdomain)."""
    base = re.sub(r"[^a-z0-9-]", "-", policy.lower())[:200].strip("-")
    return f"ckptdrain-{base}-w{writer}"


def lease_seconds(commit_period_s: float) -> int:
    """A writer lease's duration: three global commit periods, so it is
    renewed about once a commit, within [LEASE_SECONDS, MAX_LEASE_SECONDS]."""
    if not commit_period_s > 0:
        return LEASE_SECONDS
    return int(min(MAX_LEASE_SECONDS, max(LEASE_SECONDS, 3 * commit_period_s)))


def may_take(spec: Mapping[str, Any], me: str, unchanged_for: float,
             holder_node_gone: bool = False) -> bool:
    """Free, already ours, its holder's node gone, or seen unchanged by this
    process for its duration (`unchanged_for`: seconds on this process's
    monotonic clock, ExpiryWatch)."""
    holder = spec.get("holderIdentity")
    if not holder or holder == me or holder_node_gone:
        return True
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(duration, int):
        return True
    return unchanged_for > duration


class ExpiryWatch:
    """How long this process has observed another holder's lease unchanged.

    Any change of resourceVersion, holder or renewTime is a renewal (or a new
    holder) and restarts the count; only the local monotonic clock is used."""

    def __init__(self) -> None:
        self._seen: tuple[object, ...] | None = None
        self._since = 0.0

    def unchanged_for(self, lease: Mapping[str, Any], mono_now: float) -> float:
        spec = lease.get("spec") or {}
        seen = ((lease.get("metadata") or {}).get("resourceVersion"),
                spec.get("holderIdentity"), spec.get("renewTime"))
        if seen != self._seen:
            self._seen, self._since = seen, mono_now
        return mono_now - self._since


def renewal_fresh(renewed_at: float | None, mono_now: float, seconds: int) -> bool:
    """Whether the last successful renewal (monotonic) still vouches for the
    lease: younger than its duration minus a third, the margin for clock rate
    and the taker's own lag."""
    return renewed_at is not None and mono_now - renewed_at < seconds - seconds / 3


def recently_renewed(renewed_at: float | None, mono_now: float, seconds: int) -> bool:
    """Whether a check before a commit may skip its renewal: the last one is
    younger than a third of the duration (no one may take the lease sooner
    than a whole duration after it)."""
    return renewed_at is not None and mono_now - renewed_at < seconds / 3


def lease_spec(holder: str, seconds: int, now: datetime,
               acquired: str | None = None) -> dict[str, Any]:
    """The spec this pod writes when it takes (acquired None) or renews the lease."""
    stamp = now.strftime(MICROTIME)
    return {"holderIdentity": holder, "leaseDurationSeconds": seconds,
            "acquireTime": acquired or stamp, "renewTime": stamp}
