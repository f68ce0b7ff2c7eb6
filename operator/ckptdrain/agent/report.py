"""Per-checkpoint state reports: a hook the operator plugs Kubernetes records into.

The agent calls `Reporter.report` at each transition of a checkpoint (the
states are the Checkpoint record's, contract/record.State):

    Capturing -> Local -> Draining -> Global
                     \\-> Failed (with the reason; the agent retries)

The default logs one structured line per transition. `JsonLinesReporter`
appends the same events to a file (the demo reads it); `FanOut` sends to
several. A reporter must not raise: reporting is never allowed to stop the
agent, so FanOut logs and swallows a failing reporter's exception.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from ckptdrain.contract.record import State

log = logging.getLogger("ckptdrain.agent.report")


@dataclass(frozen=True)
class CheckpointEvent:
    step: int
    state: State
    bytes: int = 0
    #: Seconds the finished phase took (capture for Local, drain for Global).
    seconds: float | None = None
    message: str = ""
    #: "schedule" or "sigterm": what triggered the checkpoint.
    trigger: str = "schedule"
    #: With Global: the requests the checkpoint cost (request_counts.as_record()).
    requests: dict[str, int] | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, object]:
        doc = asdict(self)
        doc["state"] = self.state.value
        return doc


class Reporter(Protocol):
    def report(self, event: CheckpointEvent) -> None: ...


class LoggingReporter:
    def report(self, event: CheckpointEvent) -> None:
        level = logging.WARNING if event.state is State.FAILED else logging.INFO
        log.log(level, "checkpoint %s", json.dumps(event.to_dict(), sort_keys=True))


class JsonLinesReporter:
    """Appends one JSON object per event to `path` (one line each, flushed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def report(self, event: CheckpointEvent) -> None:
        line = json.dumps(event.to_dict(), sort_keys=True) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)


class FanOut:
    def __init__(self, reporters: Iterable[Reporter]) -> None:
        self.reporters = list(reporters)

    def report(self, event: CheckpointEvent) -> None:
        for reporter in self.reporters:
            try:
                reporter.report(event)
            except Exception:
                log.exception("reporter %r failed on %s", reporter, event)
