"""The operator's metrics an alert uses: policy conditions as gauges (one
series per status), creation time, restores by tier, pods whose restore
fails; every series of a deleted policy or pod goes with it."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from ckptdrain.operator import metrics as m


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _policy(ns: str, name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name,
                         "creationTimestamp": "2026-01-02T03:04:05Z"},
            "status": {"conditions": [{"type": t, "status": s, "reason": "r"}
                                      for t, s in conditions]}}


def test_conditions_become_one_series_per_status() -> None:
    body = _policy("ml", "cond", ("Ready", "True"), ("BandwidthConstrained", "False"))
    m.observe_policy("ml", "cond", body, deleted=False)
    labels = {"namespace": "ml", "policy": "cond"}
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="True") == 1
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="False") == 0
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="Unknown") == 0
    assert value("ckptdrain_policy_condition", **labels, type="BandwidthConstrained",
                 status="False") == 1
    assert value("ckptdrain_policy_created_timestamp_seconds", **labels) == 1767323045.0
    # A flip moves the 1; a condition that went away takes its series along.
    m.observe_policy("ml", "cond", _policy("ml", "cond", ("Ready", "False")), deleted=False)
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="False") == 1
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="True") == 0
    assert value("ckptdrain_policy_condition", **labels, type="BandwidthConstrained",
                 status="False") is None
    m.observe_policy("ml", "cond", body, deleted=True)
    assert value("ckptdrain_policy_condition", **labels, type="Ready", status="False") is None
    assert value("ckptdrain_policy_created_timestamp_seconds", **labels) is None


def test_a_status_without_conditions_or_a_bad_timestamp_is_not_fatal() -> None:
    m.observe_policy("ml", "bare", {"metadata": {"creationTimestamp": "yesterday"}},
                     deleted=False)
    assert value("ckptdrain_policy_created_timestamp_seconds", namespace="ml",
                 policy="bare") is None
    m.observe_policy("ml", "bare", {}, deleted=True)


def test_restores_are_counted_by_tier() -> None:
    assert m.restore_tier("step=42 tier=local") == "local"
    assert m.restore_tier("step=42 tier=global") == "global"
    # Restore from a partner's copy (docs/peer-tier.md) is not a fresh start.
    assert m.restore_tier("step=42 tier=peer") == "peer"
    assert m.restore_tier("fresh") == "fresh"
    assert m.restore_tier("step=1 tier=../../x") == "fresh"  # never an unbounded label
    m.observe_restored("ml", "rst", "step=42 tier=local")
    m.observe_restored("ml", "rst", "step=43 tier=local")
    m.observe_restored("ml", "rst", "fresh")
    assert value("ckptdrain_restores_total", namespace="ml", policy="rst", tier="local") == 2
    assert value("ckptdrain_restores_total", namespace="ml", policy="rst", tier="fresh") == 1


def _status(**restore: Any) -> dict[str, Any]:
    return {"initContainerStatuses": [{"name": "ckptdrain-prepare",
                                       "state": {"terminated": {"exitCode": 0}}},
                                      {"name": "ckptdrain-restore", **restore}]}


def test_restore_failure_is_read_from_the_init_container_status() -> None:
    assert not m.restore_failed({})
    assert not m.restore_failed(_status(state={"running": {}}))
    assert not m.restore_failed(_status(state={"terminated": {"exitCode": 0}}))
    assert m.restore_failed(_status(state={"terminated": {"exitCode": 3}}))
    # Back-off between retries (restartPolicy OnFailure/Always): waiting after a failure.
    assert m.restore_failed(_status(state={"waiting": {"reason": "CrashLoopBackOff"}},
                                    lastState={"terminated": {"exitCode": 3}}))
    assert not m.restore_failed(_status(state={"waiting": {"reason": "PodInitializing"}}))


def test_failing_pods_are_counted_per_policy_and_cleared() -> None:
    failed = _status(state={"terminated": {"exitCode": 4}})
    m.observe_pod_restore("ml", "fail", "uid-1", failed, deleted=False)
    m.observe_pod_restore("ml", "fail", "uid-2", failed, deleted=False)
    m.observe_pod_restore("ml", "fail", "uid-2", failed, deleted=False)  # same pod again
    assert value("ckptdrain_restore_failing_pods", namespace="ml", policy="fail") == 2
    ok = _status(state={"terminated": {"exitCode": 0}})
    m.observe_pod_restore("ml", "fail", "uid-1", ok, deleted=False)
    assert value("ckptdrain_restore_failing_pods", namespace="ml", policy="fail") == 1
    m.observe_pod_restore("ml", "fail", "uid-2", failed, deleted=True)
    assert value("ckptdrain_restore_failing_pods", namespace="ml", policy="fail") == 0


def test_recovery_point_on_node_loss_has_a_series_only_while_there_is_one() -> None:
    labels = {"namespace": "ml", "policy": "nodeloss"}
    m.observe_node_loss("ml", "nodeloss", 40)
    assert value("ckptdrain_recovery_point_on_node_loss_step", **labels) == 40
    m.observe_node_loss("ml", "nodeloss", None)
    assert value("ckptdrain_recovery_point_on_node_loss_step", **labels) is None
    m.observe_node_loss("ml", "nodeloss", 50)
    m.observe_policy("ml", "nodeloss", _policy("ml", "nodeloss"), deleted=True)
    assert value("ckptdrain_recovery_point_on_node_loss_step", **labels) is None
