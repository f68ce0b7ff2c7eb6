"""What runs at the end of each recency pass of a policy (kueue/report.py
registers its check there): with the policy and its Kueue Workloads, or
with none when the pass found no live pods, so that what a hook said of
the policy can go when the job does.

A hook's trouble is its own: one that raises is logged once per policy
(again after it has succeeded) and never breaks the pass, its writes or
its retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ckptdrain.operator.recency import owners

Key = tuple[str, str]
#: (policy key, its body or None when not known, its Kueue Workloads, logger).
Hook = Callable[[Key, "dict[str, Any] | None", list[owners.Owner], logging.Logger], None]
HOOKS: list[Hook] = []

_lock = threading.Lock()
#: (policy key, hook name): its failure is logged already.
_failing: set[tuple[Key, str]] = set()


def run(key: Key, policy: dict[str, Any] | None, queued: list[owners.Owner],
        logger: logging.Logger) -> None:
    """Each hook, in order; none can stop the others or the pass."""
    for hook in list(HOOKS):
        name = getattr(hook, "__qualname__", repr(hook))
        try:
            hook(key, policy, queued, logger)
        except Exception as error:  # any failure stays the hook's, never the pass's
            with _lock:
                first = (key, name) not in _failing
                _failing.add((key, name))
            if first:
                logger.warning("policy %s/%s: %s failed after the recency pass: %s: %s",
                               *key, name, type(error).__name__, error)
            continue
        with _lock:
            _failing.discard((key, name))


def forget(key: Key) -> None:
    """A deleted policy: its failures are not remembered."""
    with _lock:
        _failing.difference_update({e for e in _failing if e[0] == key})
