"""What becomes of a policy's node data once its policy may be gone: pure.

Each scan the driver asks the apiserver for the policy a directory's
`owner.json` names (namespace, name) and turns the answer into a `Sighting`:

- PRESENT: the policy is there with the marker's UID;
- DELETED: no such policy (404), or one of that name with another UID
  (deleted and created again: its data is in another directory);
- UNKNOWN: anything else (an error, a timeout, a 403). Nothing is decided
  on it: the "seen deleted since" time is neither started nor cleared.

A directory is deleted only when its owner has been seen DELETED at an
earlier scan (the time is recorded on disk, `deleted_since`, so a driver
restart keeps it), is seen DELETED again now, at least `grace_s` later,
no volume of it is published, and the reclaim policy is Delete. So one odd
answer (a 404 from a misconfigured apiserver) only starts the clock, and a
PRESENT answer stops it (the time is dropped). Retain keeps the directory
for good and reports it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DELETE = "Delete"
RETAIN = "Retain"
RECLAIM_POLICIES = (DELETE, RETAIN)


class Sighting(enum.Enum):
    PRESENT = "present"
    DELETED = "deleted"
    UNKNOWN = "unknown"


class Verdict(enum.Enum):
    """What the directory is, after this scan (each is reported)."""

    LIVE = "live"  # its policy is there (or the answer was unknown and no clock runs)
    PENDING = "pending_deletion"  # owner deleted; waiting for the grace or an unpublish
    RETAINED = "retained"  # owner deleted, reclaim Retain: kept for good
    DELETE = "delete"  # to be deleted now


@dataclass(frozen=True)
class Reclaim:
    policy: str  # DELETE or RETAIN
    grace_s: float


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    # What "seen deleted since" must be on disk after this scan (None: no file).
    deleted_since: float | None


def sighting(marker_uid: str, found_uid: str | None) -> Sighting:
    """The apiserver's answer for the marker's (namespace, name): `found_uid`
    is the policy's UID, None for a 404. (An answer that is neither is
    UNKNOWN; the edge says so without calling this.)"""
    if found_uid is None or found_uid != marker_uid:
        return Sighting.DELETED
    return Sighting.PRESENT


def decide(seen: Sighting, deleted_since: float | None, published: bool, now: float,
           reclaim: Reclaim) -> Decision:
    """The fate of one policy directory at time `now` (Unix seconds)."""
    if seen is Sighting.PRESENT:
        return Decision(Verdict.LIVE, None)  # a clock that ran stops
    if seen is Sighting.UNKNOWN:
        # No evidence either way: keep the clock as it is, decide nothing.
        if deleted_since is None:
            return Decision(Verdict.LIVE, None)
        waiting = Verdict.RETAINED if reclaim.policy == RETAIN else Verdict.PENDING
        return Decision(waiting, deleted_since)
    if deleted_since is None:
        # First sighting: only the clock starts, whatever the grace.
        return Decision(Verdict.RETAINED if reclaim.policy == RETAIN else Verdict.PENDING, now)
    if reclaim.policy == RETAIN:
        return Decision(Verdict.RETAINED, deleted_since)
    if published or now - deleted_since < reclaim.grace_s:
        return Decision(Verdict.PENDING, deleted_since)
    return Decision(Verdict.DELETE, deleted_since)
