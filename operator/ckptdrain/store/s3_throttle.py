"""The s3:// store's one gate: every request of the process to an endpoint
passes it, and it is where "slow down" is heard.

botocore's own retries are per request: each throttled request sleeps and
retries on its own, so eight workers that all meet 503 SlowDown come back
together, and a thousand processes do the same. Instead the client is built
without retries (total_max_attempts 1) and `ThrottleGate.send` retries here, all
requests of the process sharing one `congestion.Congestion`: a 503/429/
timeout halves how many requests may be in flight and pauses new ones for a
shared, growing back-off; answers grow the window back (AIMD).

A slot is held from the request's start until its answer's headers: a GET's
body is read after, outside the gate (its bytes are the rate limiter's).
The gate also counts requests and bytes by billing class (request_counts.py).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import (
    ClientError,
    ConnectionError,
    HTTPClientError,
    ReadTimeoutError,
    SSLError,
)

from ckptdrain.congestion import Congestion, CongestionSettings
from ckptdrain.errors import CkptdrainError
from ckptdrain.request_counts import RequestCounts
from ckptdrain.store.base import SendStopped

#: Error codes (and HTTP statuses) by which a store asks us to slow down.
THROTTLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded",
    "RequestThrottled", "RequestThrottledException", "ServiceUnavailable", "RequestTimeout",
    "InternalError", "BandwidthLimitExceeded",
})
THROTTLE_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Tries of one request (the first included) before its error is raised.
ATTEMPTS = 5


def is_congestion(err: BaseException) -> bool:
    """Whether `err` says the store (or the path to it) is overloaded: retried
    through the shared back-off. Connection refusals and timeouts count: a
    store that drops connections under load says the same thing."""
    if isinstance(err, ClientError):
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in THROTTLE_CODES or status in THROTTLE_STATUSES
    if isinstance(err, SSLError):
        return False  # an untrusted certificate stays untrusted: no retry
    return isinstance(err, ReadTimeoutError | ConnectionError | HTTPClientError)


def raised_by_sender(err: BaseException) -> BaseException | None:
    """What the sender itself raised from inside a request, however the HTTP
    stack wrapped it (botocore: HTTPClientError(error=...)): a SendStopped
    (its pacer is stopping) or one of our errors (a body that found its file
    changed). Neither says anything of the store."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        if isinstance(found, SendStopped | CkptdrainError):
            return found
        seen.add(id(found))
        kwargs = getattr(found, "kwargs", None)
        wrapped = kwargs.get("error") if isinstance(kwargs, dict) else None
        found = wrapped if isinstance(wrapped, BaseException) else found.__cause__
    return None


@dataclass(frozen=True)
class GateState:
    window: int
    lowest_window: int
    in_flight: int
    events: int
    signals: int
    paused: bool


class ThrottleGate:
    """Thread-safe; one per endpoint per process (`gate_for`)."""

    def __init__(self, settings: CongestionSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep_jitter: Callable[[], float] = random.random) -> None:
        self._state = Congestion(settings or CongestionSettings())
        self._cond = threading.Condition()
        self._clock = clock
        self._jitter = sleep_jitter
        self._in_flight = 0
        self._counts = RequestCounts()

    @property
    def counts(self) -> RequestCounts:
        with self._cond:
            return self._counts

    def state(self) -> GateState:
        with self._cond:
            s = self._state
            return GateState(s.window, s.lowest_window, self._in_flight, s.events, s.signals,
                             s.pause_until > self._clock())

    def _acquire(self) -> None:
        with self._cond:
            while not self._state.may_start(self._in_flight, self._clock()):
                # Wake at the pause's end, or when a slot frees (notify).
                self._cond.wait(timeout=min(1.0, max(0.005, self._state.wait_hint(self._clock()))))
            self._in_flight += 1

    def _release(self, op: str, congested: bool | None, up: int, down: int) -> None:
        """The request's slot back; `congested`: what its end says of the
        store (None: nothing, e.g. the sender stopped it)."""
        with self._cond:
            in_flight = self._in_flight  # this request included
            self._in_flight -= 1
            now = self._clock()
            if congested:
                self._state.on_congestion(now, 0.5 + self._jitter() / 2, in_flight)
            elif congested is not None:
                self._state.on_success(now)
            self._counts = self._counts.plus(op, up, down)
            self._cond.notify_all()

    def send(self, op: str, call: Callable[..., Any], kwargs: dict[str, Any],
             attempts: int = ATTEMPTS) -> Any:
        """`call(**kwargs)` through the gate, retried while the store is
        congested (up to `attempts` tries); the last error is raised."""
        up = int(kwargs.get("ContentLength") or 0)
        body = kwargs.get("Body")
        for attempt in range(attempts):
            if attempt and hasattr(body, "seek"):
                body.seek(0)  # a retry sends the whole body again
            self._acquire()
            try:
                response = call(**kwargs)
            except Exception as err:
                ours = raised_by_sender(err)
                if ours is not None:
                    # botocore wraps whatever the body raised as HTTPClientError,
                    # which reads as a dropped connection: counted as congestion
                    # it paused every drain of the process, and each retry was
                    # stopped again, so one superseded upload backed the whole
                    # endpoint off for minutes.
                    self._release(op, None, 0, 0)
                    raise ours from None
                congested = is_congestion(err)
                status = (err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                          if isinstance(err, ClientError) else None)
                # A request the server answered (or the connection carried) was sent.
                self._release(op, congested, up if status or congested else 0, 0)
                if not congested or attempt == attempts - 1:
                    raise
                continue
            except BaseException:
                # An interrupt or a cancelled drain: the slot must come back,
                # or the window shrinks for good; it says nothing of the store.
                self._release(op, None, 0, 0)
                raise
            down = int(response.get("ContentLength") or 0) if op == "get_object" else 0
            self._release(op, False, up, down)
            return response
        raise AssertionError("unreachable")


_gates: dict[str, ThrottleGate] = {}
_gates_lock = threading.Lock()


def gate_for(endpoint: str) -> ThrottleGate:
    """The process's gate for `endpoint` (created on first use): every store
    and thread talking to one endpoint backs off together."""
    with _gates_lock:
        gate = _gates.get(endpoint)
        if gate is None:
            gate = _gates[endpoint] = ThrottleGate()
        return gate
