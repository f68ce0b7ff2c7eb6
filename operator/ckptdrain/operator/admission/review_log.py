"""What the admission process's log says of a review it could not answer
as asked: a malformed review refused, or an error the rules met. Enough to
find the request (its uid, namespace and name, as the apiserver set them
in the request) and what went wrong (the field, what was expected and the
JSON type seen; an error's type and the frames it was raised through),
never a value of the review's object nor an error's message: an env value
or an annotation may be a secret, and a bare error's message may quote one.

Rate-limited like refused client certificates (refusal_log.py): the first
line at once, then at most one a minute for each of the two, saying how
many it stands for; a client posting bad reviews in a loop must not drown
the log.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ckptdrain.operator.admission.refusal_log import REFUSAL_LOG_INTERVAL_S, RefusalLog
from ckptdrain.operator.admission.review_shape import MalformedReview, kind_of

#: The longest uid, namespace or name a line quotes (a uid may be 1 MB).
QUOTED = 64


def quoted(value: Any) -> str:
    """A string as a Python literal (no newline can forge a log line), cut
    at QUOTED characters; anything else as its JSON type."""
    if not isinstance(value, str):
        return kind_of(value)
    return repr(value[:QUOTED]) + ("..." if len(value) > QUOTED else "")


def request_named(review: Any) -> str:
    """`uid '…', namespace '…', name '…'` of a review's request."""
    request = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(request, Mapping):
        return f"request {kind_of(request)}"
    return ", ".join(f"{key} {quoted(request.get(key))}" for key in ("uid", "namespace", "name"))


def frames(error: BaseException) -> str:
    """Where `error` was raised: file:line in function, outermost first."""
    return " > ".join(f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                      for frame in traceback.extract_tb(error.__traceback__)) or "?"


def malformed_line(which: str, review: Any, error: MalformedReview) -> str:
    return (f"admission: refused a malformed {which} review ({request_named(review)}): "
            f"{error.field}: expected {error.expected}, got {error.seen}")


def failed_line(which: str, review: Any, error: BaseException) -> str:
    return (f"admission: the {which} review ({request_named(review)}) failed with "
            f"{type(error).__name__} at {frames(error)}")


class ReviewLog:
    """Logs malformed reviews (a warning) and failed ones (an error),
    each kind rate-limited on its own."""

    def __init__(self, logger: logging.Logger, interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self._malformed = RefusalLog(interval_s, clock)
        self._failed = RefusalLog(interval_s, clock)

    def malformed(self, which: str, review: Any, error: MalformedReview) -> None:
        count = self._malformed.note()
        if count:
            self.logger.warning("%s%s", malformed_line(which, review, error), _more(count))

    def failed(self, which: str, review: Any, error: BaseException) -> None:
        count = self._failed.note()
        if count:
            self.logger.error("%s%s", failed_line(which, review, error), _more(count))


def _more(count: int) -> str:
    return f" (and {count - 1} more since the last such line)" if count > 1 else ""
