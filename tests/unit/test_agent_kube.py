"""The agent's Kubernetes edge with recording fake APIs: records and pending bytes,
never blocking and never raising into the agent."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from test_node_kube import FakeCore  # the node side's pod-patch fake, shared

from ckptdrain.agent.kube import PendingBytesPublisher, RecordReporter, pending_changed
from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.node.kube import RecordWriter


class FakeCustomObjects:
    """Records as the apiserver keeps them: a claim on a record that does not
    exist is a 404, a second create a 409."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.calls = 0

    def create_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str,
                                        body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException
        self.calls += 1
        if any(b["metadata"]["name"] == body["metadata"]["name"] for b in self.created):
            raise ApiException(status=409)
        self.created.append(body)

    def patch_namespaced_custom_object_status(self, group: str, version: str, ns: str,
                                              plural: str, name: str, patch: dict[str, Any],
                                              **_: Any) -> None:
        from kubernetes.client.exceptions import ApiException
        self.calls += 1
        if not any(b["metadata"]["name"] == name for b in self.created):
            raise ApiException(status=404)
        self.patches.append((name, patch))


def _drain(reporter: RecordReporter) -> None:
    reporter.close(timeout=5)


def test_each_state_becomes_this_writers_claim_on_the_steps_record() -> None:
    api = FakeCustomObjects()
    reporter = RecordReporter(RecordWriter("ns", "train", 2, "1", api=api), "node-a",
                              is_global=lambda step: step == 7)
    reporter.report(CheckpointEvent(7, State.LOCAL, 100, 0.5))
    reporter.report(CheckpointEvent(7, State.GLOBAL, 100, 2.0))
    reporter.report(CheckpointEvent(8, State.FAILED, message="drain: denied"))
    _drain(reporter)
    assert [b["spec"]["step"] for b in api.created] == [7, 8]
    claims = [(name, patch["status"]["writers"]["1"]) for name, patch in api.patches]
    assert [c["state"] for _, c in claims] == ["Local", "Global", "Failed"]
    assert claims[0][1]["tiers"] == ["global", "local"]  # is_global(7) per the tier
    assert claims[2][1]["tiers"] == ["local"] and claims[2][1]["message"] == "drain: denied"
    assert claims[0][1]["node"] == "node-a" and claims[0][1]["bytes"] == 100


def test_a_failing_api_server_never_raises_into_the_agent() -> None:
    class Broken(FakeCustomObjects):
        def create_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionError("apiserver down")

    reporter = RecordReporter(RecordWriter("ns", "train", 1, "0", api=Broken()), None)
    # More than the queue holds: the oldest are dropped; report() returns every time.
    for step in range(1000):
        reporter.report(CheckpointEvent(step, State.LOCAL))
    _drain(reporter)


def test_pending_bytes_are_published_only_when_a_drain_starts_or_ends() -> None:
    core = FakeCore()
    publisher = PendingBytesPublisher("ns", "pod-0", api=core)
    assert publisher.publish(1000)
    assert not publisher.publish(1050)
    assert not publisher.publish(500)  # draining on: no write, however far it moved
    assert publisher.publish(0)
    assert not publisher.publish(0)
    assert publisher.publish(7)
    values = [p["metadata"]["annotations"]["ckptdrain.io/pending-bytes"] for p in core.patches]
    assert values == ["1000", "0", "7"]
    assert pending_changed(None, 0) and pending_changed(0, 1) and not pending_changed(0, 0)


def test_pending_bytes_failure_is_logged_and_retried_next_time() -> None:
    core = FakeCore(fail=True)
    publisher = PendingBytesPublisher("ns", "pod-0", api=core)
    assert not publisher.publish(10)
    core.fail = False
    assert publisher.publish(10)


def test_a_step_its_partner_holds_is_claimed_in_the_peer_tier() -> None:
    api = FakeCustomObjects()
    reporter = RecordReporter(RecordWriter("ns", "train", 2, "1", api=api), "node-a",
                              is_global=lambda step: step == 7,
                              peer_holder=lambda step: (0, "node-b") if step >= 7 else None)
    reporter.report(CheckpointEvent(7, State.GLOBAL, 100, 2.0))
    reporter.report(CheckpointEvent(9, State.LOCAL, 100, message="copy held by the partner"))
    reporter.report(CheckpointEvent(6, State.LOCAL, 100))
    _drain(reporter)
    tiers = [patch["status"]["writers"]["1"]["tiers"] for _, patch in api.patches]
    assert tiers == [["global", "local", "peer"], ["local", "peer"], ["local"]]
    # The claim names the holder, so a copy the previous holder confirmed does
    # not count for the new one (operator/peer_placement.py).
    holders = [patch["status"]["writers"]["1"].get("peerHolder") for _, patch in api.patches]
    assert holders == [0, 0, None]
    assert [patch["status"]["writers"]["1"].get("peerNode") for _, patch in api.patches] == [
        "node-b", "node-b", None]


def test_a_claim_on_an_existing_record_is_one_write() -> None:
    api = FakeCustomObjects()
    first, second = (RecordWriter("ns", "train", 2, w, api=api) for w in ("0", "1"))
    now = datetime.now(UTC)
    first.report(5, "Local", 10, ["local"], now)  # the claim (404), the create, the claim
    assert api.calls == 3
    second.report(5, "Local", 10, ["local"], now)  # the record is there: one patch
    second.report(5, "Global", 10, ["global", "local"], now)
    assert api.calls == 5 and len(api.created) == 1
