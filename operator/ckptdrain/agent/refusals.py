"""A Warning Event on the agent's own pod when the local tier refuses a capture
(node/space.WontFit: it cannot hold the step even after removing what it
may), so `kubectl describe pod` and `kubectl get events` say why the newest
checkpoint is not protected. The Checkpoint record's claim says it too; the
Event is what an on-call engineer sees first.

One Event per distinct refusal (the agent's loop already reports a full tier
once, not at every retry), posted from a thread: the API server being slow
must never hold up the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger(__name__)
REASON = "CaptureRefused"


def event_body(namespace: str, pod: str, uid: str | None, step: int | None, message: str,
               now: datetime) -> dict[str, Any]:
    """The core/v1 Event, as a plain dict."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{pod}.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod,
                               "namespace": namespace, "uid": uid},
            "reason": REASON, "type": "Warning", "count": 1,
            "message": (f"step {step}: " if step is not None else "") + message[:900]
            + " (the local tier keeps what it has; the next step is tried after back-off)",
            "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": "ckptdrain-agent"}}


class RefusalEvents:
    def __init__(self, namespace: str, pod: str, uid: str | None,
                 create: Callable[[str, dict[str, Any]], Any]) -> None:
        self.namespace, self.pod, self.uid, self.create = namespace, pod, uid, create

    def refused(self, step: int | None, message: str) -> None:
        body = event_body(self.namespace, self.pod, self.uid, step, message, datetime.now(UTC))

        def post() -> None:
            try:
                self.create(self.namespace, body)
            except Exception as err:  # the API server's trouble is never the agent's
                log.warning("could not post the %s event: %s", REASON, err)

        threading.Thread(target=post, name="refusal-event", daemon=True).start()
