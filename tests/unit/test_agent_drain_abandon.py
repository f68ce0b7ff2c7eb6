"""A step the ranks abandoned is not drained again (agent/drainworker.py).

When a restore round agrees on an older step, the agent's loop cancels the
in-flight drain of the abandoned newer step (abandon_above) and removes its
local copy after. The drain thread, stopping at its next part boundary,
must not queue the step again in between: drained later, its bytes (the
state the trainer abandoned) would reach the global tier.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ckptdrain.agent.drainworker import DrainWorker
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain_run import DrainCancelled


class _Quiet:
    def report(self, event: object) -> None:
        pass


class _DrainerUntilCancelled:
    """Sends nothing; each drain waits for its cancel, then stops as at a
    part boundary."""

    def __init__(self) -> None:
        self.limiter = SimpleNamespace(granted=0)
        self.calls: list[Path] = []
        self.entered = threading.Semaphore(0)

    def drain(self, src: Path, manifest: Any, *, cancel: threading.Event, **_: Any) -> Any:
        self.calls.append(src)
        self.entered.release()
        assert cancel.wait(30), "never cancelled"
        raise DrainCancelled("cancelled at a part boundary")


def _settled(worker: DrainWorker, drainer: _DrainerUntilCancelled, calls: int) -> None:
    """Until the worker is idle or has started drain number `calls`."""
    deadline = time.monotonic() + 30
    while worker.busy_steps() and len(drainer.calls) < calls:
        assert time.monotonic() < deadline, "the worker neither went idle nor drained"
        time.sleep(0.01)


def _started_holding_120(tmp_path: Path, drainer: _DrainerUntilCancelled
                         ) -> tuple[LocalTier, Path, DrainWorker]:
    """A started worker over a local tier holding step 120 (captured from `src`)."""
    tier = LocalTier(tmp_path / "local")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"\x07" * 1000)
    tier.capture(src, 120, writer=0, writers=1)
    worker = DrainWorker(tier, LocalStore(str(tmp_path / "store")), drainer,  # type: ignore[arg-type]
                         _Quiet(), AgentMetrics(), part_size=1 << 20)
    worker.start()
    return tier, src, worker


def test_an_abandoned_step_in_flight_is_not_queued_again(tmp_path: Path) -> None:
    drainer = _DrainerUntilCancelled()
    tier, src, worker = _started_holding_120(tmp_path, drainer)
    try:
        worker.submit(120)
        assert drainer.entered.acquire(timeout=30)
        worker.abandon_above(110)  # the loop applies the round; its copy goes next
        _settled(worker, drainer, calls=2)
        assert len(drainer.calls) == 1 and worker.busy_steps() == set()
        tier.remove(120)
        # The new timeline's step 120, captured later, drains as any step.
        tier.capture(src, 120, writer=0, writers=1)
        worker.submit(120)
        assert drainer.entered.acquire(timeout=30)
        assert len(drainer.calls) == 2
    finally:
        assert worker.stop(30)


class _DrainerFailingOnce(_DrainerUntilCancelled):
    """Its second drain fails as a store that did not answer; the others
    wait for their cancel."""

    def drain(self, src: Path, manifest: Any, *, cancel: threading.Event, **kw: Any) -> Any:
        if len(self.calls) == 1:
            self.calls.append(src)
            self.entered.release()
            raise ConnectionError("the store did not answer")
        return super().drain(src, manifest, cancel=cancel, **kw)


def test_the_new_timelines_step_of_an_abandoned_number_is_retried(tmp_path: Path) -> None:
    """The worker forgets the abandoned step once its drain stopped: the new
    timeline's step of the same number, whose first try fails, is retried."""
    drainer = _DrainerFailingOnce()
    tier, src, worker = _started_holding_120(tmp_path, drainer)
    try:
        worker.submit(120)
        assert drainer.entered.acquire(timeout=30)
        worker.abandon_above(110)
        _settled(worker, drainer, calls=2)
        tier.remove(120)
        tier.capture(src, 120, writer=0, writers=1)
        worker.submit(120)
        assert drainer.entered.acquire(timeout=30)  # the first try fails
        assert drainer.entered.acquire(timeout=30), "the new step 120 was not retried"
        assert len(drainer.calls) == 3
    finally:
        assert worker.stop(30)


class _StoreAbandoningAtCommit(LocalStore):
    """A real store, but the round that abandons the step lands while the
    drain makes its last check before the commit (its listing of the data)."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root))
        self.when_listing_data: Any = None

    def list(self, prefix: str) -> Any:
        if prefix.startswith("data/") and self.when_listing_data is not None:
            self.when_listing_data()
        return super().list(prefix)


def test_a_step_abandoned_just_before_its_commit_is_never_committed(tmp_path: Path) -> None:
    """The data is all sent when the round abandons the step: the drain
    stops at the commit point, and no manifest of the abandoned run's step
    reaches the store (the new run commits that number later)."""
    from ckptdrain import keys
    from ckptdrain.transfer.drain import Drainer

    tier = LocalTier(tmp_path / "local")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"\x07" * 1000)
    tier.capture(src, 120, writer=0, writers=2)
    store = _StoreAbandoningAtCommit(tmp_path / "store")
    worker = DrainWorker(tier, store, Drainer(store), _Quiet(), AgentMetrics(),
                         part_size=1 << 20)
    store.when_listing_data = lambda: worker.abandon_above(110)
    worker.start()
    try:
        worker.submit(120)
        deadline = time.monotonic() + 30
        while worker.busy_steps():
            assert time.monotonic() < deadline, "the worker never went idle"
            time.sleep(0.01)
        assert store.head(keys.manifest_key(120, 0)) is None
        assert not tier.is_global(120)
    finally:
        assert worker.stop(30)
