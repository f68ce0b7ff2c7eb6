"""The node side's calls to the apiserver: the annotations restore leaves on
its own pod, and the writer's lease.

Both import `kubernetes` only when they build a client (kubeclient.py), so
a node without API access pays nothing. Callers treat every failure here as
optional: records and annotations inform, training never waits on them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.node.lease import (
    ANNOTATION_HOLDER_NODE,
    LEASE_API,
    LEASE_PLURAL,
    LEASE_SECONDS,
    NODE_DEAD_S,
    NODE_LEASE_NAMESPACE,
    ExpiryWatch,
    WriterFenced,
    confirmed,
    holder_node,
    holder_node_value,
    lease_name,
    lease_spec,
    may_take,
    recently_renewed,
)

log = logging.getLogger(__name__)


def annotate_own_pod(namespace: str, pod: str, key: str, value: str, api: Any = None) -> bool:
    """One best-effort annotation on this pod (restore's record of what it placed)."""
    return annotate_own_pod_with(namespace, pod, {key: value}, api)


def annotate_own_pod_with(namespace: str, pod: str, annotations: dict[str, str],
                          api: Any = None) -> bool:
    """Best-effort annotations on this pod, in one patch."""
    try:
        if api is None:
            api = kubeclient.node_core_api()
        api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": annotations}},
                                 _request_timeout=5)
    except Exception as err:
        log.warning("could not annotate pod %s/%s with %s: %s", namespace, pod,
                    ", ".join(sorted(annotations)), err)
        return False
    return True


class WriterLease:
    """Take and keep this writer's lease (node/lease.py says the rules);
    `check()` before a commit."""

    def __init__(self, namespace: str, policy: str, writer: int, holder: str,
                 api: Any = None, seconds: int = LEASE_SECONDS,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic,
                 node: str | None = None, pod: str | None = None) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.name = namespace, lease_name(policy, writer)
        self.holder, self.seconds, self.clock = holder, seconds, clock
        self.monotonic = monotonic
        #: This pod's node and name: written on the lease, so a taker can tell
        #: when the node is gone, and so the lease goes with the pod (owner).
        self.node, self.pod = node or None, pod or None
        #: Monotonic time of the last successful take or renewal.
        self._renewed_at: float | None = None
        self._failed = False
        self._watch = ExpiryWatch()
        self._node_watches: dict[str, ExpiryWatch] = {}
        self._node_missing: dict[str, float] = {}
        self._node_checks = True
        self.enabled = True
        self.held = False
        self.other: str | None = None
        self._released = False
        #: check(), renew() and release() one at a time: a release never
        #: races a renewal that would take the lease back.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        #: The lease as this pod last wrote it: renewing from it costs one write
        #: (its resourceVersion makes a changed lease a 409, then it is read).
        self._mine: dict[str, Any] | None = None

    def _call(self, verb: str, *args: Any) -> Any:
        method = getattr(self.api, f"{verb}_namespaced_custom_object")
        return method(*LEASE_API, self.namespace, LEASE_PLURAL, *args, _request_timeout=5)

    def _take_or_renew(self, now: datetime) -> bool:
        from kubernetes.client.exceptions import ApiException

        if self._mine is not None and self.held:
            spec = self._mine.get("spec") or {}
            self._mine["spec"] = lease_spec(self.holder, self.seconds, now,
                                            spec.get("acquireTime"))
            try:
                self._mine = dict(self._call("replace", self.name, self._mine))
                return True
            except ApiException as error:
                self._mine = None
                if error.status not in (404, 409):
                    raise
        try:
            lease = self._call("get", self.name)
        except ApiException as error:
            if error.status != 404:
                raise
            self._mine = dict(self._call(
                "create", {"apiVersion": "/".join(LEASE_API), "kind": "Lease",
                           "metadata": self._stamp({"name": self.name}),
                           "spec": lease_spec(self.holder, self.seconds, now)}))
            return True
        spec = lease.get("spec") or {}
        unchanged = self._watch.unchanged_for(lease, self.monotonic())
        if not may_take(spec, self.holder, unchanged):
            if not self._holder_node_gone(lease, unchanged):
                self.other = str(spec.get("holderIdentity"))
                return False
            log.warning("writer lease %s: the node of its holder (pod uid %s) is gone; "
                        "taking it over", self.name, spec.get("holderIdentity"))
        mine = spec.get("holderIdentity") == self.holder
        lease["metadata"] = self._stamp(dict(lease.get("metadata") or {}))
        # The read resourceVersion rides along: a racing taker gets a 409.
        lease["spec"] = lease_spec(self.holder, self.seconds, now,
                                   spec.get("acquireTime") if mine else None)
        self._mine = dict(self._call("replace", self.name, lease))
        return True

    def _stamp(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """The lease's metadata as this pod holds it: its node (with its uid, so
        a node written by an earlier holder is never taken for this one's) and
        this pod as the owner (the lease is deleted with the pod)."""
        annotations = dict(metadata.get("annotations") or {})
        annotations.pop(ANNOTATION_HOLDER_NODE, None)
        if self.node:
            annotations[ANNOTATION_HOLDER_NODE] = holder_node_value(self.node, self.holder)
        metadata["annotations"] = annotations
        if self.pod:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod",
                                            "name": self.pod, "uid": self.holder}]
        else:
            metadata.pop("ownerReferences", None)
        return metadata

    def _holder_node_gone(self, lease: dict[str, Any], unchanged_for: float) -> bool:
        """Whether the holder is gone with its node: the lease itself seen
        unchanged for NODE_DEAD_S (so a holder that renewed recently always
        wins), and the holder's node lease deleted or unchanged for as long
        (or three of its own durations, if longer). Anything uncertain (no
        node on the lease, one written for another holder, this very node, no
        rights) is no."""
        from kubernetes.client.exceptions import ApiException

        if not self._node_checks:
            return False
        holder = (lease.get("spec") or {}).get("holderIdentity")
        node = holder_node(((lease.get("metadata") or {}).get("annotations") or {}).get(
            ANNOTATION_HOLDER_NODE), holder)
        if not node or node == self.node:
            return False
        mono = self.monotonic()
        try:
            found = self.api.get_namespaced_custom_object(
                *LEASE_API, NODE_LEASE_NAMESPACE, LEASE_PLURAL, node, _request_timeout=5)
        except ApiException as error:
            if error.status == 404:  # gone, if it stays gone (a node re-registering)
                missing = mono - self._node_missing.setdefault(node, mono)
                return missing > NODE_DEAD_S and unchanged_for > NODE_DEAD_S
            if error.status == 403:
                self._node_checks = False
                log.warning("writer lease: no right to read node leases (%s); a lost "
                            "holder frees its writer only after %ss", error.reason,
                            self.seconds)
            return False
        self._node_missing.pop(node, None)
        duration = (found.get("spec") or {}).get("leaseDurationSeconds")
        dead_after = max(NODE_DEAD_S, 3 * duration if isinstance(duration, int) else 0)
        watch = self._node_watches.setdefault(node, ExpiryWatch())
        # Both clocks run from the first look, so a lost node frees its writers
        # about NODE_DEAD_S after it went, not twice that.
        return watch.unchanged_for(found, mono) > dead_after and unchanged_for > NODE_DEAD_S

    def _forget_observations(self) -> None:
        """After this process could not reach the apiserver, what it saw
        "unchanged" meanwhile proves nothing: nobody could renew."""
        self._watch = ExpiryWatch()
        self._node_watches.clear()
        self._node_missing.clear()

    def renew(self) -> bool:
        """Take or renew the lease now (a write); True when this pod holds it
        (or fencing is off)."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            if self._released:
                return False
            if not self.enabled:
                return True
            # Taken before the write: a taker may see it from the moment the
            # apiserver stores it, which is before our call returns.
            started = self.monotonic()
            try:
                self.held = self._take_or_renew(self.clock())
                self._failed = False
                if self.held:
                    self.other = None
                    self._renewed_at = started
            except ApiException as error:
                if error.status == 403:
                    self.enabled = False
                    log.warning("writer fencing off: no rights on leases in %s (%s)",
                                self.namespace, error.reason)
                    return True
                self._failed = True
                if error.status == 409:  # another taker won the race for the lease
                    self.held, self._mine = False, None
                    return False
                self._forget_observations()
                log.warning("could not renew writer lease %s: %s", self.name, error.reason)
            except Exception as error:  # unreachable apiserver
                self._failed = True
                self._forget_observations()
                log.warning("could not renew writer lease %s: %s", self.name, error)
            return self.held and self._trusted()

    def _trusted(self) -> bool:
        """The last successful renewal still vouches for the lease."""
        return recently_renewed(self._renewed_at, self.monotonic())

    def _confirmed(self) -> bool:
        """Two reads vouch for the lease instead of a write (lease.confirmed):
        it is as this pod last wrote it, and this node's kubelet is alive."""
        if self._mine is None or self._renewed_at is None or not self.node:
            return False
        try:
            lease = self._call("get", self.name)
            node = self.api.get_namespaced_custom_object(
                *LEASE_API, NODE_LEASE_NAMESPACE, LEASE_PLURAL, self.node, _request_timeout=5)
        except Exception as error:  # no rights, no node lease, no apiserver: renew instead
            log.debug("writer lease %s: not confirmed by reading: %s", self.name, error)
            return False
        # Measured after the reads, so the time they took is not margin: the
        # commit that follows has TRUST_S of the duration left.
        age = self.monotonic() - self._renewed_at
        return confirmed(lease, self._mine, self.holder, age, self.seconds, node,
                         self.clock())

    def check(self) -> None:
        """Before a commit: go on a recent renewal, or on two reads that
        confirm the lease (lease.confirmed), else renew (a write); raise
        WriterFenced unless this pod holds the lease now. A renewal that fails
        is no vouching: no commit until one succeeds (the drain retries;
        checkpoints stay local)."""
        with self._lock:
            if self._released:
                raise WriterFenced(f"writer lease {self.namespace}/{self.name} was released: "
                                   "this pod is stopping; not committing")
            if not self.enabled:
                return
            if self.held and self._trusted():
                return
            if self.held and self._confirmed():
                return
            if self.renew():
                return
            if self.held:  # ours when last heard, but not renewed just now
                raise WriterFenced(
                    f"writer lease {self.namespace}/{self.name} could not be renewed "
                    "(apiserver unreachable?): another pod may take it over; not "
                    "committing until a renewal succeeds")
            raise WriterFenced(
                f"writer lease {self.namespace}/{self.name} is held by pod uid {self.other}: "
                "another live pod writes as this writer; not committing (the policy's "
                "WritersConsistent condition names both pods)")

    def start(self) -> None:
        """Keep the lease: renew once its last renewal is two thirds of the
        duration old (a third of it, at least a commit period, still left);
        after a failure, or while another pod holds it, look again every 10 s."""
        def loop() -> None:
            while not self._stop.is_set():
                age = None if self._renewed_at is None else self.monotonic() - self._renewed_at
                if not self.held or age is None or age >= self.seconds * 2 / 3:
                    self.renew()
                if self.held and not self._failed and self._renewed_at is not None:
                    wait = max(1.0, self._renewed_at + self.seconds * 2 / 3 - self.monotonic())
                else:
                    wait = min(self.seconds / 3, 10.0)
                self._stop.wait(wait)
        threading.Thread(target=loop, name="writer-lease", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Stop renewing and free the lease if this pod still holds it, so a
        replacement commits at once instead of a lease duration later. No
        check passes after this (even one racing it on the drain's thread)."""
        with self._lock:
            self._released = True
            self.stop()
            if not self.enabled:
                return
            try:
                lease = self._call("get", self.name)
                if (lease.get("spec") or {}).get("holderIdentity") == self.holder:
                    metadata = dict(lease.get("metadata") or {})
                    annotations = dict(metadata.get("annotations") or {})
                    annotations.pop(ANNOTATION_HOLDER_NODE, None)
                    metadata["annotations"] = annotations
                    lease["metadata"] = metadata
                    lease["spec"] = {"leaseDurationSeconds": self.seconds}
                    self._call("replace", self.name, lease)
                self.held, self._mine = False, None
            except Exception as error:  # it expires by itself
                log.warning("could not release writer lease %s: %s", self.name, error)
