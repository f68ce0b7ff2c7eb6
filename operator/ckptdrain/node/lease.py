"""The writer fence: a coordination.k8s.io Lease per policy and writer rank,
held by the agent's pod (its uid), so two live pods that were both given one
rank (admission off, or admitted at the same instant) never both commit as
that writer.

    ckptdrain-<policy>-w<rank>   holderIdentity = pod uid, renewed every
                                 LEASE_SECONDS / 3, checked before each commit

A pod may take the lease when nobody holds it, it holds it already, or the
holder stopped renewing for LEASE_SECONDS (it died, or is cut off). An
agent that stops cleanly frees it after its last commit (a pod still
flushing within its grace period keeps it until then); after a crash, the
replacement waits at most LEASE_SECONDS before its first global commit.
Writes carry the resourceVersion read, so two takers racing for an expired
lease cannot both win.

What is not evidence of another holder does not stop a commit: without
rights on leases (403) fencing is off, said once in the log; a failed renewal
(the apiserver unreachable) keeps the last known answer. Training and its
checkpoints never wait on the apiserver.

Pure: names, the decision and the spec; `node/kube.WriterLease` makes the calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
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


def _parse(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    for fmt in (MICROTIME, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def may_take(spec: Mapping[str, Any], me: str, now: datetime) -> bool:
    """Free, already ours, or not renewed for its duration."""
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return True
    return renewed + timedelta(seconds=duration) < now


def lease_spec(holder: str, seconds: int, now: datetime,
               acquired: str | None = None) -> dict[str, Any]:
    """The spec this pod writes when it takes (acquired None) or renews the lease."""
    stamp = now.strftime(MICROTIME)
    return {"holderIdentity": holder, "leaseDurationSeconds": seconds,
            "acquireTime": acquired or stamp, "renewTime": stamp}
