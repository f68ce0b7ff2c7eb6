"""The writer fence: a coordination.k8s.io Lease per policy and writer rank,
held by the agent's pod (its uid), so two live pods that were both given one
rank (admission off, or admitted at the same instant) never both commit as
that writer.

    ckptdrain-<policy>-w<rank>   holderIdentity = pod uid; owned by that pod
                                 (deleted with it); annotation
                                 ckptdrain.io/holder-node = "<node> <uid>"

Writes: a commit needs no write when a renewal succeeded in the last
TRUST_S (30 s), or when two reads confirm the lease (`confirmed`): it is
exactly as this pod last wrote it (same resourceVersion and holder), its
last renewal leaves at least TRUST_S of its duration, and this node's
kubelet heartbeat was renewed in the last NODE_FRESH_S (20 s), so no taker
can satisfy either takeover rule for at least TRUST_S more. Otherwise the
commit renews (one write). Between commits the agent renews once the last
renewal is two thirds of the duration old. The duration follows the
checkpoint cadence (`lease_seconds`: three global commit periods, within
[LEASE_SECONDS, MAX_LEASE_SECONDS]), so a writer makes about one lease
write per two global checkpoints.

A pod may take the lease when nobody holds it, it holds it already, the
holder stopped renewing for the whole duration, or the holder is gone with
its node: the lease unchanged for NODE_DEAD_S and the node's kubelet
heartbeat (kube-node-lease/<node>) deleted or unchanged for as long. Both
takeovers need the lease unchanged for at least NODE_DEAD_S on the taker's
clock, and a holder commits only on a renewal younger than TRUST_S (half of
that) or on reads that show nobody can take it for TRUST_S more: a holder
cut off from the apiserver stops committing before anyone may take its
place, and a commit never rides on an old renewal. A pod
deleted with its lease frees it at once (the garbage collector deletes the
lease with its owner), and an agent that stops cleanly frees it after its
last commit (a pod still flushing within its grace period keeps it until
then); a pod whose agent restarts in place is the same holder (its uid).

The one comparison of a timestamp with the local wall clock is of this
pod's own node heartbeat (`confirmed`): the kubelet that wrote it runs on
this node, on this node's clock.

"Unchanged" is judged as client-go's leader election does: by how long THIS
process has seen the object unchanged (resourceVersion, holder, renewTime)
on its own monotonic clock, never by comparing the holder's renewTime with
the local wall clock (a node whose clock runs ahead would take a live
lease); after this process could not reach the apiserver it starts counting
again. Writes carry the resourceVersion read, so two takers racing for an
expired lease cannot both win.

What is not evidence of another holder does not stop a commit: without
rights on leases (403) fencing is off, said once in the log; without rights
on node leases the node test is off and only the duration (or the pod's
deletion) frees a lease. A renewal that fails at a commit stops the commit
(the drain retries; checkpoints stay local) until one succeeds. Training and
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
    renewed about once per two commits, within [LEASE_SECONDS,
    MAX_LEASE_SECONDS]."""
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


#: A successful renewal vouches for the lease this long: half of NODE_DEAD_S,
#: the least time a taker must see the lease unchanged before it may act.
TRUST_S = NODE_DEAD_S / 2


def recently_renewed(renewed_at: float | None, mono_now: float) -> bool:
    """Whether a commit may go on the last renewal alone (no write): it is
    younger than TRUST_S. Nobody may take a lease they have not seen
    unchanged for NODE_DEAD_S (or its whole duration), so a renewal that
    recent still vouches, with half of that as the margin for clock rates and
    the taker's own lag."""
    return renewed_at is not None and mono_now - renewed_at < TRUST_S


#: A node lease renewed this recently (by the node's own clock, which is the
#: kubelet's and this agent's) keeps every taker's node test false for at
#: least NODE_DEAD_S - NODE_FRESH_S = 40 s: more than TRUST_S.
NODE_FRESH_S = NODE_DEAD_S - TRUST_S - 10.0


def confirmed(lease: Mapping[str, Any], mine: Mapping[str, Any], me: str,
              renewed_age_s: float, duration_s: float,
              node_lease: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether a commit may go on reads alone: `lease` (read now) is `mine`
    (as this pod last wrote it), that write (`renewed_age_s` ago, on this
    process's clock) leaves at least TRUST_S of `duration_s`, and this node's
    heartbeat (`node_lease`, read now) was renewed in the last NODE_FRESH_S.
    Anything missing or unreadable is no."""
    version = (lease.get("metadata") or {}).get("resourceVersion")
    if not version or version != (mine.get("metadata") or {}).get("resourceVersion"):
        return False
    if (lease.get("spec") or {}).get("holderIdentity") != me:
        return False
    if renewed_age_s > duration_s - TRUST_S:
        return False
    renew = ((node_lease or {}).get("spec") or {}).get("renewTime")
    if not isinstance(renew, str):
        return False
    try:
        at = datetime.strptime(renew, MICROTIME).replace(tzinfo=now.tzinfo)
    except ValueError:
        try:
            at = datetime.strptime(renew, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
        except ValueError:
            return False
    age = (now - at).total_seconds()
    # A heartbeat from the future (a clock stepped back) proves nothing.
    return -1.0 <= age <= NODE_FRESH_S


def holder_node_value(node: str, holder: str) -> str:
    """The holder-node annotation: the node, and the holder it is written for."""
    return f"{node} {holder}"


def holder_node(value: object, holder: object) -> str | None:
    """The holder's node from the annotation, only if it was written for this
    holder (an earlier holder's node, carried over, is no evidence)."""
    if not isinstance(value, str):
        return None
    node, _, written_for = value.partition(" ")
    return node if node and written_for == holder else None


def lease_spec(holder: str, seconds: int, now: datetime,
               acquired: str | None = None) -> dict[str, Any]:
    """The spec this pod writes when it takes (acquired None) or renews the lease."""
    stamp = now.strftime(MICROTIME)
    return {"holderIdentity": holder, "leaseDurationSeconds": seconds,
            "acquireTime": acquired or stamp, "renewTime": stamp}
