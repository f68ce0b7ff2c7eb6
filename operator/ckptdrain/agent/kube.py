"""The agent's Kubernetes edge: Checkpoint records and its pod's pending-bytes annotation.

Both are best effort and asynchronous: the API server being slow or down
must never slow a capture or a drain. Events go through a bounded queue to
one thread; when it is full, the oldest report is dropped (a newer state for
the same step supersedes it anyway) and the drop is logged.

- `RecordReporter` is a `report.Reporter`: each state change becomes this
  writer's claim on the step's `Checkpoint` record (the format is
  contract/record.py; the client, `RecordWriter`, is node/kube.py).
- `PendingBytesPublisher` patches `ckptdrain.io/pending-bytes` on the agent's
  own pod when the drain lag changes, so the operator can split bandwidth in
  proportion to what each node still has to send (docs/pod-contract.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.contract.api import ANNOTATION_PENDING

log = logging.getLogger(__name__)

QUEUE_SIZE = 256
#: How often the drain's pending bytes are looked at; a write follows only
#: when a drain starts or ends (see pending_changed).
PUBLISH_PERIOD = 1.0


def tiers_for(event: CheckpointEvent, is_global: bool, is_peer: bool = False) -> list[str]:
    """Which tiers hold this writer's shard once `event` happened."""
    if event.state is State.CAPTURING:
        return []
    held = ["peer"] if is_peer else []
    if event.state is State.GLOBAL or is_global:
        return ["global", "local", *held]
    return ["local", *held]


class RecordReporter:
    """Sends each event to `writer.report(...)` (a node.kube.RecordWriter) from a thread."""

    def __init__(self, writer: Any, node: str | None, *,
                 is_global: Callable[[int], bool] = lambda step: False,
                 peer_holder: Callable[[int], tuple[int, str | None] | None]
                 = lambda step: None) -> None:
        self.writer = writer
        self.node = node or None
        self.is_global = is_global
        #: (rank, node) of the holder of the step's peer copy (None: no peer copy).
        self.peer_holder = peer_holder
        self._queue: queue.Queue[CheckpointEvent | None] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._run, name="records", daemon=True)
        self._thread.start()

    def report(self, event: CheckpointEvent) -> None:
        while True:
            try:
                self._queue.put_nowait(event)
                return
            except queue.Full:
                try:
                    dropped = self._queue.get_nowait()
                    log.warning("record queue full: dropped %s", dropped)
                except queue.Empty:
                    pass

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued (within `timeout`) and stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                holder = self.peer_holder(event.step)
                self.writer.report(
                    event.step, event.state.value, event.bytes,
                    tiers_for(event, self.is_global(event.step), holder is not None),
                    datetime.fromtimestamp(event.at, UTC), self.node, event.message or None,
                    requests=event.requests,
                    peer_holder=None if holder is None else holder[0],
                    peer_node=None if holder is None else holder[1])
            except Exception as err:  # the API server's trouble is never the agent's
                log.warning("could not record step %d %s: %s", event.step, event.state.value,
                            err)


def pending_changed(old: int | None, new: int) -> bool:
    """Worth a patch? Only a drain starting or ending (to or from zero): the
    split is equal among drainers (contract/share.py), so how much is pending
    does not move anyone's share, and two writes per drain keep the cost per
    checkpoint independent of how long it drains."""
    return old is None or (old == 0) != (new == 0)


class PendingBytesPublisher:
    """Patches the pod's pending-bytes annotation when the lag moves."""

    def __init__(self, namespace: str, pod: str, api: Any = None) -> None:
        if api is None:
            api = kubeclient.core_api()
        self.api, self.namespace, self.pod = api, namespace, pod
        self.published: int | None = None
        #: When the report that started the current drain was sent (monotonic,
        #: taken before the call): the share channel believes only admissions
        #: that arrive after it. None while nothing is reported as pending.
        self.reported_at: float | None = None
        #: More annotations to send along (the goodput view): no write of their own.
        self.along: Callable[[], dict[str, str]] = dict
        self._stop = threading.Event()

    def start(self, pending: Callable[[], int], period: float = PUBLISH_PERIOD) -> None:
        """Publish `pending()` every `period` seconds from a thread (an API call that
        hangs must not hold up the agent's loop)."""

        def loop() -> None:
            while not self._stop.wait(period):
                try:
                    self.publish(pending())
                except Exception:  # one bad read must not end the reports for good
                    log.exception("pending bytes: could not read or report them")

        threading.Thread(target=loop, name="pending-bytes", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def publish(self, pending: int) -> bool:
        """Patch if it changed enough; True when a patch was sent. Errors are logged."""
        if not pending_changed(self.published, pending):
            return False
        body = {"metadata": {"annotations": {**self.along(),
                                             ANNOTATION_PENDING: str(int(pending))}}}
        sent_at = time.monotonic()
        try:
            self.api.patch_namespaced_pod(self.pod, self.namespace, body)
        except Exception as err:
            log.warning("could not annotate pod %s/%s with pending bytes: %s",
                        self.namespace, self.pod, err)
            return False
        self.published = pending
        self.reported_at = sent_at if pending > 0 else None
        return True

