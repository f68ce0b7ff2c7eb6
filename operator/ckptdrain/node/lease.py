"""The writer fence: a coordination.k8s.io Lease per policy and writer rank,
held by the agent's pod (its uid), so two live pods that were both given one
rank (admission off, or admitted at the same instant) never both commit as
that writer.

    ckptdrain-<policy>-w<rank>   holderIdentity = pod uid, renewed every
                                 LEASE_SECONDS / 3, checked before each commit

A pod may take the lease when nobody holds it, it holds it already, or the
holder stopped renewing for LEASE_SECONDS (it died, or is cut off). "Stopped
renewing" is judged as client-go's leader election does: by how long THIS
process has seen the lease unchanged (resourceVersion, holder, renewTime) on
its own monotonic clock, never by comparing the holder's renewTime with the
local wall clock (a node whose clock runs ahead would take a live lease). An
agent that stops cleanly frees it after its last commit (a pod still
flushing within its grace period keeps it until then); after a crash, the
replacement waits at most LEASE_SECONDS before its first global commit.
Writes carry the resourceVersion read, so two takers racing for an expired
lease cannot both win.

What is not evidence of another holder does not stop a commit: without
rights on leases (403) fencing is off, said once in the log; a failed renewal
(the apiserver unreachable) keeps the last known answer, but only while the
last successful renewal is younger than LEASE_SECONDS minus a third of it:
past that another pod may have taken the lease, so commits stop (the drain
retries; checkpoints stay local) until a renewal succeeds again. Training and
its checkpoints never wait on the apiserver.

Pure: names, the decision and the spec; `node/kube.WriterLease` makes the calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ckptdrain.errors import CkptdrainError

LEASE_API, LEASE_PLURAL = ("coordination.k8s.io", "v1"), "leases"
LEASE_SECONDS = 60
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class WriterFenced(CkptdrainError):
    """Another live pod holds this writer's lease: this one must not commit."""


def lease_name(policy: str, writer: int) -> str:
    """Deterministic per namespace, policy and writer (a DNS subdomain)."""
    base = re.sub(r"[^a-z0-9-]", "-", policy.lower())[:200].strip("-")
    return f"ckptdrain-{base}-w{writer}"


def may_take(spec: Mapping[str, Any], me: str, unchanged_for: float) -> bool:
    """Free, already ours, or seen unchanged by this process for its duration
    (`unchanged_for`: seconds on this process's monotonic clock, ExpiryWatch)."""
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
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


def lease_spec(holder: str, seconds: int, now: datetime,
               acquired: str | None = None) -> dict[str, Any]:
    """The spec this pod writes when it takes (acquired None) or renews the lease."""
    stamp = now.strftime(MICROTIME)
    return {"holderIdentity": holder, "leaseDurationSeconds": seconds,
            "acquireTime": acquired or stamp, "renewTime": stamp}
