"""The Kueue checks' edge without a cluster: what a parsed policy gives the
checks (its restore estimate from sizing, its placement, the injected
requests per QoS shape), and Kueue's ConfigMap read once per CONFIG_S, a
refusal said once and left "not known"."""

from __future__ import annotations

import logging
from fractions import Fraction
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator import config
from ckptdrain.operator.kueue import reads, report
from ckptdrain.operator.kueue.settings import WaitForPodsReady
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")


def parsed(**over: Any) -> policy.Policy:
    base: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "overlap": "10%", "writers": 8,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://bucket/runs"}}
    base.update(over)
    return policy.parse("ml", "p", base, CFG)


def test_facts_from_the_policy_and_its_sizing() -> None:
    facts = report.facts_of(parsed(restore={"retryDeadline": "3m"}, placement={
        "nodeAffinity": {"matchExpressions": [{"key": "nvme", "operator": "Exists"}]}}))
    assert facts.retry_deadline_s == 180.0
    # No cap: the drain gets what its interval needs, 10% of 15m: 90 s.
    assert facts.restore_s == pytest.approx(90.0)
    assert "80.0 GB" in facts.restore_basis and "no cap set" in facts.restore_basis
    assert facts.placement_terms == [{"matchExpressions": [
        {"key": "nvme", "operator": "Exists"}]}]
    assert list(facts.injected_names) == ["ckptdrain-agent"]
    assert facts.injected == {"cpu": Fraction(1, 10), "memory": Fraction(256 * 2**20)}
    assert facts.injected_guaranteed == {"cpu": Fraction(1), "memory": Fraction(2**30)}


def test_a_policy_cap_sets_the_restore_estimate_and_the_peer_sidecar_counts() -> None:
    facts = report.facts_of(parsed(caps={"bandwidth": "500MB/s"}, peerTier={"enabled": True}))
    assert facts.restore_s == pytest.approx(160.0)  # 80GB at 500MB/s: the cap binds
    assert "policy cap" in facts.restore_basis
    assert list(facts.injected_names) == ["ckptdrain-agent", "ckptdrain-peer"]
    assert facts.injected["cpu"] == Fraction(2, 10)
    assert report.facts_of(parsed()).placement_terms == []


def test_the_class_nodeselector_is_a_fact() -> None:
    [cls] = classes.catalogue([{"metadata": {"name": "fast"}, "spec": {"nodeTier": {
        "root": "/mnt/ckptdrain", "nodeSelector": {"pool": "nvme"}}}}]).values()
    assert isinstance(cls, classes.CheckpointClass)
    facts = report.facts_of(parsed(), None, cls)
    assert facts.class_selector == {"pool": "nvme"} and facts.class_name == "fast"
    assert report.facts_of(parsed()).class_selector == {}


class ConfigMaps:
    def __init__(self) -> None:
        self.reads = 0
        self.answer: Any = None

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> Any:
        self.reads += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Data:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = data


@pytest.fixture
def configmaps(monkeypatch: pytest.MonkeyPatch) -> ConfigMaps:
    fake = ConfigMaps()
    monkeypatch.setattr(reads.client, "CoreV1Api", lambda *_: fake)
    monkeypatch.setattr(reads.kube, "_api", lambda: None)
    reads.forget()
    return fake


def test_kueues_configmap_is_read_once_per_period(configmaps: ConfigMaps,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    configmaps.answer = Data({"controller_manager_config.yaml":
                              "waitForPodsReady: {enable: true, timeout: 2m}"})
    clock = [1000.0]
    monkeypatch.setattr(reads.time, "monotonic", lambda: clock[0])
    assert reads.wait_for_pods_ready("kq/cm") == (WaitForPodsReady(True, 120.0), "")
    clock[0] += reads.CONFIG_S - 1
    reads.wait_for_pods_ready("kq/cm")
    assert configmaps.reads == 1
    clock[0] += 2
    reads.wait_for_pods_ready("kq/cm")
    assert configmaps.reads == 2


def test_a_refusal_is_not_known_and_said_once(configmaps: ConfigMaps,
                                              monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    configmaps.answer = ApiException(status=403, reason="Forbidden")
    clock = [1000.0]
    monkeypatch.setattr(reads.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger=reads.__name__):
        for _ in range(3):
            found, why = reads.wait_for_pods_ready("kq/cm")
            clock[0] += reads.CONFIG_S + 1
    assert found is None and "ConfigMap kq/cm could not be read (403 Forbidden)" in why
    assert configmaps.reads == 3
    assert len([r for r in caplog.records if "not known" in r.getMessage()]) == 1


def test_not_configured_reads_nothing(configmaps: ConfigMaps) -> None:
    found, why = reads.wait_for_pods_ready("")
    assert found is None and "kueue.configMap unset" in why and configmaps.reads == 0


def test_a_configuration_it_cannot_read_says_which_field(configmaps: ConfigMaps) -> None:
    configmaps.answer = Data({"controller_manager_config.yaml":
                              "waitForPodsReady: {enable: true, timeout: soon}"})
    found, why = reads.wait_for_pods_ready("kq/cm")
    assert found is None and "waitForPodsReady.timeout" in why


def test_a_deleted_policys_gauges_go() -> None:
    report._gauge(("ml", "gone"), [report.conflicts.Conflict(report.conflicts.QUOTA, "q")])
    assert report.CONFLICTS.labels("ml", "gone", report.conflicts.QUOTA)._value.get() == 1
    report.checkpointpolicy_kueue_event(event={"type": "DELETED"}, namespace="ml",
                                        name="gone")
    names = {tuple(s.labels.values()) for m in report.CONFLICTS.collect() for s in m.samples}
    assert ("ml", "gone", report.conflicts.QUOTA) not in names


def test_flavours_not_asked_for_within_their_period_are_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Flavors:
        def get_cluster_custom_object(self, group: str, version: str, plural: str,
                                      name: str, **_: Any) -> dict[str, Any]:
            return {"spec": {"nodeLabels": {"pool": name}}}

    monkeypatch.setattr(reads.kube, "_custom", Flavors)
    clock = [1000.0]
    monkeypatch.setattr(reads.time, "monotonic", lambda: clock[0])
    reads.forget()
    for i in range(50):  # flavours made and deleted over hours
        assert reads.flavor_labels("kueue.x-k8s.io/v1beta1", f"f{i}") == {"pool": f"f{i}"}
        clock[0] += reads.FLAVOR_S / 2
    assert sorted(reads._flavors) == ["f48", "f49"]
    reads.forget()


def test_events_posted_are_kept_only_for_the_policys_workloads_in_conflict_now(
        monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[str] = []
    monkeypatch.setattr(report.kube, "post_event",
                        lambda body, kind, reason, message, **_: posted.append(
                            body["metadata"]["name"]))
    report.forget()
    key = ("ml", "p")
    for i in range(30):  # one Workload after another, each in conflict once
        owner = report.owners.Owner("kueue.x-k8s.io/v1beta1", "Workload", "workloads",
                                    f"w{i}", f"u{i}")
        found = [report.conflicts.Conflict(report.conflicts.QUOTA, "q", f"w{i}")]
        report._post_events(key, {owner.uid: owner}, found, logging.getLogger("t"))
        report._post_events(key, {owner.uid: owner}, found, logging.getLogger("t"))
    assert posted == [f"w{i}" for i in range(30)]  # once each
    assert report._posted[key] == {("u29", report.conflicts.QUOTA)}
    report.forget()
