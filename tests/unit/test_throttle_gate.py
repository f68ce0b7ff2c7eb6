"""The gate's bookkeeping around requests that never answer normally."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, HTTPClientError

from ckptdrain.congestion import CongestionSettings
from ckptdrain.errors import IntegrityError
from ckptdrain.store.base import SendStopped
from ckptdrain.store.s3_throttle import ThrottleGate


class _Cancelled(BaseException):
    """Stands for an interrupt or a cancelled drain unwinding a worker thread."""


def _cancelled(**_: object) -> None:
    raise _Cancelled


def test_an_interrupted_request_gives_its_slot_back_and_leaves_the_window_alone() -> None:
    gate = ThrottleGate()
    window = gate.state().window
    for _ in range(window + 1):  # more than the window: every slot must come back
        with pytest.raises(_Cancelled):
            gate.send("put_object", _cancelled, {"ContentLength": 5})
        assert gate.state().in_flight == 0  # checked each time: a leak would block the next
    state = gate.state()
    assert state.window == window
    assert state.events == 0
    assert gate.send("head_object", lambda **_: {"ContentLength": 0}, {}) == {"ContentLength": 0}


def _congested_gate() -> ThrottleGate:
    """A gate that has heard "slow down" three times: a small window and a
    grown back-off, which only the store's answers may undo."""
    now = [0.0]
    gate = ThrottleGate(CongestionSettings(max_window=8, backoff=0.05, max_backoff=5.0,
                                           cooldown=0.0), clock=lambda: now[0],
                        sleep_jitter=lambda: 1.0)

    def slow_down(**_: object) -> None:
        raise ClientError({"Error": {"Code": "SlowDown"},
                           "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    for _ in range(3):
        now[0] += 10.0  # past every pause
        with pytest.raises(ClientError):
            gate.send("put_object", slow_down, {}, attempts=1)
    now[0] += 10.0
    return gate


@pytest.mark.parametrize("raised", [
    SendStopped("the drain is stopping"),
    IntegrityError("shard0: the file shrank while its part was sent"),
])
def test_what_the_sender_raises_inside_a_request_says_nothing_of_the_store(
        raised: Exception) -> None:
    """botocore wraps whatever a request body raises as HTTPClientError, which
    reads like a dropped connection: it must be neither congestion (a
    pause for every request of the process, and retries) nor an answer (a
    reset back-off and a growing window)."""
    gate = _congested_gate()
    before = gate.state()
    calls = []

    def body_raises(**_: object) -> None:
        calls.append(1)
        raise HTTPClientError(error=raised)
    with pytest.raises(type(raised)) as caught:
        gate.send("put_object", body_raises, {"ContentLength": 5})
    assert caught.value is raised and len(calls) == 1  # not retried
    assert gate.state() == before
    assert gate._state._next_backoff == pytest.approx(0.4)  # still grown
