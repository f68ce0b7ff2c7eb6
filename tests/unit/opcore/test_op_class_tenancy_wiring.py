"""A class that allows namespaces by label where its policies are judged,
with the apiserver's reads replaced: labels that cannot be read are a
retry (503 at admission, a retried reconcile), never a judgement of the
policy; a namespace relabelled out of a class takes its policy's share of
the cluster cap away with no change to the policy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from ckptdrain.operator import config, policy_reconcile
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import class_view, leadership, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.records import watchdog

LOG = logging.getLogger("test")
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            cluster_bandwidth=100e6)
TEAM_A = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
          "metadata": {"name": "team-a", "creationTimestamp": "2026-11-01T00:00:00Z",
                       "annotations": {"ckptdrain.io/is-default-class": "true"}},
          "spec": {"nodeTier": {"root": "/mnt/ckptdrain"},
                   "namespaces": {"from": "Selector",
                                  "selector": {"matchLabels": {"tenant": "a"}}}}}


def policy(namespace: str = "ml", name: str = "llama", cls: str | None = "team-a"
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {"checkpointClassName": cls} if cls else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "900GB"}, "interval": "15m",
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}, **spec}}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
            ) -> Iterator[dict[str, Any]]:
    """Each namespace's labels (a namespace missing answers 403: the RBAC
    rolled back), the namespace's policies, and the namespaces read."""
    state: dict[str, Any] = {"labels": {"ml": {"tenant": "a"}}, "policies": [], "read": []}
    no_checkpoint_classes.replace([TEAM_A], "1")

    def get_json(path: str, query: Any, timeout: float) -> dict[str, Any]:
        namespace = path.rsplit("/", 1)[1]
        state["read"].append(namespace)
        if namespace not in state["labels"]:
            raise apiserver_reads.ApiError(403, "Forbidden")
        return {"metadata": {"name": namespace, "labels": dict(state["labels"][namespace])}}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    monkeypatch.setattr(apiserver_reads, "list_policies",
                        lambda namespace, timeout=5: list(state["policies"]))
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a, **k: None)
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: [])
    namespace_labels.forget()
    yield state
    namespace_labels.forget()


def test_policy_admission_is_a_503_when_the_labels_cannot_be_read(
        cluster: dict[str, Any]) -> None:
    del cluster["labels"]["ml"]
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.admit_policy(policy(), None, "ml", CFG))
    assert refused.value.code == 503
    assert str(refused.value).startswith("spec.checkpointClassName: could not read the labels "
                                         "of namespace ml, which its CheckpointClass allows "
                                         "by label (")


def test_the_default_class_patch_is_a_503_when_the_labels_cannot_be_read(
        cluster: dict[str, Any]) -> None:
    assert asyncio.run(policy_rules.default_class_patch(policy(cls=None), [], "ml")) == [
        {"op": "add", "path": "/spec/checkpointClassName", "value": "team-a"}]
    del cluster["labels"]["ml"]
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.default_class_patch(policy(cls=None), [], "ml"))
    assert refused.value.code == 503


def test_a_pod_is_a_503_when_its_namespace_was_never_read_and_cannot_be(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [policy()]
    del cluster["labels"]["ml"]
    pod = {"metadata": {"name": "w-0", "namespace": "ml",
                        "labels": {"app": "llama", "ckptdrain.io/inject": "true"}},
           "spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(admission.admit_pod(pod, "ml", CFG, [], LOG, None, None))
    assert refused.value.code == 503 and "retry" in str(refused.value)


def test_a_reconcile_that_cannot_read_the_labels_retries_and_writes_nothing(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[Any] = []
    monkeypatch.setattr(watchdog, "start", lambda *a, **k: None)
    monkeypatch.setattr(policy_reconcile, "write_status", lambda *a: written.append(a))
    del cluster["labels"]["ml"]
    body = policy()
    body["status"] = {"phase": "Ready", "conditions": [
        {"type": "ClassResolved", "status": "True", "reason": "Resolved",
         "message": "CheckpointClass team-a"}]}
    indexes: dict[str, Any] = {k: {} for k in (
        "pod_index", "checkpointpolicy_index", "checkpoint_index", "peer_pod_index",
        "progress_index")}
    with pytest.raises(kopf.TemporaryError, match="namespace ml"):
        policy_reconcile.reconcile_policy(body=kopf.Body(body),
                                          memo=kopf.Memo(config=CFG), logger=LOG,
                                          announce=False, **indexes)
    assert written == []  # no Invalid, no NamespaceNotAllowed: the status stands


def test_a_namespace_relabelled_out_of_the_class_loses_its_share(
        cluster: dict[str, Any]) -> None:
    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    for namespace in ("ml", "other"):  # as each policy's reconcile reads them
        namespace_labels.recent(namespace, CFG.namespace_recheck_s)
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("ml", "a"), ("other", "b")}
    # Relabelled, as the recheck reads it: the same policies, another answer.
    cluster["labels"]["ml"] = {"tenant": "b"}
    namespace_labels.fresh("ml")
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("other", "b")}
    assert parts[("other", "b")][1].budget == pytest.approx(100e6)


def test_after_a_new_term_the_first_policy_reconciled_does_not_take_the_whole_cap(
        cluster: dict[str, Any]) -> None:
    # A new term (or a start) forgets every reading; the first policy
    # reconciled reads its own namespace, and the budgets read the others.
    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    namespace_labels.forget()
    assert rebalance.parse_policy(CFG, policy("ml", "a"), 1).name == "a"
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("ml", "a"), ("other", "b")}
    assert [parts[key][1].budget for key in sorted(parts)] == pytest.approx([50e6, 50e6])


def _locks_held() -> dict[str, bool]:
    return {"budgets": rebalance._joint._lock.locked(),
            "joint pass": rebalance._joint_lock.locked(),
            "policy b": rebalance.locks[("other", "b")].locked()}


def test_the_budgets_read_labels_before_their_locks_never_under_them(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # The apiserver times out: a read under the budgets' lock would hold it
    # for its timeout, once per namespace, for every waiting caller.
    held_while_read: list[dict[str, bool]] = []

    def timing_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        cluster["read"].append(path.rsplit("/", 1)[1])
        held_while_read.append(_locks_held())
        raise TimeoutError("timed out")

    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    cluster["labels"]["other"] = {"tenant": "a"}
    namespace_labels.fresh("other")  # held, as its reconcile or the recheck left it
    monkeypatch.setattr(apiserver_reads, "get_json", timing_out)
    cluster["read"].clear()
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    # Read once, outside every lock; unreadable: no share, a held reading counts.
    assert cluster["read"] == ["ml"]
    assert set(parts) == {("other", "b")}
    # Within the failure's memory the next callers wait for no read at all.
    rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    monkeypatch.setattr(leadership, "active", lambda: False)  # computes, publishes nothing
    rebalance.rebalance_moved(CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert cluster["read"] == ["ml"]
    assert held_while_read == [{"budgets": False, "joint pass": False, "policy b": False}]


def test_a_policy_pass_and_the_joint_pass_read_before_they_lock(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    held_while_read: list[dict[str, bool]] = []
    real = apiserver_reads.get_json

    def watched(path: str, query: Any, timeout: float) -> dict[str, Any]:
        held_while_read.append(_locks_held())
        return real(path, query, timeout)

    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    monkeypatch.setattr(apiserver_reads, "get_json", watched)
    monkeypatch.setattr(leadership, "active", lambda: False)  # computes, publishes nothing
    monkeypatch.setattr(rebalance, "_joint_last", {})
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert sorted(cluster["read"]) == ["ml", "other"]
    # A new term forgot the readings: b's own pass (its pods counted as the
    # joint pass left them) needs a full answer, and reads first.
    namespace_labels.forget()
    assert not rebalance.counted_moved(("other", "b"), pods)  # type: ignore[arg-type]
    rebalance.run(("other", "b"), CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert sorted(cluster["read"]) == ["ml", "ml", "other", "other"]
    assert held_while_read and not any(any(h.values()) for h in held_while_read)
