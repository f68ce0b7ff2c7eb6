"""The agent's watch on its policy's share channel (contract/share.py).

One watch per agent on one object (by name), so a change the operator
publishes reaches every agent in one round trip of the apiserver's watch
cache, whatever the number of agents: no pod is written, no kubelet sync
period is waited for. The view it keeps (`view()`) feeds `share.ShareWatcher`;
each event also calls `on_change` so the new share applies at once.

Staleness is judged on this process's monotonic clock: a watch that has been
broken (and not re-established) for `STALE_AFTER_S` no longer vouches for the allocation (another
drainer may have been counted meanwhile) and the agent falls back to its
file share. Without rights to watch (403) the channel is off, said once.
"""

from __future__ import annotations

import logging
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

#: A broken watch keeps vouching for the last allocation this long.
STALE_AFTER_S = 20.0
#: Server-side watch timeout; the watch is re-established from the last
#: resourceVersion after it.
WATCH_TIMEOUT_S = 240
RETRY_S = 2.0
FORBIDDEN_RETRY_S = 60.0


class ShareChannel:
    """Watches `<namespace>/<policy>`'s CheckpointShare from a daemon thread."""

    def __init__(self, namespace: str, policy: str, pending: Callable[[], int],
                 on_change: Callable[[], None] = lambda: None, api: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.name = namespace, sh.share_name(policy)
        self._pending, self._on_change, self._clock = pending, on_change, clock
        self._lock = threading.Lock()
        self._allocation: sh.Allocation | None = None
        self._established = False  # a list succeeded at least once
        self._broken_since: float | None = None  # the watch is down since (monotonic)
        self._draining_since: float | None = None
        self._forbidden = False
        self._stop = threading.Event()

    # -- what the share watcher reads ------------------------------------------

    def view(self) -> ChannelView:
        now = self._clock()
        draining = self._pending() > 0
        with self._lock:
            if not draining:
                self._draining_since = None
            elif self._draining_since is None:
                self._draining_since = now
            live = (not self._forbidden and self._established
                    and (self._broken_since is None
                         or now - self._broken_since < STALE_AFTER_S))
            return ChannelView(live=live, allocation=self._allocation, draining=draining,
                               draining_since=self._draining_since)

    @property
    def forbidden(self) -> bool:
        """The apiserver refused the watch (403): the channel is off."""
        with self._lock:
            return self._forbidden

    # -- the watch -------------------------------------------------------------

    def start(self) -> None:
        threading.Thread(target=self._run, name="share-channel", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
                delay = 0.0
            except Exception as err:  # the apiserver's trouble is never the agent's
                with self._lock:
                    if self._broken_since is None:
                        self._broken_since = self._clock()
                delay = self._failed(err)
            if delay and self._stop.wait(delay):
                return

    def _failed(self, err: Exception) -> float:
        status = getattr(err, "status", None)
        if status == 403:
            if not self._forbidden:
                log.warning("share channel off: no right to watch %s (%s); using the "
                            "admission-time share", sh.SHARES, getattr(err, "reason", err))
            with self._lock:
                self._forbidden = True
            self._on_change()
            return FORBIDDEN_RETRY_S
        log.info("share channel: watch interrupted (%s); re-establishing", err)
        return RETRY_S

    def _watch_once(self) -> None:
        """List (for a consistent start), then watch from there until the
        server ends the watch or it breaks."""
        selector = f"metadata.name={self.name}"
        listed = self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, sh.SHARES, field_selector=selector,
            _request_timeout=30)
        items = listed.get("items") or []
        self._accept(items[0] if items else None)
        version = (listed.get("metadata") or {}).get("resourceVersion")
        events, stop = kubeclient.watch_stream(
            self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
            sh.SHARES, field_selector=selector, resource_version=version,
            timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True,
            _request_timeout=WATCH_TIMEOUT_S + 30)
        for event in events:
            if self._stop.is_set():
                stop()
                return
            kind = event.get("type")
            obj = event.get("object")
            if kind == "ERROR":
                # 410 Gone and the like: start over from a fresh list.
                raise RuntimeError(f"watch error: {obj}")
            if kind == "BOOKMARK":
                continue
            self._accept(None if kind == "DELETED" else obj)

    def _accept(self, obj: Any) -> None:
        allocation = None
        if isinstance(obj, dict):
            try:
                allocation = sh.from_object(obj)
            except InvalidInput as err:
                # Never trust a malformed allocation: no admission, so a
                # drainer waits, then falls back to its file share.
                log.warning("share channel: ignoring %s/%s: %s", self.namespace, self.name, err)
        with self._lock:
            self._allocation = allocation
            self._established, self._broken_since, self._forbidden = True, None, False
        self._on_change()
