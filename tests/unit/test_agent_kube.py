"""The agent's Kubernetes edge (agent/kube.py PodReport) against a fake core
API and a clock the test moves: what reaches the pod, in how many patches,
and when; never blocking and never raising into the agent."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ckptdrain.agent.kube import MAX_BACKOFF_S, SETTLE_S, PodReport, pending_changed
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.contract import progress

PENDING = "ckptdrain.io/pending-bytes"
PROGRESS = progress.ANNOTATION_PROGRESS
GOODPUT = "ckptdrain.io/goodput"
#: How often the agent's thread looks (agent/kube.PUBLISH_PERIOD).
PERIOD = 1.0


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeCore:
    """patch_namespaced_pod as the apiserver takes it: each successful call
    is kept (with its keyword arguments), `fail` makes every call raise, and
    `took` moves the clock by as much during a call."""

    def __init__(self, clock: Clock | None = None, fail: bool = False, took: float = 0.0
                 ) -> None:
        self.clock, self.fail, self.took = clock, fail, took
        self.patches: list[dict[str, Any]] = []
        self.targets: list[tuple[str, str]] = []
        self.kwargs: list[dict[str, Any]] = []
        #: Clock time of every call, failed or not.
        self.attempts: list[float] = []
        self.lock = threading.Lock()

    def patch_namespaced_pod(self, name: str, ns: str, body: dict[str, Any],
                             **kwargs: Any) -> None:
        with self.lock:
            self.attempts.append(self.clock.now if self.clock else time.monotonic())
            if self.clock is not None:
                self.clock.now += self.took
            if self.fail:
                raise ConnectionError("apiserver down")
            self.targets.append((ns, name))
            self.patches.append(body)
            self.kwargs.append(kwargs)


def annotations(patch: dict[str, Any]) -> dict[str, str]:
    return patch["metadata"]["annotations"]


def steps_in(patch: dict[str, Any]) -> dict[int, progress.Claim]:
    """The progress document a patch carries, read back the way the operator
    reads it (so whatever the agent writes must pass the operator's checks)."""
    doc = progress.parse(annotations(patch)[PROGRESS])
    assert doc.writer == 3
    return dict(doc.steps)


def states_in(patch: dict[str, Any]) -> dict[int, str]:
    return {step: claim.state for step, claim in steps_in(patch).items()}


def event(step: int, state: State, size: int = 0, **kw: Any) -> CheckpointEvent:
    return CheckpointEvent(step, state, size, at=1_767_225_600.0, **kw)


def make(clock: Clock, core: FakeCore | None = None, **kw: Any) -> tuple[PodReport, FakeCore]:
    core = core if core is not None else FakeCore(clock)
    report = PodReport("ns", "pod-3", 3, 4, api=core, clock=clock, **kw)
    return report, core


def settled(report: PodReport, core: FakeCore) -> None:
    """The agent's first look (nothing pending yet) is written: start from there."""
    assert report.tick(0)
    for kept in (core.patches, core.kwargs, core.attempts, core.targets):
        kept.clear()


def run(report: PodReport, clock: Clock, pending: int, seconds: float) -> int:
    """Tick once per PERIOD for `seconds`; how many patches went out."""
    sent = 0
    end = clock.now + seconds
    while clock.now < end:
        clock.now += PERIOD
        sent += report.tick(pending)
    return sent


def test_a_captured_and_drained_checkpoint_costs_its_writer_two_patches() -> None:
    clock = Clock()
    report, core = make(clock)
    report.along = lambda: {GOODPUT: "ratio=0.97"}
    settled(report, core)

    report.report(event(7, State.CAPTURING))
    assert run(report, clock, 0, 0.5) == 0  # a capture alone is worth no write
    clock.now += 0.5
    report.report(event(7, State.LOCAL, 1000))
    assert report.tick(1000)  # the drain starts: written at once, with Local
    start = core.patches[-1]
    assert annotations(start)[PENDING] == "1000" and states_in(start) == {7: "Local"}
    assert annotations(start)[GOODPUT] == "ratio=0.97"

    report.report(event(7, State.DRAINING, 1000))
    for left in range(900, 0, -100):  # draining on: however far it moves, no write
        assert run(report, clock, left, PERIOD) == 0
    report.report(event(7, State.GLOBAL, 1000, requests={"put": 3, "bytesUp": 1000}))
    assert run(report, clock, 0, 60) == 1  # Global and the drain's end, in one patch
    end = core.patches[-1]
    assert annotations(end)[PENDING] == "0" and states_in(end) == {7: "Global"}
    assert steps_in(end)[7].requests == {"put": 3, "bytesUp": 1000}
    assert annotations(end)[GOODPUT] == "ratio=0.97"
    assert len(core.patches) == 2 and report.writes == 3  # with the first look's


def test_the_drain_start_is_written_at_once_even_with_nothing_new_to_say() -> None:
    clock = Clock()
    report, core = make(clock)
    settled(report, core)
    before = clock.now
    assert report.tick(4096)  # not held SETTLE_S: the share channel waits for it
    assert core.attempts == [before] and core.targets == [("ns", "pod-3")]
    assert annotations(core.patches[0])[PENDING] == "4096"
    assert PROGRESS not in annotations(core.patches[0])  # nothing reported yet
    # The agent says itself that it applies the cluster scale (contract/share.py).
    assert annotations(core.patches[0])["ckptdrain.io/share-scale"] == "true"
    assert report.published == 4096


@pytest.mark.parametrize("drain_ends_first", [False, True])
def test_global_and_the_drain_end_travel_together(drain_ends_first: bool) -> None:
    clock = Clock()
    report, core = make(clock)
    settled(report, core)
    report.report(event(7, State.LOCAL, 10))
    assert report.tick(10)
    core.patches.clear()
    if drain_ends_first:
        assert not report.tick(0)  # the end waits SETTLE_S for its Global ...
        clock.now += SETTLE_S / 2
        report.report(event(7, State.GLOBAL, 10))
    else:
        report.report(event(7, State.GLOBAL, 10))  # ... and Global for the end
        clock.now += SETTLE_S / 4
        assert not report.tick(0)
    clock.now += SETTLE_S / 4
    assert not report.tick(0) and core.patches == []
    assert run(report, clock, 0, 10 * SETTLE_S) == 1
    assert annotations(core.patches[0])[PENDING] == "0"
    assert states_in(core.patches[0]) == {7: "Global"}


@pytest.mark.parametrize(("state", "message"), [
    (State.LOCAL, ""), (State.FAILED, "drain: access denied"),
    (State.RETRYING, "drain: endpoint did not answer; retrying in 4s")])
def test_a_state_someone_waits_for_is_written_alone_after_settle(state: State,
                                                                   message: str) -> None:
    clock = Clock()
    report, core = make(clock)
    settled(report, core)
    said = clock.now
    report.report(event(5, state, 10, message=message))
    clock.now = said + SETTLE_S - 0.1
    assert not report.tick(0)  # waiting for company that does not come
    clock.now = said + SETTLE_S
    assert report.tick(0)
    assert annotations(core.patches[0])[PENDING] == "0"
    claim = steps_in(core.patches[0])[5]
    assert claim.state == state.value and claim.message == (message or None)
    assert run(report, clock, 0, 60) == 0  # written once


def test_capturing_and_draining_alone_are_never_written_on_their_own() -> None:
    clock = Clock()
    report, core = make(clock)
    settled(report, core)
    report.report(event(5, State.CAPTURING))
    report.report(event(4, State.DRAINING, 10))
    assert run(report, clock, 0, 120) == 0
    report.report(event(5, State.LOCAL, 10))
    assert run(report, clock, 0, SETTLE_S) == 1  # they ride along with the next one
    assert states_in(core.patches[0]) == {5: "Local", 4: "Draining"}


def test_a_failing_api_never_raises_and_is_tried_again_with_a_growing_backoff() -> None:
    clock = Clock(0.0)
    core = FakeCore(clock)
    report, _ = make(clock, core)
    settled(report, core)
    core.fail = True
    report.report(event(7, State.LOCAL, 10))
    start = clock.now
    assert not report.tick(10)  # the drain starts; the patch fails
    for _ in range(200):  # 100 s of looks, twice a second
        clock.now += 0.5
        assert not report.tick(10)
    tried = [t - start for t in core.attempts]
    assert tried[:7] == [0, 1, 3, 7, 15, 31, 61]  # 1, 2, 4, 8, 16 s apart ...
    assert tried[7] - tried[6] == MAX_BACKOFF_S  # ... then no more than the cap
    assert report.published == 0 and report.reported_at is None
    report.report(event(7, State.GLOBAL, 10))  # the newest state is what is sent
    core.fail = False
    assert run(report, clock, 10, MAX_BACKOFF_S) == 1
    assert annotations(core.patches[0])[PENDING] == "10"
    assert states_in(core.patches[0]) == {7: "Global"}
    # A success resets the backoff: the next failure is tried again a second
    # later, not MAX_BACKOFF_S later.
    core.fail = True
    tries = len(core.attempts)
    assert run(report, clock, 0, SETTLE_S + PERIOD) == 0  # the drain's end fails once
    assert len(core.attempts) == tries + 1
    failed_at = core.attempts[-1]
    core.fail = False
    clock.now = failed_at + 0.5
    assert not report.tick(0)
    clock.now = failed_at + 1
    assert report.tick(0)
    assert annotations(core.patches[-1])[PENDING] == "0"


def test_close_flushes_states_not_written_yet_and_only_those() -> None:
    clock = Clock()
    report, core = make(clock)
    settled(report, core)
    report.report(event(9, State.CAPTURING, trigger="sigterm"))
    report.report(event(9, State.LOCAL, 10, trigger="sigterm"))  # no time to settle
    report.close(timeout=3)
    assert states_in(core.patches[0]) == {9: "Local"}
    assert core.kwargs[0] == {"_request_timeout": 3}  # never hangs the pod's exit
    report.close()
    assert len(core.patches) == 1  # nothing new: no write


def test_close_with_the_api_down_returns() -> None:
    clock = Clock()
    report, core = make(clock, FakeCore(clock, fail=True))
    report.report(event(9, State.LOCAL, 10))
    report.close(timeout=0.1)
    assert len(core.attempts) == 1 and core.patches == []


def test_close_stops_the_thread_and_sends_the_drains_pending_bytes() -> None:
    report, core = make(Clock())
    report.start(lambda: 77, period=3600)  # the thread never looks in this test
    report.report(event(9, State.LOCAL, 10))
    began = time.monotonic()
    report.close(timeout=5)
    assert time.monotonic() - began < 4  # the thread stopped: no join timed out
    assert annotations(core.patches[0])[PENDING] == "77"
    assert states_in(core.patches[0]) == {9: "Local"}


def test_the_thread_keeps_looking_after_a_bad_read() -> None:
    core = FakeCore()
    report = PodReport("ns", "pod-3", 3, 4, api=core)
    reads = iter([RuntimeError("lag unreadable"), 5])

    def pending() -> int:
        value = next(reads, 5)
        if isinstance(value, Exception):
            raise value
        return value

    report.start(pending, period=0.01)
    deadline = time.monotonic() + 5
    while not core.patches and time.monotonic() < deadline:
        time.sleep(0.01)
    report.close(timeout=5)
    assert core.patches and annotations(core.patches[0])[PENDING] == "5"


def test_peer_holder_tiers_and_requests_end_up_in_the_progress_document() -> None:
    clock = Clock()
    report, core = make(clock, is_global=lambda step: step == 7,
                        peer_holder=lambda step: (0, "node-b") if step >= 7 else None)
    report.report(event(7, State.LOCAL, 100))  # already global per the tier
    report.report(event(9, State.LOCAL, 100, message="copy held by the partner"))
    report.report(event(6, State.LOCAL, 100))
    report.report(event(10, State.CAPTURING))
    report.report(event(11, State.GLOBAL, 5, requests={"put": 2, "bytesUp": 5}))
    assert report.publish(0)
    steps = steps_in(core.patches[0])
    assert {s: c.tiers for s, c in steps.items()} == {
        7: ("global", "local", "peer"), 9: ("local", "peer"), 6: ("local",), 10: (),
        11: ("global", "local", "peer")}
    # The claim names the holder, so a copy the previous holder confirmed does
    # not count for the new one (operator/peers/placement.py).
    assert {s: (steps[s].peer_holder, steps[s].peer_node) for s in (6, 7, 9, 11)} == {
        7: (0, "node-b"), 9: (0, "node-b"), 6: (None, None), 11: (0, "node-b")}
    assert steps[9].message == "copy held by the partner" and steps[6].message is None
    assert steps[7].bytes == 100 and steps[7].at == "2026-01-01T00:00:00Z"
    assert steps[11].requests == {"put": 2, "bytesUp": 5} and steps[7].requests == {}


def test_the_document_keeps_only_the_newest_steps() -> None:
    clock = Clock()
    report, core = make(clock)
    for step in range(20, 0, -1):  # oldest last: it must not push newer ones out
        report.report(event(step, State.LOCAL, step))
    report.report(event(20, State.GLOBAL, 20))
    assert report.publish(0)
    steps = steps_in(core.patches[0])
    assert sorted(steps) == list(range(20 - progress.MAX_STEPS + 1, 21))
    assert steps[20].state == "Global"


def test_reported_at_is_when_the_patch_that_started_the_drain_was_sent() -> None:
    clock = Clock()
    report, core = make(clock, FakeCore(clock, took=0.5))  # each call takes 0.5 s
    settled(report, core)
    assert report.reported_at is None  # nothing pending reported
    started = clock.now
    assert report.tick(100)
    assert report.reported_at == started  # taken before the call, not after
    report.report(event(8, State.LOCAL, 10))  # a write mid-drain ...
    assert run(report, clock, 60, SETTLE_S + PERIOD) == 1
    assert annotations(core.patches[-1])[PENDING] == "60"
    assert report.reported_at == started  # ... is not a new admission point
    assert run(report, clock, 0, SETTLE_S + 2 * PERIOD) == 1
    assert report.reported_at is None and report.published == 0
    # A failed start is no report: the share channel must not believe one.
    core.fail = True
    assert not report.tick(30)
    assert report.reported_at is None
    core.fail = False
    clock.now += MAX_BACKOFF_S
    restarted = clock.now
    assert report.tick(30) and report.reported_at == restarted


def test_publish_writes_when_a_drain_starts_or_ends_or_progress_is_unsent() -> None:
    report, core = make(Clock())
    assert report.publish(1000)
    assert not report.publish(1050)
    assert not report.publish(500)  # draining on: no write, however far it moved
    assert report.publish(0)
    assert not report.publish(0)
    report.report(event(3, State.CAPTURING))
    assert report.publish(0)  # unsent progress
    assert not report.publish(0)
    assert report.publish(7)
    assert [annotations(p)[PENDING] for p in core.patches] == ["1000", "0", "0", "7"]
    assert pending_changed(None, 0) and pending_changed(0, 1) and not pending_changed(0, 0)
    assert pending_changed(5, 0) and not pending_changed(5, 9)
