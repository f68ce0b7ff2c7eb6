"""Writes the node's free space to the apiserver after a scan, as
capacity_report.py shapes it and decides when: a thin edge. A failed write
is logged once per change of error and tried again after the next scan;
it never stops the scan (the driver's RBAC: get, create and update on
csistoragecapacities in its own namespace, nothing else).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ckptdrain import kube_rest
from ckptdrain.contract.csi import CAPACITY_LABEL_DRIVER
from ckptdrain.csi import capacity_report, policies
from ckptdrain.csi.capacity_report import Written

log = logging.getLogger(__name__)


class ForeignReport(ValueError):
    """The object by this name is another driver's: never replaced."""


#: How long one request may take: a scan waits for it.
REQUEST_TIMEOUT_S = 10
#: The most of the apiserver's reason a failure's log line carries: enough
#: for an admission policy's refusal (which names the field and both nodes),
#: not a whole page.
REASON_CHARS = 600


class CapacityPublisher:
    """Publishes one node's report through `api`, a kubernetes StorageV1Api."""

    def __init__(self, api: Any, namespace: str, node: str, driver: str, refresh_s: float,
                 clock: Callable[[], float] = time.time,
                 owner: tuple[str, str] | None = None) -> None:
        self.api, self.namespace, self.node, self.driver = api, namespace, node, driver
        self.owner = owner
        self.refresh_s, self.clock = refresh_s, clock
        self.name = capacity_report.object_name(node, driver)
        self.last: Written | None = None
        # The first write is made again at the next scan: written while the
        # object may still be owned by this node's previous driver Pod, the
        # garbage collector may delete it with that Pod just after.
        self._again = False
        self._last_error: str | None = None

    def __call__(self, report: Any) -> None:
        """After a scan (`report`: its ScanReport): write when due."""
        free = report.capacity
        if free is None:
            return  # the root was not there to measure
        now = self.clock()
        if not self._again and not capacity_report.due(self.last, free, now, self.refresh_s):
            return
        body = capacity_report.build(self.node, self.driver, self.namespace, free, now,
                                     self.refresh_s, self.owner)
        try:
            self._write(body)
        except (*policies.api_errors(), OSError, ValueError) as err:
            # Never stops the scan; said once per change of error.
            said = _what_went_wrong(err)
            if said != self._last_error:
                log.warning("free space not published as CSIStorageCapacity %s/%s (%s); "
                            "tried again after each scan", self.namespace, self.name, said)
                self._last_error = said
            return
        if self._last_error is not None:
            log.info("free space published as CSIStorageCapacity %s/%s again",
                     self.namespace, self.name)
            self._last_error = None
        self._again = self.last is None
        self.last = Written(free.available_bytes, now)

    def _write(self, body: dict[str, Any]) -> None:
        """Create or replace the report; a conflict (another write between
        our read and ours: a driver restarted beside its old self) is tried
        once more from a fresh read."""
        for attempt in (1, 2):
            try:
                self._create_or_replace(body)
                return
            except policies.api_errors() as err:
                if policies.status_of(err) != 409 or attempt == 2:
                    raise

    def _create_or_replace(self, body: dict[str, Any]) -> None:
        try:
            found = self.api.read_namespaced_csi_storage_capacity(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S)
        except policies.api_errors() as err:
            if policies.status_of(err) != 404:
                raise
            self.api.create_namespaced_csi_storage_capacity(
                self.namespace, body, _request_timeout=REQUEST_TIMEOUT_S)
            return
        owner = (found.metadata.labels or {}).get(CAPACITY_LABEL_DRIVER)
        if owner != self.driver:
            raise ForeignReport(f"the object is labelled for CSI driver {owner!r}, not "
                                f"{self.driver!r}: left alone")
        replaced = {**body, "metadata": {**body["metadata"],
                                         "resourceVersion": found.metadata.resource_version}}
        self.api.replace_namespaced_csi_storage_capacity(
            self.name, self.namespace, replaced, _request_timeout=REQUEST_TIMEOUT_S)


def _what_went_wrong(err: BaseException) -> str:
    """One line on a failed write: the HTTP status, and the apiserver's own
    reason when its answer carries one (the chart's admission policy says
    there which field named which node), shortened."""
    status = policies.status_of(err)
    if status is None:
        return f"{type(err).__name__}: {err}"
    said = f"HTTP {status} {getattr(err, 'reason', '')}"
    reason = kube_rest.status_message(getattr(err, "body", None), limit=REASON_CHARS + 1)
    if not reason:
        return said
    reason = " ".join(reason.split())
    if len(reason) > REASON_CHARS:
        reason = reason[:REASON_CHARS - 3] + "..."
    return f"{said}: {reason}"
