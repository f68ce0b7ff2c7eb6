"""admission/policy_rules.py with the apiserver's reads replaced: which
policy CREATEs and UPDATEs are refused, and what the refusal says."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission.rules import Refused
from ckptdrain.operator.apiserver import reads as apiserver_reads

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def body(name: str, selector: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"selector": selector or {"matchLabels": {"app": name}},
                         "model": {"parameters": "7B"}, "interval": "10m", "writers": 2,
                         "localTier": {"path": "/mnt/ckptdrain/n"},
                         "storage": {"uri": "s3://bucket/p"}}
    s.update(spec)
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": s}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"policies": [], "pods": {}, "reads": []}

    def list_policies(namespace: str) -> list[dict[str, Any]]:
        state["reads"].append(("policies", namespace))
        return list(state["policies"])

    def live_injected_pods(namespace: str, policy: str) -> list[str]:
        state["reads"].append(("pods", namespace, policy))
        return list(state["pods"].get(policy, []))

    monkeypatch.setattr(apiserver_reads, "list_policies", list_policies)
    monkeypatch.setattr(apiserver_reads, "live_injected_pods", live_injected_pods)
    return state


def admit(new: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    asyncio.run(policy_rules.admit_policy(new, old, "ml", CFG))


def refusal(new: dict[str, Any], old: dict[str, Any] | None = None) -> Refused:
    with pytest.raises(Refused) as caught:
        admit(new, old)
    return caught.value


def test_an_overlapping_create_is_refused_naming_the_other_and_the_labels(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [body("llama", {"matchLabels": {"app": "llama"}})]
    wide = body("gpus", {"matchExpressions": [{"key": "app", "operator": "Exists"}]})
    refused = refusal(wide)
    assert refused.code == 409
    assert "CheckpointPolicy llama" in str(refused)
    assert "app=llama, ckptdrain.io/inject=true" in str(refused)
    assert str(refused).startswith("spec.selector:")


def test_exclusive_selectors_and_the_policy_itself_are_no_overlap(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [body("llama", {"matchLabels": {"app": "llama"}})]
    admit(body("mistral", {"matchLabels": {"app": "mistral"}}))
    admit(body("gpus", {"matchExpressions": [
        {"key": "app", "operator": "Exists"},
        {"key": "app", "operator": "NotIn", "values": ["llama"]}]}))
    # An update of llama meets itself in the list: not a conflict.
    admit(body("llama", {"matchLabels": {"app": "llama", "team": "x"}}), cluster["policies"][0])


def test_a_policy_being_deleted_or_selecting_only_pods_that_cannot_opt_in_is_no_overlap(
        cluster: dict[str, Any]) -> None:
    going = body("old", {})
    going["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    cluster["policies"] = [going, body("bare", {"matchExpressions": [
        {"key": "ckptdrain.io/inject", "operator": "DoesNotExist"}]})]
    admit(body("llama"))


def test_an_unreadable_list_refuses_rather_than_guess(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(namespace: str) -> list[dict[str, Any]]:
        raise apiserver_reads.ApiError(500, "etcd down")

    monkeypatch.setattr(apiserver_reads, "list_policies", broken)
    refused = refusal(body("llama"))
    assert refused.code == 503 and "retry" in str(refused)


def test_a_bad_spec_is_refused_before_any_read(cluster: dict[str, Any]) -> None:
    refused = refusal(body("llama", localTier={"path": "/etc"}))
    assert refused.code == 422 and "spec.localTier.path" in str(refused)
    assert cluster["reads"] == []


def test_moving_the_store_under_a_live_pod_is_refused_naming_it_and_the_ways(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["policies"], cluster["pods"] = [old], {"llama": ["llama-0", "llama-1"]}
    refused = refusal(body("llama", storage={"uri": "s3://other/p"}), old)
    assert refused.code == 409
    message = str(refused)
    assert message.startswith("spec.storage.uri: cannot change while pods of policy llama")
    assert "pod llama-0" in message
    assert "create a new policy" in message and "spec.relocation.reason" in message
    # The selector did not change: the other policies were not read.
    assert ("policies", "ml") not in cluster["reads"]


def test_changing_writers_under_a_live_pod_says_suspend_change_resume(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["pods"] = {"llama": ["llama-0"]}
    message = str(refusal(body("llama", writers=4, relocation={"reason": "x"}), old))
    assert message.startswith("spec.writers:") and "suspend the job" in message
    assert "spec.relocation" not in message


def test_a_move_with_no_live_pod_or_with_a_new_reason_is_admitted(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    admit(body("llama", storage={"uri": "s3://other/p"}, writers=4), old)
    cluster["pods"] = {"llama": ["llama-0"], "other": ["x-0"]}
    admit(body("llama", storage={"uri": "s3://other/p"},
               relocation={"reason": "bucket migration"}), old)
    admit(body("llama", interval="20m"), old)
    assert [r for r in cluster["reads"] if r[0] == "pods"] == [("pods", "ml", "llama")]
