"""The trainer asks its agent which step to resume from after a restart
inside its pod. Standard library only (imported by client.py).

With several writers, ranks must resume from one step, and only the agents
can reach the apiserver where ranks agree (restore/agreement.py). So a
trainer that restarted in place and finds steps in its work dir newer than
the one restore placed writes a request, and its agent answers once the
ranks agreed and the step is in the work dir:

    <work>/.ckptdrain/resume-request   {"at": 1700000000.0, "pid": 7}
    <work>/.ckptdrain/resume           {"covers": 1700000000.5, "ok": true,
                                        "step": 120, "path": ".../step-120",
                                        "tier": "work", "round": 4,
                                        "why": "agreed", "reason": ""}

An answer covers every request made before its `covers` time (several
processes of one pod may ask at once: they get one answer). `ok` false means
the step could not be placed (`reason` says why); `step` null with `ok`
true is an agreed fresh start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckptdrain.jsonfile import read_object

REQUEST_FILE = "resume-request"
ANSWER_FILE = "resume"


@dataclass(frozen=True)
class Answer:
    covers: float
    ok: bool
    step: int | None
    path: str | None
    tier: str
    round: int | None
    why: str
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"covers": self.covers, "ok": self.ok, "step": self.step, "path": self.path,
                "tier": self.tier, "round": self.round, "why": self.why, "reason": self.reason}


def read_request(control: Path) -> float | None:
    """When the newest request was made; None when there is none."""
    doc = read_object(control / REQUEST_FILE)
    at = doc.get("at") if doc else None
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def read_answer(control: Path) -> Answer | None:
    doc = read_object(control / ANSWER_FILE)
    if not doc:
        return None
    try:
        step = doc.get("step")
        return Answer(covers=float(doc["covers"]), ok=bool(doc["ok"]),
                      step=step if isinstance(step, int) and not isinstance(step, bool)
                      else None,
                      path=str(doc["path"]) if doc.get("path") else None,
                      tier=str(doc.get("tier", "")),
                      round=doc.get("round") if isinstance(doc.get("round"), int) else None,
                      why=str(doc.get("why", "")), reason=str(doc.get("reason", "")))
    except (KeyError, TypeError, ValueError):
        return None
