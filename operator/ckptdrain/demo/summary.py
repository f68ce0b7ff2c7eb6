"""What the demo measured, computed from the agent's events. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ckptdrain import units


@dataclass(frozen=True)
class Event:
    step: int
    state: str
    bytes: int
    seconds: float | None
    trigger: str
    at: float

    @classmethod
    def from_dict(cls, doc: dict[str, object]) -> Event:
        return cls(int(doc["step"]), str(doc["state"]), int(doc.get("bytes") or 0),  # type: ignore[arg-type]
                   None if doc.get("seconds") is None else float(doc["seconds"]),  # type: ignore[arg-type]
                   str(doc.get("trigger", "")), float(doc["at"]))  # type: ignore[arg-type]


def newest(events: list[Event], state: str, before: float | None = None) -> Event | None:
    """The event for the highest step that reached `state` (by wall time `before`)."""
    found = [e for e in events if e.state == state and (before is None or e.at <= before)]
    return max(found, key=lambda e: e.step, default=None)


@dataclass(frozen=True)
class DrainStats:
    drains: int
    bytes: int
    seconds: float
    rate: float  # bytes/s while draining
    overlap: float  # drain seconds / wall seconds of the run

    @classmethod
    def of(cls, events: list[Event], wall_seconds: float) -> DrainStats:
        done = [e for e in events if e.state == "Global" and e.seconds]
        total_bytes = sum(e.bytes for e in done)
        total_seconds = sum(e.seconds or 0.0 for e in done)
        return cls(len(done), total_bytes, total_seconds,
                   total_bytes / total_seconds if total_seconds else 0.0,
                   total_seconds / wall_seconds if wall_seconds > 0 else 0.0)


def describe(event: Event) -> str:
    size = units.format_bytes(event.bytes) if event.bytes else ""
    took = f" in {units.format_duration(event.seconds)}" if event.seconds else ""
    rate = (f" ({units.format_rate(event.bytes / event.seconds)})"
            if event.seconds and event.bytes else "")
    where = {"Capturing": "capturing to the local tier", "Local": "durable on the local tier",
             "Draining": "draining to the global tier", "Global": "complete in the global tier",
             "Failed": "FAILED (will retry)"}.get(event.state, event.state)
    trigger = " [sigterm]" if event.trigger == "sigterm" else ""
    return f"step {event.step}: {where} {size}{took}{rate}{trigger}".replace("  ", " ")
