"""CheckpointClasses where policies and pods are judged, with the apiserver's
reads replaced: policy admission refuses what the class refuses; a pod's
admission injects under its class's root, image and store settings, or
treats a policy its class does not take as an invalid one; the operator's
status says ClassResolved; the process's view remakes the catalogue only
after a change."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st

REFUSE = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
FLAG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                             unselected_pods="Flag")
LOG = logging.getLogger("test")
NOW = datetime(2026, 11, 30, tzinfo=UTC)
STD = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
       "metadata": {"name": "std", "creationTimestamp": "2026-11-01T00:00:00Z",
                    "annotations": {classes.DEFAULT_ANNOTATION: "true"}},
       "spec": {"nodeTier": {"root": "/mnt/nvme"}, "agentImage": "ckptdrain:2.0",
                "stores": [{"uriPrefix": "s3://ckpt/{namespace}",
                            "endpoint": "http://minio:9000"}]}}


def policy(name: str = "llama", uri: str = "s3://ckpt/ml/runs", cls: str | None = "std",
           **spec: Any) -> dict[str, Any]:
    """A stored policy; `cls`: the class it was bound to when created (std,
    the default class here; None: created while there was no default)."""
    if cls is not None:
        spec = {"checkpointClassName": cls, **spec}
    return {"metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}}, "model": {"parameters": "7B"},
                     "interval": "10m", "localTier": {"path": "/mnt/nvme/n"},
                     "storage": {"uri": uri, "credentialsSecretRef": {"name": "s3"}}, **spec}}


def opted_in(app: str = "llama") -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": app, "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}],
                     "terminationGracePeriodSeconds": 3600}}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch,
            no_checkpoint_classes: class_view.ClassView) -> dict[str, Any]:
    state: dict[str, Any] = {"policies": []}
    monkeypatch.setattr(apiserver_reads, "list_policies",
                        lambda namespace, timeout=5: list(state["policies"]))
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a, **k: None)
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: [])
    no_checkpoint_classes.replace([STD], "1")
    return state


def admit_pod(cfg: config.OperatorConfig, warnings: list[str]) -> list[dict[str, Any]]:
    return asyncio.run(admission.admit_pod(opted_in(), "ml", cfg, warnings, LOG, None, None))


def test_a_pod_is_injected_under_its_default_class(cluster: dict[str, Any]) -> None:
    cluster["policies"] = [policy()]
    ops = admit_pod(REFUSE, [])
    text = str(ops)
    # The class's root (the operator's own, /mnt/ckptdrain, refuses the
    # path), its agent image, and its store's endpoint.
    assert "/mnt/nvme/n/ml/llama" in text
    assert "ckptdrain:2.0" in text and "ckptdrain:1.0" not in text
    assert "http://minio:9000" in text


def test_a_pod_of_a_policy_its_class_refuses_is_treated_as_of_an_invalid_policy(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [policy(uri="s3://elsewhere/runs")]
    with pytest.raises(admission.Refused) as refused:
        admit_pod(REFUSE, [])
    assert "spec.storage.uri" in str(refused.value) and "CheckpointClass std" in \
        str(refused.value)
    warnings: list[str] = []
    assert admit_pod(FLAG, warnings) == []
    assert warnings[0].startswith("ckptdrain: policy llama is invalid (CheckpointClass std")


def test_a_pod_of_a_policy_naming_a_missing_class_is_not_injected(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [policy(checkpointClassName="gone")]
    warnings: list[str] = []
    assert admit_pod(FLAG, warnings) == []
    assert "spec.checkpointClassName" in warnings[0] and "gone" in warnings[0]


def test_policy_admission_refuses_what_the_class_refuses_naming_field_and_class(
        cluster: dict[str, Any]) -> None:
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.admit_policy(policy(uri="s3://elsewhere/runs"), None, "ml",
                                              REFUSE))
    assert refused.value.code == 422
    assert "CheckpointClass std refuses this policy" in str(refused.value)
    assert "spec.storage.uri" in str(refused.value)
    with pytest.raises(admission.Refused, match=r"spec\.storage\.endpoint"):
        asyncio.run(policy_rules.admit_policy(
            policy(storage={"uri": "s3://ckpt/ml", "endpoint": "http://other:9000",
                            "credentialsSecretRef": {"name": "s3"}}), None, "ml", REFUSE))
    # Within the class: admitted, its root judged (the operator's would refuse).
    asyncio.run(policy_rules.admit_policy(policy(), None, "ml", REFUSE))


def test_policy_admission_refuses_a_missing_class(cluster: dict[str, Any]) -> None:
    with pytest.raises(admission.Refused, match=r"spec\.checkpointClassName.*gone"):
        asyncio.run(policy_rules.admit_policy(policy(checkpointClassName="gone"), None, "ml",
                                              REFUSE))


def test_policy_admission_says_when_classes_cannot_be_read(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    class_view.CLASSES.lost()

    def unreachable(*_: Any, **__: Any) -> Any:
        raise apiserver_reads.ApiError(503, "Service Unavailable")
    monkeypatch.setattr(apiserver_reads, "get_json", unreachable)
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.admit_policy(policy(), None, "ml", REFUSE))
    assert refused.value.code == 503 and "CheckpointClasses" in str(refused.value)


def test_without_the_class_crd_no_class_applies(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    class_view.CLASSES.lost()

    def no_crd(*_: Any, **__: Any) -> Any:
        raise apiserver_reads.ApiError(404, "Not Found")
    monkeypatch.setattr(apiserver_reads, "get_json", no_crd)
    # The operator's own root again: a path under it is admitted.
    own = policy(cls=None)
    own["spec"]["localTier"]["path"] = "/mnt/ckptdrain/n"
    asyncio.run(policy_rules.admit_policy(own, None, "ml", REFUSE))


def test_the_operator_says_class_resolved_in_status(cluster: dict[str, Any]) -> None:
    refused = policy(checkpointClassName="gone")
    condition = rebalance.class_condition(REFUSE, refused)
    with pytest.raises(classes.ClassUnresolved) as error:
        rebalance.parse_policy(REFUSE, refused, 1)
    status = st.for_invalid(str(error.value), 1, NOW, [], condition)
    found = {c["type"]: c for c in status["conditions"]}
    assert found["ClassResolved"]["status"] == "False"
    assert found["ClassResolved"]["reason"] == classes.NOT_FOUND
    assert "gone" in found["ClassResolved"]["message"]
    assert status["phase"] == "Invalid"
    # Fixed: True, the earlier False replaced, not kept beside it.
    fixed = rebalance.class_condition(REFUSE, policy())
    parsed = rebalance.parse_policy(REFUSE, policy(), 1)
    assert parsed.local_path == "/mnt/nvme/n" and parsed.endpoint == "http://minio:9000"
    sizing_status = st.for_sizing(pol.compute_sizing(parsed), 2, NOW,
                                  status["conditions"], class_resolved=fixed)
    [resolved] = [c for c in sizing_status["conditions"] if c["type"] == "ClassResolved"]
    assert (resolved["status"], resolved["reason"]) == ("True", classes.RESOLVED)
    assert resolved["observedGeneration"] == 2


def test_the_view_remakes_the_catalogue_only_after_a_change() -> None:
    view = class_view.ClassView()
    made: list[int] = []

    def make(bodies: list[dict[str, Any]]) -> int:
        made.append(len(bodies))
        return len(bodies)
    assert view.made(make) is None  # not current: callers list
    view.replace([STD], "1")
    assert view.made(make) == 1 and view.made(make) == 1
    assert made == [1]
    view.apply("DELETED", STD)
    assert view.made(make) == 0 and made == [1, 0]


def _hungry(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    """A policy wanting far more than the cluster cap (900 GB each 15 minutes)."""
    return {"metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "900GB"}, "interval": "15m",
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}, **spec}}


def test_a_class_weight_replaces_the_namespace_weight_under_the_cluster_cap(
        no_checkpoint_classes: class_view.ClassView) -> None:
    heavy = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
             "metadata": {"name": "heavy", "creationTimestamp": "2026-11-01T00:00:00Z"},
             "spec": {"nodeTier": {"root": "/mnt/ckptdrain"}, "bandwidthWeight": 4}}
    no_checkpoint_classes.replace([heavy], "1")
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=100e6,
                                bandwidth_weights=(("a", 9),))
    policies = {("a", "A"): [_hungry("a", "A", checkpointClassName="heavy")],
                ("b", "B"): [_hungry("b", "B")]}
    pods = {key: [object()] for key in policies}
    parts = {key: budget[1].budget for key, budget in
             rebalance.budgets(cfg, policies, pods).items()}  # type: ignore[arg-type]
    # The class's 4 against B's 1, not namespace a's 9.
    assert parts[("a", "A")] == pytest.approx(80e6)
    assert parts[("b", "B")] == pytest.approx(20e6)
    # The class gone: A is refused by its class (missing), and takes no part.
    no_checkpoint_classes.replace([], "2")
    assert set(rebalance.budgets(cfg, policies, pods)) == {("b", "B")}  # type: ignore[arg-type]


def test_a_class_event_reconciles_only_policies_whose_condition_it_changes(
        cluster: dict[str, Any]) -> None:
    from ckptdrain.operator import class_events

    fresh = policy()
    assert not class_events.stale(REFUSE, fresh)  # its own handler judges it first
    current = policy()
    current["status"] = {"conditions": [{"type": "ClassResolved", **{
        k: v for k, v in rebalance.class_condition(REFUSE, current).items() if k != "type"}}]}
    assert not class_events.stale(REFUSE, current)
    class_view.CLASSES.apply("DELETED", STD)  # its default class gone
    assert class_events.stale(REFUSE, current)


def test_a_class_edit_that_leaves_the_class_resolved_but_the_spec_unusable_reconciles(
        cluster: dict[str, Any]) -> None:
    """A store that stops vouching for its endpoint: the class still takes
    the policy (ClassResolved unchanged), but its spec without a Secret is
    now refused; the event must judge it again, and again when it vouches
    once more."""
    from ckptdrain.operator import class_events

    def vouching(on: bool) -> dict[str, Any]:
        store = {**STD["spec"]["stores"][0], "endpoint": "https://minio.storage.svc."
                 "cluster.local:9000", "ambientIdentity": on}
        return {**STD, "spec": {**STD["spec"], "stores": [store]}}

    cluster_view = class_view.CLASSES
    cluster_view.apply("MODIFIED", vouching(True))
    current = policy()
    del current["spec"]["storage"]["credentialsSecretRef"]
    resolved = {k: v for k, v in rebalance.class_condition(REFUSE, current).items()
                if k != "type"}
    current["status"] = {"phase": "Ready", "conditions": [
        {"type": st.READY, "status": "True", "reason": "Sized", "message": "sized"},
        {"type": st.CLASS_RESOLVED, **resolved}]}
    assert not class_events.stale(REFUSE, current)

    cluster_view.apply("MODIFIED", vouching(False))
    assert rebalance.class_condition(REFUSE, current)["status"] == resolved["status"]
    assert class_events.stale(REFUSE, current)  # Ready, though new pods are refused
    with pytest.raises(InvalidInput) as refused:
        rebalance.parse_policy(REFUSE, current, 1)
    assert "spec.stores[].ambientIdentity" in str(refused.value)
    current["status"] = {"phase": "Invalid", "conditions": [
        {"type": st.READY, "status": "False", "reason": st.INVALID,
         "message": str(refused.value)}, {"type": st.CLASS_RESOLVED, **resolved}]}
    assert not class_events.stale(REFUSE, current)  # as the reconcile wrote it

    cluster_view.apply("MODIFIED", vouching(True))
    assert class_events.stale(REFUSE, current)  # usable again
