"""The gate's bookkeeping around requests that never answer normally."""

from __future__ import annotations

import pytest

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
