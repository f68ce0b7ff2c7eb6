"""The driver's free-space report (csi/capacity_report.py): the object's
shape and name, when it is written again, and the publisher's writes and
failures (csi/capacity_publisher.py) against a fake StorageV1Api."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from ckptdrain.contract.csi import CAPACITY_STALE_PERIODS
from ckptdrain.csi.capacity_publisher import CapacityPublisher
from ckptdrain.csi.capacity_report import Written, build, due, object_name, refresh_period
from ckptdrain.csi.usage import Capacity

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
GIB = 2**30
DRIVER = "node.ckptdrain.io"
DRIVER_HASH = "bbad08"  # the first characters of the driver name's SHA-256
DISK = Capacity(available_bytes=40 * GIB, total_bytes=100 * GIB, available_inodes=1,
                total_inodes=2)


def test_the_report_of_a_node_says_its_free_space_and_where() -> None:
    report = build("gpu-7.example.com", "node.ckptdrain.io", "ckptdrain", DISK, 1_700_000_000,
                   600)
    assert report == {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
        "metadata": {"name": f"node-tier-{DRIVER_HASH}-gpu-7.example.com",
                     "namespace": "ckptdrain",
                     "labels": {"ckptdrain.io/csi-driver": "node.ckptdrain.io"},
                     "annotations": {"ckptdrain.io/node": "gpu-7.example.com",
                                     "ckptdrain.io/measured-at": "2023-11-14T22:13:20Z",
                                     "ckptdrain.io/refresh-seconds": "600"}},
        "storageClassName": "ckptdrain-node-tier",
        "capacity": str(40 * GIB), "maximumVolumeSize": str(40 * GIB),
        "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": "gpu-7.example.com"}}}


def test_a_node_name_too_long_for_a_label_gets_no_topology_but_its_full_name() -> None:
    node = "n" * 64 + ".example.com"
    report = build(node, "node.ckptdrain.io", "ckptdrain", DISK, 0, 600)
    assert "nodeTopology" not in report
    assert report["metadata"]["annotations"]["ckptdrain.io/node"] == node


def test_the_report_is_owned_by_the_drivers_pod_when_it_is_named() -> None:
    """Garbage-collected with the pod: a removed node's, an uninstalled
    release's report goes with its driver."""
    owner = ("ckptdrain-csi-node-x7k2p", "5f0c6d2e-8f3a-4b1e-9c1a-1b2c3d4e5f60")
    report = build("gpu-7", DRIVER, "ckptdrain", DISK, 0, 600, owner=owner)
    assert report["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": owner[0], "uid": owner[1]}]
    assert "ownerReferences" not in build("gpu-7", DRIVER, "ckptdrain", DISK, 0, 600)["metadata"]


@given(st.text(min_size=1, max_size=253))
def test_every_node_name_makes_a_valid_name(node: str) -> None:
    name = object_name(node, DRIVER)
    assert len(name) <= 253 and SUBDOMAIN.fullmatch(name), name
    assert name.startswith(f"node-tier-{DRIVER_HASH}-")


def test_a_253_character_node_name_is_shortened_readably_and_kept_apart() -> None:
    node = ("a" * 60 + ".") * 4 + "b" * 9
    assert len(node) == 253
    name = object_name(node, DRIVER)
    assert len(name) <= 253 and name.startswith(f"node-tier-{DRIVER_HASH}-aaaa")
    # Two nodes the cut would make alike keep two reports.
    assert object_name(node[:-1] + "c", DRIVER) != name


def test_two_names_the_cleaning_makes_alike_stay_apart() -> None:
    assert object_name("Node_A", DRIVER) != object_name("node-a", DRIVER)
    assert object_name("node-a", DRIVER) == f"node-tier-{DRIVER_HASH}-node-a"


def test_two_drivers_in_one_namespace_keep_two_reports_of_a_node() -> None:
    """Two releases in one namespace: neither overwrites the other's."""
    assert object_name("node-a", "a.ckptdrain.io") != object_name("node-a", "b.ckptdrain.io")


def test_the_refresh_period_is_ten_scans_at_most_an_hour_and_at_least_two() -> None:
    assert refresh_period(60) == 600
    assert refresh_period(0.5) == 5
    assert refresh_period(360) == 3600
    assert refresh_period(1800) == 3600
    # A slower scan: the period grows with it, or a live report (written
    # only after a scan) would look stale between two.
    assert refresh_period(3600) == 7200


@given(st.floats(0.001, 10 * 86400))
def test_a_live_report_is_never_older_than_two_refresh_periods(interval: float) -> None:
    """Written within refresh + one scan of the last write: inside the two
    periods a reader allows (contract/csi.py)."""
    assert refresh_period(interval) + interval <= CAPACITY_STALE_PERIODS * refresh_period(interval)


def free(available: int) -> Capacity:
    return Capacity(available, 100 * GIB, 1, 2)


def test_a_report_is_written_first_then_on_a_move_of_a_percent_or_a_refresh() -> None:
    assert due(None, free(40 * GIB), 0, 600)
    last = Written(40 * GIB, 1000)
    # Less than 1% of the 100 GiB disk: not worth a write.
    assert not due(last, free(40 * GIB - GIB + 1), 1001, 600)
    assert not due(last, free(40 * GIB + GIB - 1), 1599, 600)
    # Exactly 1% either way, or a refresh period old: written.
    assert due(last, free(39 * GIB), 1001, 600)
    assert due(last, free(41 * GIB), 1001, 600)
    assert due(last, free(40 * GIB), 1600, 600)


@dataclass
class FakeStorage:
    """The three calls the publisher makes, on one stored object; `fail`:
    the errors to raise, in order, before answering."""

    stored: dict[str, Any] | None = None
    fail: list[Exception] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    version: int = 0
    #: Which call the errors are raised by (None: the next, whichever).
    fail_at: str | None = None

    def _maybe_fail(self, call: str) -> None:
        self.calls.append(call)
        if self.fail and self.fail_at in (None, call):
            raise self.fail.pop(0)

    def read_namespaced_csi_storage_capacity(self, name: str, namespace: str,
                                             **_: Any) -> Any:
        self._maybe_fail("get")
        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(metadata=SimpleNamespace(
            resource_version=str(self.version), labels=self.stored["metadata"].get("labels")))

    def create_namespaced_csi_storage_capacity(self, namespace: str, body: dict[str, Any],
                                               **_: Any) -> None:
        self._maybe_fail("create")
        self.stored, self.version = body, self.version + 1

    def replace_namespaced_csi_storage_capacity(self, name: str, namespace: str,
                                                body: dict[str, Any], **_: Any) -> None:
        self._maybe_fail("update")
        assert body["metadata"]["resourceVersion"] == str(self.version)
        self.stored, self.version = body, self.version + 1


def scanned(available: int) -> Any:
    return SimpleNamespace(capacity=free(available))


def publisher(api: FakeStorage, now: list[float]) -> CapacityPublisher:
    return CapacityPublisher(api, "ckptdrain", "node-a", "node.ckptdrain.io", 600,
                             clock=lambda: now[0])


def test_the_publisher_creates_then_updates_only_when_due() -> None:
    api, now = FakeStorage(), [1000.0]
    publish = publisher(api, now)
    publish(scanned(40 * GIB))
    assert api.calls == ["get", "create"]
    assert api.stored is not None and api.stored["capacity"] == str(40 * GIB)
    now[0] += 60
    publish(scanned(40 * GIB))  # the first write made sure of once more
    assert api.calls == ["get", "create", "get", "update"]
    now[0] += 60
    publish(scanned(40 * GIB + 100))  # moved a little: nothing written
    assert len(api.calls) == 4
    publish(scanned(30 * GIB))
    assert api.calls[4:] == ["get", "update"]
    assert api.stored["capacity"] == str(30 * GIB)
    publish(SimpleNamespace(capacity=None))  # the root not there: nothing said
    assert len(api.calls) == 6


def test_a_first_report_the_collector_deleted_comes_back_at_the_next_scan() -> None:
    """A driver replacing its old self on the node writes (or replaces) the
    report while it is still owned by the old Pod, which the garbage
    collector may delete with it: written once more at the next scan, it
    comes back then, not a refresh period later."""
    api, now = FakeStorage(), [1000.0]
    publish = publisher(api, now)
    publish(scanned(40 * GIB))
    api.stored = None  # the garbage collector, after the old Pod
    now[0] += 60
    publish(scanned(40 * GIB))
    assert api.calls == ["get", "create", "get", "create"]
    assert api.stored is not None
    now[0] += 60
    publish(scanned(40 * GIB))  # once only: due as ever after that
    assert len(api.calls) == 4


def test_a_conflict_is_tried_once_more() -> None:
    api, now = FakeStorage(), [1000.0]
    api.fail, api.fail_at = [ApiException(status=409, reason="Conflict")], "create"
    publisher(api, now)(scanned(40 * GIB))
    assert api.calls == ["get", "create", "get", "create"]
    assert api.stored is not None
    api.fail, api.fail_at = [ApiException(status=409, reason="Conflict")], "update"
    now[0] += 600
    publisher(api, now)(scanned(40 * GIB))
    assert api.calls[4:] == ["get", "update", "get", "update"]


def test_an_object_labelled_for_another_driver_is_left_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    api, now = FakeStorage(), [1000.0]
    theirs = build("node-a", "other.example.com", "ckptdrain", DISK, 900, 600)
    api.stored = theirs
    with caplog.at_level(logging.INFO, "ckptdrain.csi.capacity_publisher"):
        publisher(api, now)(scanned(40 * GIB))
    assert api.calls == ["get"] and api.stored is theirs
    assert "other.example.com" in caplog.text


def test_failures_are_logged_once_per_change_and_never_raise(
        caplog: pytest.LogCaptureFixture) -> None:
    api, now = FakeStorage(), [1000.0]
    publish = publisher(api, now)
    forbidden = ApiException(status=403, reason="Forbidden")
    api.fail = [forbidden, forbidden, ConnectionRefusedError("no apiserver")]
    with caplog.at_level(logging.INFO, "ckptdrain.csi.capacity_publisher"):
        publish(scanned(40 * GIB))
        publish(scanned(40 * GIB))  # the same error: not said again
        publish(scanned(40 * GIB))  # another: said
        publish(scanned(40 * GIB))  # written: said it works again
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3, said
    assert "HTTP 403 Forbidden" in said[0] and f"node-tier-{DRIVER_HASH}-node-a" in said[0]
    assert "no apiserver" in said[1]
    assert (f"published as CSIStorageCapacity ckptdrain/node-tier-{DRIVER_HASH}-node-a again"
            in said[2])
    # A failed write is tried again at the next scan, not after a refresh.
    assert api.stored is not None


def test_one_write_is_one_try_bounded_by_its_timeout() -> None:
    """urllib3 retries a failed connection three times by default: each try
    would get the whole timeout, and the scan waits for all of them."""
    from kubernetes import client

    from ckptdrain.csi.policies import storage_api

    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"
    shared = client.CustomObjectsApi(client.ApiClient(configuration))
    storage = storage_api(shared)
    retries = storage.api_client.rest_client.pool_manager.connection_pool_kw.get("retries")
    assert retries is not None and retries.total == 0, retries
    assert shared.api_client.configuration.retries is None  # the policy reads keep theirs


def test_a_refusal_logs_the_apiservers_reason_on_one_bounded_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """A 403 from the chart's admission policy says which field was wrong:
    the log carries that sentence, not only 'Forbidden'."""
    api, now = FakeStorage(), [1000.0]
    refused = ApiException(status=403, reason="Forbidden")
    reason = ("metadata.annotations[ckptdrain.io/node]: expected 'node-a', the node the "
              "writer's token is bound to,\ngot 'node-b'")
    refused.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden",
                               "message": f"denied request: {reason}" + " x" * 500})
    api.fail = [refused]
    with caplog.at_level(logging.INFO, "ckptdrain.csi.capacity_publisher"):
        publisher(api, now)(scanned(40 * GIB))
    [said] = [r.getMessage() for r in caplog.records]
    assert "HTTP 403 Forbidden" in said
    assert "denied request: metadata.annotations[ckptdrain.io/node]: expected 'node-a', the " \
           "node the writer's token is bound to, got 'node-b'" in said, said
    assert "\n" not in said and len(said) < 800, said  # the reason cut to 600
