"""What becomes of a policy's node data once its policy may be gone: pure.

Each scan the driver asks the apiserver for the policy a directory's
`owner.json` names (namespace, name) and turns the answer into a `Sighting`:

- PRESENT: the policy is there with the marker's UID;
- DELETED: no such policy (a NotFound naming it), or one of that name with
  another UID (deleted and created again: its data is in another
  directory);
- UNKNOWN: anything else (an error, a timeout, a 403, a 404 that is not a
  NotFound for the policy). Nothing is decided on it: the clock is neither
  started, advanced nor cleared.

The clock (`DeletedClock`, kept on disk in `deleted-since.json`, so a
driver restart keeps it) holds the first and the latest DELETED sighting of
an unbroken run. A directory is deleted only when its owner was seen
DELETED at the start of the grace and is seen DELETED now, at least
`grace_s` later, with no gap between two DELETED sightings of the run
longer than the silence window (the grace, but at least SILENCE_SCANS scan
intervals, so a grace shorter than the interval still runs out; UNKNOWN
answers in between count for nothing: a longer silence starts the run
again at now), no volume of it is published,
and the reclaim policy is Delete. So one odd answer only starts the clock,
and a PRESENT answer stops it (the clock is dropped). Retain keeps the
directory for good and reports it.

The reclaim is the directory's own (`effective`): what its policy's
CheckpointClass said (spec.nodeTier.reclaim) when the driver last read it
while the policy was there (`Recorded`, kept on disk in `reclaim.json`),
each field it leaves unset taken from the driver's own setting; nothing
recorded (no class, data from before classes carried it): the driver's
setting. A record that is there but cannot be read or parsed
(`Unreadable`), or one naming a class whose reclaim was never read
(`Recorded.known` false), holds the directory (as Retain) for that scan:
never the driver's setting, which could delete at once what a Retain
class kept for days.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DELETE = "Delete"
RETAIN = "Retain"
RECLAIM_POLICIES = (DELETE, RETAIN)
#: The silence window is at least this many scan intervals.
SILENCE_SCANS = 3


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
class Recorded:
    """What a policy's class said of reclaim when last read: None for a
    field it leaves to the driver."""

    class_name: str
    policy: str | None = None
    grace_s: float | None = None
    # False: the policy names this class but its reclaim was never read
    # (the LIST failed, the class was not there or did not parse).
    known: bool = True


@dataclass(frozen=True)
class Unreadable:
    """A record that is there but cannot be read or parsed (why)."""

    reason: str


def effective(recorded: Recorded | Unreadable | None, driver: Reclaim) -> tuple[Reclaim, str]:
    """The reclaim that applies to a directory, and where it came from (for
    the logs): the recorded class's fields over the driver's setting; held
    (Retain) when the record cannot be read or its class was never read."""
    if isinstance(recorded, Unreadable):
        return (Reclaim(RETAIN, driver.grace_s),
                f"an unreadable record ({recorded.reason}): held")
    if recorded is not None and not recorded.known:
        return (Reclaim(RETAIN, driver.grace_s),
                f"class {recorded.class_name}, its reclaim never read: held")
    if recorded is None or (recorded.policy is None and recorded.grace_s is None):
        return driver, "the driver's setting"
    return (Reclaim(recorded.policy or driver.policy,
                    driver.grace_s if recorded.grace_s is None else recorded.grace_s),
            f"class {recorded.class_name}")


@dataclass(frozen=True)
class DeletedClock:
    """An unbroken run of DELETED sightings (Unix seconds)."""

    since: float  # the first of the run: the grace counts from here
    last: float  # the latest: a gap longer than the grace breaks the run


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    # What the clock must be on disk after this scan (None: no file).
    clock: DeletedClock | None


def sighting(marker_uid: str, found_uid: str | None) -> Sighting:
    """The apiserver's answer for the marker's (namespace, name): `found_uid`
    is the policy's UID, None for a NotFound naming it. (An answer that is
    neither is UNKNOWN; the edge says so without calling this.)"""
    if found_uid is None or found_uid != marker_uid:
        return Sighting.DELETED
    return Sighting.PRESENT


def decide(seen: Sighting, clock: DeletedClock | None, published: bool, now: float,
           reclaim: Reclaim, interval_s: float) -> Decision:
    """The fate of one policy directory at time `now` (Unix seconds), the
    driver scanning every `interval_s`."""
    waiting = Verdict.RETAINED if reclaim.policy == RETAIN else Verdict.PENDING
    if seen is Sighting.PRESENT:
        return Decision(Verdict.LIVE, None)  # a clock that ran stops
    if seen is Sighting.UNKNOWN:
        # No evidence either way: keep the clock as it is, decide nothing.
        return Decision(Verdict.LIVE if clock is None else waiting, clock)
    silence_s = max(reclaim.grace_s, SILENCE_SCANS * interval_s)
    if clock is None or not 0 <= now - clock.last <= silence_s:
        # A first sighting, one after a silence longer than the window (the
        # owner's fate in between is not known), or a clock that went back:
        # only the clock starts, whatever the grace.
        return Decision(waiting, DeletedClock(now, now))
    clock = DeletedClock(clock.since, now)
    if reclaim.policy == RETAIN or published or now - clock.since < reclaim.grace_s:
        return Decision(waiting, clock)
    return Decision(Verdict.DELETE, clock)
