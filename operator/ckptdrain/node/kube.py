"""The node side's calls to the apiserver: the agent's Checkpoint record
client, the annotation restore leaves on its own pod, and the writer's lease.

Both import `kubernetes` only when they build a client (kubeclient.py), so
a node without API access pays nothing. Callers treat every failure here as
optional: records and annotations inform, training never waits on them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.contract.api import CHECKPOINTS, GROUP, VERSION
from ckptdrain.contract.record import build_record, writer_patch
from ckptdrain.node.lease import (
    ANNOTATION_HOLDER_NODE,
    LEASE_API,
    LEASE_PLURAL,
    LEASE_SECONDS,
    NODE_DEAD_S,
    NODE_LEASE_NAMESPACE,
    ExpiryWatch,
    WriterFenced,
    lease_name,
    lease_spec,
    may_take,
    recently_renewed,
    renewal_fresh,
)

log = logging.getLogger(__name__)


class RecordWriter:
    """What an agent calls: make sure the step's record exists, then report its shard."""

    def __init__(self, namespace: str, policy: str, writers: int, writer_id: str,
                 api: Any = None) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.policy = namespace, policy
        self.writers, self.writer_id = writers, writer_id
        self._ensured: set[int] = set()

    def ensure(self, step: int) -> str:
        """Create the step's record unless another writer already did; returns its name."""
        from kubernetes.client.exceptions import ApiException

        body = build_record(self.namespace, self.policy, step, self.writers)
        if step in self._ensured:
            return str(body["metadata"]["name"])
        try:
            self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                     CHECKPOINTS, body)
        except ApiException as error:
            if error.status != 409:
                raise
        self._ensured.add(step)
        return str(body["metadata"]["name"])

    def report(self, step: int, state: str, size_bytes: int, tiers: Iterable[str],
               now: datetime, node: str | None = None, message: str | None = None,
               requests: dict[str, int] | None = None,
               peer_holder: int | None = None, peer_node: str | None = None) -> None:
        name = self.ensure(step)
        patch = writer_patch(self.writer_id, state, size_bytes, tiers, now, node, message,
                             peer_holder=peer_holder, peer_node=peer_node, requests=requests)
        self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, CHECKPOINTS, name, patch,
            _content_type="application/merge-patch+json")


def annotate_own_pod(namespace: str, pod: str, key: str, value: str, api: Any = None) -> bool:
    """One best-effort annotation on this pod (restore's record of what it placed)."""
    return annotate_own_pod_with(namespace, pod, {key: value}, api)


def annotate_own_pod_with(namespace: str, pod: str, annotations: dict[str, str],
                          api: Any = None) -> bool:
    """Best-effort annotations on this pod, in one patch."""
    try:
        if api is None:
            api = kubeclient.core_api()
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
                 node: str | None = None) -> None:
        self.api = api if api is not None else kubeclient.custom_objects_api()
        self.namespace, self.name = namespace, lease_name(policy, writer)
        self.holder, self.seconds, self.clock = holder, seconds, clock
        self.monotonic = monotonic
        #: Monotonic time of the last successful take or renewal: a held lease
        #: is only trusted while that is fresh (lease.renewal_fresh).
        self._renewed_at: float | None = None
        self._watch = ExpiryWatch()
        #: This pod's node (written on the lease, so a taker can tell when it is gone).
        self.node = node or None
        self._node_watches: dict[str, ExpiryWatch] = {}
        self._node_checks = True
        self.enabled = True
        self.held = False
        self.other: str | None = None
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
        if not may_take(spec, self.holder, self._watch.unchanged_for(lease, self.monotonic())):
            if not self._holder_node_gone(lease):
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
        """The lease's metadata with this pod's node as the holder's."""
        annotations = dict(metadata.get("annotations") or {})
        annotations.pop(ANNOTATION_HOLDER_NODE, None)
        if self.node:
            annotations[ANNOTATION_HOLDER_NODE] = self.node
        metadata["annotations"] = annotations
        return metadata

    def _holder_node_gone(self, lease: dict[str, Any]) -> bool:
        """The holder's node lease deleted, or seen unchanged by this process
        for NODE_DEAD_S: its kubelet, and so the holder, are gone. Anything
        uncertain (no node on the lease, this very node, no rights) is no."""
        from kubernetes.client.exceptions import ApiException

        node = ((lease.get("metadata") or {}).get("annotations") or {}).get(
            ANNOTATION_HOLDER_NODE)
        if not node or node == self.node or not self._node_checks:
            return False
        try:
            found = self.api.get_namespaced_custom_object(
                *LEASE_API, NODE_LEASE_NAMESPACE, LEASE_PLURAL, node, _request_timeout=5)
        except ApiException as error:
            if error.status == 404:
                return True
            if error.status == 403:
                self._node_checks = False
                log.warning("writer lease: no right to read node leases (%s); a lost "
                            "holder frees its writer only after %ss", error.reason,
                            self.seconds)
            return False
        watch = self._node_watches.setdefault(node, ExpiryWatch())
        return watch.unchanged_for(found, self.monotonic()) > NODE_DEAD_S

    def renew(self) -> bool:
        """Take or renew the lease now; True when this pod holds it (or fencing is off)."""
        from kubernetes.client.exceptions import ApiException

        if not self.enabled:
            return True
        try:
            self.held = self._take_or_renew(self.clock())
            if self.held:
                self.other = None
                self._renewed_at = self.monotonic()
        except ApiException as error:
            if error.status == 403:
                self.enabled = False
                log.warning("writer fencing off: no rights on leases in %s (%s)",
                            self.namespace, error.reason)
                return True
            if error.status == 409:  # another taker won the race for the lease
                self.held, self._mine = False, None
                return False
            log.warning("could not renew writer lease %s: %s", self.name, error.reason)
        except Exception as error:  # unreachable apiserver: keep the last answer a while
            log.warning("could not renew writer lease %s: %s", self.name, error)
        # Past the margin another pod may have taken it: not held any more.
        return self.held and renewal_fresh(self._renewed_at, self.monotonic(), self.seconds)

    def check(self) -> None:
        """Before a commit: renew (unless the last renewal is recent enough to
        vouch for the lease on its own), and raise WriterFenced if another pod
        holds it."""
        if self.enabled and self.held and recently_renewed(
                self._renewed_at, self.monotonic(), self.seconds) and self._still_mine():
            return
        if not self.renew():
            if self.held:  # ours when last heard, but not renewed for too long
                raise WriterFenced(
                    f"writer lease {self.namespace}/{self.name} could not be renewed for "
                    f"over {self.seconds * 2 // 3}s (apiserver unreachable?): another pod may "
                    "hold it by now; not committing until a renewal succeeds")
            raise WriterFenced(
                f"writer lease {self.namespace}/{self.name} is held by pod uid {self.other}: "
                "another live pod writes as this writer; not committing (the policy's "
                "WritersConsistent condition names both pods)")

    def _still_mine(self) -> bool:
        """A read, not a write: the lease still names this pod. (A taker may
        act before the duration ends when it judges this pod's node gone, e.g.
        its kubelet dead while this agent still runs: the read catches it.)
        An unreachable apiserver is no evidence of another holder."""
        try:
            found = self._call("get", self.name)
        except Exception as error:
            if getattr(error, "status", None) == 404:  # deleted: take it again
                self.held, self._mine = False, None
                return False
            log.warning("could not read writer lease %s: %s", self.name,
                        getattr(error, "reason", error))
            return True
        holder = (found.get("spec") or {}).get("holderIdentity")
        if holder == self.holder:
            self._mine = dict(found)
            return True
        self.held, self._mine, self.other = False, None, str(holder)
        return False

    def start(self) -> None:
        """Renew every third of the lease's duration until `stop()`; while
        another pod holds it, look every 10 s (so a lost holder's node is
        noticed within about NODE_DEAD_S)."""
        def loop() -> None:
            while not self._stop.is_set():
                held = self.renew()
                self._stop.wait(self.seconds / 3 if held else min(self.seconds / 3, 10.0))
        threading.Thread(target=loop, name="writer-lease", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Stop renewing and free the lease if this pod still holds it, so a
        replacement commits at once instead of a lease duration later."""
        self.stop()
        if not self.enabled or not self.held:
            return
        try:
            lease = self._call("get", self.name)
            if (lease.get("spec") or {}).get("holderIdentity") == self.holder:
                lease["spec"] = {"leaseDurationSeconds": self.seconds}
                self._call("replace", self.name, lease)
            self.held, self._mine = False, None
        except Exception as error:  # it expires by itself
            log.warning("could not release writer lease %s: %s", self.name, error)
