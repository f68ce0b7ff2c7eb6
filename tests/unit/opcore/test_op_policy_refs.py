"""How the operator names a CheckpointPolicy in what it writes about one:
owner references on its records, share channels and peer objects, the
Events about it, and the webhooks Kopf registers for it. All at v1beta1,
the version etcd stores and the operator reads (docs/api-versions.md);
an object that names its policy at v1alpha1 (written before) is still the
policy's, recognised by uid."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf
import pytest

from ckptdrain.contract import api
from ckptdrain.contract import record as fmt
from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1
from ckptdrain.operator.admission import webhook
from ckptdrain.operator.apiserver import kube, policy_edge
from ckptdrain.operator.bandwidth import share_channel
from ckptdrain.operator.records import aggregate

STORED = {"apiVersion": V1BETA1, "kind": api.KIND_POLICY,
          "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1",
                       "resourceVersion": "7", "labels": {"team": "a"}},
          "spec": {"model": {"parameters": "405G"}, "mtti": "24h"}}
#: The policy as the operator's core holds it (converted at its edge).
SEEN = policy_edge.seen(STORED)
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def test_the_core_holds_the_policy_at_v1alpha1() -> None:
    # What every builder below is handed: naming the policy by the body's
    # own apiVersion would say v1alpha1.
    assert SEEN["apiVersion"] == V1ALPHA1


def test_a_record_is_owned_by_its_policy_at_v1beta1_and_stays_a_v1alpha1_checkpoint() -> None:
    rec = fmt.build_record("ml", "llama", 3, 2, policy_uid="u-1")
    assert rec["apiVersion"] == "ckptdrain.io/v1alpha1"  # Checkpoint's one version
    assert rec["metadata"]["ownerReferences"] == [
        {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
         "name": "llama", "uid": "u-1"}]


def test_a_record_made_by_an_agent_gets_a_v1beta1_owner() -> None:
    patch = aggregate.owner_patch(fmt.build_record("ml", "llama", 3, 2), "u-1")
    assert patch is not None
    assert [r["apiVersion"] for r in patch["metadata"]["ownerReferences"]] == [V1BETA1]


def _with_owner(api_version: str, uid: str) -> dict[str, Any]:
    rec = fmt.build_record("ml", "llama", 3, 2)
    rec["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": "CheckpointPolicy", "name": "llama", "uid": uid}]
    return rec


def test_a_record_owned_at_v1alpha1_is_still_its_policys() -> None:
    # Written before the move: the same owner by uid, so nothing is added
    # (a second reference to the same policy) and nothing is rewritten.
    assert aggregate.owner_patch(_with_owner(V1ALPHA1, "u-1"), "u-1") is None
    assert aggregate.owner_patch(_with_owner(V1BETA1, "u-1"), "u-1") is None
    # Another policy's uid (one deleted and made again) is not this one's.
    patch = aggregate.owner_patch(_with_owner(V1ALPHA1, "u-0"), "u-1")
    assert patch is not None
    assert [(r["apiVersion"], r["uid"]) for r in patch["metadata"]["ownerReferences"]] == [
        (V1ALPHA1, "u-0"), (V1BETA1, "u-1")]


def test_a_share_channel_is_controlled_by_its_policy_at_v1beta1() -> None:
    assert share_channel.owner_of(SEEN) == {
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy", "name": "llama",
        "uid": "u-1", "controller": True, "blockOwnerDeletion": False}
    assert share_channel.owner_of(STORED) == share_channel.owner_of(SEEN)
    assert share_channel.owner_of({"metadata": {"name": "llama"}}) is None  # no uid yet


def test_an_event_the_operator_posts_about_a_policy_names_it_at_v1beta1() -> None:
    event = kube.event_body(SEEN, api.KIND_POLICY, "DrainStalled", "no progress", NOW)
    ref = event.involved_object
    assert (ref.api_version, ref.kind, ref.name, ref.namespace, ref.uid) == (
        "ckptdrain.io/v1beta1", "CheckpointPolicy", "llama", "ml", "u-1")
    assert (event.reason, event.message, event.type) == ("DrainStalled", "no progress",
                                                        "Warning")
    assert event.first_timestamp == event.last_timestamp == NOW
    assert event.source.component == kube.EVENT_SOURCE


def test_an_event_about_another_kind_names_the_version_it_is_given() -> None:
    pod = {"metadata": {"name": "w-0", "namespace": "ml", "uid": "p-1"}}
    event = kube.event_body(pod, "Pod", "Unprotected", "x" * 2000, NOW, "Normal", "v1")
    assert (event.involved_object.api_version, event.involved_object.kind) == ("v1", "Pod")
    assert len(event.message) == 1024 and event.type == "Normal"


class _Core:
    """The one call post_event makes of the core API, kept."""

    def __init__(self) -> None:
        self.created: list[tuple[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        self.created.append((namespace, body))


def test_post_event_names_a_policy_at_v1beta1_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The watchdog and the sweep call it without an apiVersion, holding the
    # core's v1alpha1 form.
    core = _Core()
    monkeypatch.setattr(kube, "_clients", lambda: (core, None))
    kube.post_event(SEEN, api.KIND_POLICY, "DrainStalled", "no progress")
    [(namespace, event)] = core.created
    ref = event.involved_object
    assert (namespace, ref.api_version, ref.kind, ref.name, ref.uid) == (
        "ml", "ckptdrain.io/v1beta1", "CheckpointPolicy", "llama", "u-1")


def test_kopfs_events_about_a_policy_name_it_at_v1beta1() -> None:
    # kopf.info/warn name the involvedObject by the apiVersion, kind and
    # metadata of the body they are handed (Kopf offers no public way to
    # build that reference without posting: tests/cluster/test_policy_refs.py
    # reads the Events Kopf posts).
    subject = policy_edge.event_subject(SEEN)
    assert (subject["apiVersion"], subject["kind"]) == ("ckptdrain.io/v1beta1",
                                                        "CheckpointPolicy")
    assert {k: subject["metadata"][k] for k in ("name", "namespace", "uid")} == {
        "name": "llama", "namespace": "ml", "uid": "u-1"}
    assert policy_edge.event_subject(STORED) == policy_edge.event_subject(SEEN)


@pytest.mark.parametrize("version", ["v1alpha1", "v1beta1"])
def test_the_policy_webhooks_are_for_every_version(version: str) -> None:
    # Kopf writes a rule for each resource its selector takes
    # (CKPTDRAIN_WEBHOOK_MANAGED): both versions, so neither is sent
    # converted; test_policy_refs.py reads the configuration it writes.
    assert webhook.admitted(kopf.Resource("ckptdrain.io", version, "checkpointpolicies"))


def test_the_policy_webhooks_are_for_policies_alone() -> None:
    assert not webhook.admitted(kopf.Resource("ckptdrain.io", "v1alpha1", "checkpoints"))
    assert not webhook.admitted(kopf.Resource("other.io", "v1beta1", "checkpointpolicies"))
