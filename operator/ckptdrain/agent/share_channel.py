"""The agent's watch on its policy's share channel and on its namespace's
cluster scale (contract/share.py).

Two watches per agent, each on one object by name, so a change the operator
publishes reaches every agent in one round trip of the apiserver's watch
cache, whatever the number of agents: no pod is written, no kubelet sync
period is waited for. `view()` feeds `share.ShareWatcher`; each event also
calls `on_change` so the new share applies at once. For a channel that
leaves shrinks to the scale, the scale's watch down, or the object gone or
malformed, makes the channel not current (the factor may have dropped
unseen); the last good factor still applies.

Admission is only believed from an allocation that arrived after this
agent reported its drain (`reported()`: when the pending-bytes report that
started it was sent): an older one cannot have counted it. A broken watch
is re-established from a fresh list (jittered backoff), and marks the view
`broken` until then; 410 Gone is a plain re-list. Without rights to watch
(403) the channel is off, said once.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.agent.share import ChannelView
from ckptdrain.contract import share as sh
from ckptdrain.contract.api import GROUP, VERSION
from ckptdrain.errors import InvalidInput

log = logging.getLogger(__name__)

#: Server-side watch timeout; the watch resumes from the last resourceVersion.
WATCH_TIMEOUT_S = 240
RETRY_S, RETRY_MAX_S = 1.0, 30.0
FORBIDDEN_RETRY_S = 60.0


#: What a watch makes of an object that does not parse.
MALFORMED: Any = object()


class ObjectWatch:
    """One CheckpointShare `<namespace>/<name>`, watched from a daemon thread:
    list when there is nowhere to resume from, watch, re-establish with
    jittered backoff. Subclasses take each state of the object in `_take`."""

    def __init__(self, namespace: str, name: str, *, api: Any = None,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.name = namespace, name
        self._on_change = on_change
        self._lock = threading.Lock()
        self._established = False
        self._broken = False
        self._forbidden = False
        self._version: str | None = None  # where the watch resumes; None: list first
        self._accepted: str | None = None  # resourceVersion of the object last taken in
        self._stop = threading.Event()
        self._stop_stream: Callable[[], None] = lambda: None

    @property
    def forbidden(self) -> bool:
        """The apiserver refused the watch (403): the channel is off."""
        with self._lock:
            return self._forbidden

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"watch-{self.name}"[:15],
                         daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._stop_stream()

    def _run(self) -> None:
        delay = RETRY_S
        while not self._stop.is_set():
            try:
                self._watch_once()
                delay = RETRY_S
                continue
            except Exception as err:  # the apiserver's trouble is never the agent's
                wait = self._failed(err, delay)
                delay = min(delay * 2, RETRY_MAX_S)
            if wait and self._stop.wait(wait):
                return

    def _failed(self, err: Exception, delay: float) -> float:
        """How long to wait before the next try (0: at once)."""
        status = getattr(err, "status", None)
        if status == 410:  # the resourceVersion is too old: list again, no harm done
            self._version = None
            return 0.0
        self._version = None
        with self._lock:
            self._broken = True
        if status == 403:
            if not self._forbidden:
                log.warning("share channel off: no right to watch %s (%s); using the "
                            "admission-time share", sh.SHARES, getattr(err, "reason", err))
            with self._lock:
                self._forbidden = True
            self._notify()
            return FORBIDDEN_RETRY_S
        log.info("share channel: watch of %s interrupted (%s); re-establishing",
                 self.name, err)
        self._notify()
        # Jittered, so thousands of agents do not re-list in step after an outage.
        return delay * random.uniform(0.5, 1.5)

    def _watch_once(self) -> None:
        """List when there is nowhere to resume from, then watch until the
        server ends the watch (resume) or it breaks (raise)."""
        selector = f"metadata.name={self.name}"
        if self._version is None:
            listed = self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, sh.SHARES, field_selector=selector,
                _request_timeout=30)
            items = listed.get("items") or []
            self._version = (listed.get("metadata") or {}).get("resourceVersion")
            self._accept(items[0] if items else None)
        events, self._stop_stream = kubeclient.watch_stream(
            self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
            sh.SHARES, field_selector=selector, resource_version=self._version,
            timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True,
            _request_timeout=WATCH_TIMEOUT_S + 30)
        for event in events:
            if self._stop.is_set():
                return
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR":
                status = (obj or {}).get("code") if isinstance(obj, dict) else None
                raise _WatchError(status, str(obj))
            version = ((obj or {}).get("metadata") or {}).get("resourceVersion") \
                if isinstance(obj, dict) else None
            if version:
                self._version = version
            if kind == "BOOKMARK":
                continue
            self._accept(None if kind == "DELETED" else obj)

    def _accept(self, obj: Any) -> None:
        version = ((obj.get("metadata") or {}).get("resourceVersion")
                   if isinstance(obj, dict) else None)
        if version is not None and version == self._accepted:
            # The same object again (a re-list after the watch broke): the
            # channel is back, but this is no news from the operator, so it
            # neither vouches for a quiet operator nor admits a later report.
            with self._lock:
                self._established, self._broken, self._forbidden = True, False, False
            self._notify()
            return
        self._accepted = version
        taken = self._parse(obj) if isinstance(obj, dict) else None
        with self._lock:
            self._take(taken)
            self._established, self._broken, self._forbidden = True, False, False
        self._notify()

    def _parse(self, obj: dict[str, Any]) -> Any:
        """What `_read` makes of the object, or MALFORMED (said once per version)."""
        try:
            return self._read(obj)
        except InvalidInput as err:
            # Never trusted: a malformed channel admits no one, a malformed
            # scale could hide a smaller factor.
            log.warning("share channel: ignoring %s/%s: %s", self.namespace, self.name, err)
            return MALFORMED

    def _read(self, obj: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _take(self, parsed: Any) -> None:
        """Keep what `_parse` made of the object (None: absent; MALFORMED);
        called with the lock held."""
        raise NotImplementedError

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:  # the share watcher's trouble must not end the watch
            log.exception("share channel: applying a change failed")


class ScaleWatch(ObjectWatch):
    """The namespace's cluster scale (sh.SCALE_NAME)."""

    def __init__(self, namespace: str, **kw: Any) -> None:
        super().__init__(namespace, sh.SCALE_NAME, **kw)
        self._scale: sh.Scale | None = None
        self._present = False
        self._malformed = False

    def current(self) -> sh.Scale | None:
        """The last good scale seen (kept when the object goes or turns
        malformed: a channel's budget may have left a shrink to it); None
        when none was ever seen."""
        with self._lock:
            return self._scale

    def trusted(self) -> bool:
        """Listed, its watch up, the object there and readable: a smaller
        factor cannot be missed."""
        with self._lock:
            return self._established and not self._broken and self._present \
                and not self._malformed

    def _read(self, obj: dict[str, Any]) -> sh.Scale:
        return sh.scale_from_object(obj)

    def _take(self, parsed: Any) -> None:
        self._present = parsed is not None
        self._malformed = parsed is MALFORMED
        if isinstance(parsed, sh.Scale):
            self._scale = parsed


class ShareChannel(ObjectWatch):
    """Watches `<namespace>/<policy>`'s CheckpointShare, and the namespace's scale."""

    def __init__(self, namespace: str, policy: str, *, rank: int | None, pod: str,
                 pending: Callable[[], int],
                 reported: Callable[[], float | None] = lambda: None,
                 flushing: Callable[[], bool] = lambda: False,
                 on_change: Callable[[], None] = lambda: None, api: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(namespace, sh.share_name(policy), api=api, on_change=on_change)
        self.scale = ScaleWatch(namespace, api=self.api, on_change=on_change)
        self.rank, self.pod = rank, pod
        self._pending, self._reported, self._flushing = pending, reported, flushing
        self._clock = clock
        self._allocation: sh.Allocation | None = None
        self._received_at: float | None = None
        self._waiting_since: float | None = None

    def start(self) -> None:
        super().start()
        self.scale.start()

    def stop(self) -> None:
        super().stop()
        self.scale.stop()

    # -- what the share watcher reads ------------------------------------------

    def view(self) -> ChannelView:
        now = self._clock()
        draining = self._pending() > 0
        reported = self._reported()
        flushing = self._flushing()
        scale, scale_ok = self.scale.current(), self.scale.trusted()
        with self._lock:
            a, received = self._allocation, self._received_at
            admitted = (a is not None and draining and reported is not None
                        and received is not None and received >= reported
                        and a.admits(self.rank, self.pod))
            if draining and not admitted:
                if self._waiting_since is None:
                    self._waiting_since = now
            else:
                self._waiting_since = None
            # A channel that leaves shrinks to a scale it cannot trust is not current.
            unscaled = a is not None and a.wanted is not None and not scale_ok
            return ChannelView(established=self._established,
                               broken=self._broken or unscaled,
                               forbidden=self._forbidden, allocation=a, received_at=received,
                               admitted=admitted, draining=draining,
                               waiting_since=self._waiting_since, flushing=flushing,
                               scale=scale)

    def _read(self, obj: dict[str, Any]) -> sh.Allocation:
        return sh.from_object(obj)

    def _take(self, parsed: Any) -> None:
        # Malformed: no admission, so a drainer waits, then falls back to its file share.
        self._allocation = None if parsed is MALFORMED else parsed
        self._received_at = self._clock()


class _WatchError(Exception):
    def __init__(self, status: int | None, text: str) -> None:
        super().__init__(text)
        self.status = status
