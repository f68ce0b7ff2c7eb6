"""The agent's Kubernetes edge: what it says on its own pod.

`PodReport` keeps this writer's progress on each recent step (the operator
folds it into the step's Checkpoint record) and the drain's pending bytes
(the operator counts the pod as a drainer in the share channel), and writes
both in one patch when a drain starts or ends or a state someone waits for
is reached (docs/pod-contract.md). Best effort and asynchronous: the API
server being slow or down never slows a capture or a drain; a failed patch is
tried again with a backoff, and the newest state is what is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.contract import progress
from ckptdrain.contract.api import ANNOTATION_PENDING, ANNOTATION_SHARE_SCALE

log = logging.getLogger(__name__)

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


def pending_changed(old: int | None, new: int) -> bool:
    """Worth a patch? Only a drain starting or ending (to or from zero): the
    split is equal among drainers (contract/share.py), so how much is pending
    does not move anyone's share, and two writes per drain keep the cost per
    checkpoint independent of how long it drains."""
    return old is None or (old == 0) != (new == 0)


#: A progress change worth a write of its own (Global, Failed, Retrying;
#: Local when no drain starts) waits this long for company: the drain's
#: start or end that usually follows within a second rides in the same patch.
SETTLE_S = 2.0
#: Longest wait before trying a failed patch again.
MAX_BACKOFF_S = 30.0
_URGENT = frozenset({State.LOCAL, State.GLOBAL, State.FAILED, State.RETRYING})


class PodReport:
    """The agent's one writer to its own pod: the drain's pending bytes
    (`ckptdrain.io/pending-bytes`), its progress on each recent step
    (`ckptdrain.io/progress`, contract/progress.py) and what rides along
    (the goodput annotation), in one patch.

    A patch goes out when a drain starts (at once: the share channel admits a
    drainer only after it), when it ends, and when a step's progress moved in
    a way someone waits for (Local, Global, Failed, Retrying), each of the
    last two held SETTLE_S so that they travel together. A checkpoint that
    captures and drains costs its writer two writes; the states in between
    (Capturing, Draining) ride along with the next one. Also a `Reporter`
    (agent/report.py): `report` only records, `tick` writes, from one thread.
    """

    def __init__(self, namespace: str, pod: str, writer: int, writers: int, api: Any = None, *,
                 is_global: Callable[[int], bool] = lambda step: False,
                 peer_holder: Callable[[int], tuple[int, str | None] | None]
                 = lambda step: None,
                 clock: Callable[[], float] = time.monotonic,
                 settle_s: float = SETTLE_S) -> None:
        if api is None:
            api = kubeclient.core_api()
        self.api, self.namespace, self.pod, self.writer = api, namespace, pod, int(writer)
        #: Writers that make a checkpoint complete (the record waits for them).
        self.writers = int(writers)
        self.is_global, self.peer_holder = is_global, peer_holder
        self.clock, self.settle_s = clock, settle_s
        #: Pending bytes as last written (None: never).
        self.published: int | None = None
        #: When the report that started the current drain was sent (monotonic,
        #: taken before the call): the share channel believes only admissions
        #: that arrive after it. None while nothing is reported as pending.
        self.reported_at: float | None = None
        #: More annotations to send along (the goodput view): no write of their own.
        self.along: Callable[[], dict[str, str]] = dict
        self.writes = 0
        self._lock = threading.Lock()
        self._steps: dict[int, progress.Claim] = {}
        self._version = self._sent_version = 0
        #: When a progress change or a drain's end is due to be written.
        self._due: float | None = None
        self._end_due: float | None = None
        self._retry_at = 0.0
        self._backoff = 1.0
        self._pending: Callable[[], int] = lambda: 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the Reporter side: called from the agent's threads, never blocks --

    def report(self, event: CheckpointEvent) -> None:
        holder = self.peer_holder(event.step)
        claim = progress.claim_of(
            event.state.value, event.bytes,
            tiers_for(event, self.is_global(event.step), holder is not None),
            datetime.fromtimestamp(event.at, UTC), event.message or None,
            peer_holder=None if holder is None else holder[0],
            peer_node=None if holder is None else holder[1], requests=event.requests)
        with self._lock:
            self._steps = progress.with_claim(self._steps, event.step, claim)
            self._version += 1
            if event.state in _URGENT and self._due is None:
                self._due = self.clock() + self.settle_s

    # -- the writing side: one thread ---------------------------------------

    def start(self, pending: Callable[[], int] | None = None,
              period: float = PUBLISH_PERIOD) -> None:
        """Look every `period` seconds from a thread (an API call that hangs
        must not hold up the agent's loop); `pending`: the drain's lag."""
        if pending is not None:
            self._pending = pending

        def loop() -> None:
            while not self._stop.wait(period):
                try:
                    self.tick(self._pending())
                except Exception:  # one bad read must not end the reports for good
                    log.exception("pod report: could not read or send it")

        self._thread = threading.Thread(target=loop, name="pod-report", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop, and send what is not sent yet (an emergency checkpoint's
        states), if the API answers within `timeout`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            pending = int(self._pending())
        except Exception:
            pending = self.published or 0
        with self._lock:
            unsent = self._version != self._sent_version
        if unsent or pending_changed(self.published, pending):
            self._send(pending, timeout)

    def tick(self, pending: int) -> bool:
        """One look: write if something is due. True when a patch was sent."""
        now = self.clock()
        pending = int(pending)
        starts = self.published is None or (self.published == 0 and pending > 0)
        ends = self.published is not None and self.published > 0 and pending == 0
        if ends and self._end_due is None:
            self._end_due = now + self.settle_s
        elif not ends:
            self._end_due = None
        with self._lock:
            due = self._due is not None and now >= self._due
        if not (starts or due or (self._end_due is not None and now >= self._end_due)):
            return False
        if now < self._retry_at:
            return False
        return self._send(pending)

    def publish(self, pending: int) -> bool:
        """Write now if the drain started or ended, or progress is unsent."""
        with self._lock:
            unsent = self._version != self._sent_version
        if not (pending_changed(self.published, int(pending)) or unsent):
            return False
        return self._send(int(pending))

    def _send(self, pending: int, timeout: float | None = None) -> bool:
        with self._lock:
            version = self._version
            text = progress.encode(self.writer, self.writers, self._steps) if self._steps else None
        # This agent applies its namespace's cluster scale: said by the agent
        # itself, so an older agent image never passes for one that does.
        annotations = {**self.along(), ANNOTATION_PENDING: str(pending),
                       ANNOTATION_SHARE_SCALE: "true"}
        if text is not None:
            annotations[progress.ANNOTATION_PROGRESS] = text
        sent_at = self.clock()
        try:
            kwargs = {} if timeout is None else {"_request_timeout": timeout}
            self.api.patch_namespaced_pod(self.pod, self.namespace,
                                          {"metadata": {"annotations": annotations}}, **kwargs)
        except Exception as err:
            self._retry_at = sent_at + self._backoff
            self._backoff = min(MAX_BACKOFF_S, self._backoff * 2)
            log.warning("could not report to pod %s/%s (again in %.0f s): %s",
                        self.namespace, self.pod, self._retry_at - sent_at, err)
            return False
        self.writes += 1
        self._backoff, self._retry_at = 1.0, 0.0
        if pending > 0 and not self.published:
            self.reported_at = sent_at
        elif pending == 0:
            self.reported_at = None
        self.published = pending
        self._end_due = None
        with self._lock:
            self._sent_version = version
            if self._version == version:
                self._due = None
        return True
