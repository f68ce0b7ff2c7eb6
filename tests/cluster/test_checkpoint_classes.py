"""CheckpointClasses through the real operator, webhooks and apiserver: a
default class's root and resources reach an injected pod; a policy whose
storage.uri is outside its class's stores is refused naming the field and
the class; a policy whose class is deleted turns ClassResolved False and
its pods are refused (the default CKPTDRAIN_UNSELECTED_PODS=Refuse), and
back to True when the class returns; a policy created without a class is
bound to the default class then, and one created while there was none
stays classless.

Classes are cluster-scoped and the session's operator serves every test:
each class here is deleted when its test ends, so no other test meets it."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

from cluster_helpers import CLASSES, INJECT, POLICIES, get, pod, policy, wait_for

from support.apiserver import Cluster

ROOT = "/mnt/class-nvme"


def checkpoint_class(name: str, default: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default:
        meta["annotations"] = {"ckptdrain.io/is-default-class": "true"}
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": meta, "spec": {"nodeTier": {"root": ROOT}, **spec}}


def _create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)


def _condition(cluster: Cluster, namespace: str, name: str, kind: str) -> dict[str, Any]:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def test_a_default_class_root_and_resources_reach_an_injected_pod(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    classes(checkpoint_class("cluster-default", default=True, resources={
        "qos": "Burstable", "agent": {"requests": {"cpu": "300m", "memory": "384Mi"}}}))
    # Under the class's root; the operator's own (/mnt/ckptdrain) would refuse it.
    apply(policy("classed", localTier={"path": f"{ROOT}/fast"}))
    resolved = wait_for(lambda: _condition(cluster, namespace, "classed", "ClassResolved")
                        .get("status") == "True" and _condition(
                            cluster, namespace, "classed", "ClassResolved"),
                        what="ClassResolved True")
    assert "CheckpointClass cluster-default" in resolved["message"]
    # Bound at creation: the default class's name is in the stored policy.
    assert get(cluster, namespace, POLICIES, "classed")["spec"]["checkpointClassName"] == \
        "cluster-default"
    made = _create(cluster, namespace, pod("w-0", {"app": "classed", **INJECT},
                                           terminationGracePeriodSeconds=600))
    assert made.returncode == 0, made.stderr
    stored = json.loads(made.stdout)
    paths = [v["hostPath"]["path"] for v in stored["spec"]["volumes"] if "hostPath" in v]
    assert f"{ROOT}/fast/{namespace}/classed" in paths, paths
    agent = next(c for c in stored["spec"]["initContainers"] if c["name"] == "ckptdrain-agent")
    assert agent["resources"]["requests"] == {"cpu": "300m", "memory": "384Mi"}


def test_a_policy_created_while_no_class_is_default_stays_classless(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    apply(policy("plain"))
    assert "checkpointClassName" not in get(cluster, namespace, POLICIES, "plain")["spec"]
    classes(checkpoint_class("late-default", default=True))
    # The default that came later binds only policies created after it.
    # Created and applied again as written, server-side, as GitOps tools do.
    created = cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-",
                              input=json.dumps(policy("later", localTier={"path": f"{ROOT}/l"})),
                              check=False)
    assert created.returncode == 0, created.stderr
    assert get(cluster, namespace, POLICIES, "later")["spec"]["checkpointClassName"] == \
        "late-default"
    # Applied again: the class it was bound to stays, and the apply succeeds.
    later = policy("later", localTier={"path": f"{ROOT}/l"}, interval="20m")
    again = cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-",
                            input=json.dumps(later), check=False)
    assert again.returncode == 0, again.stderr
    stored = get(cluster, namespace, POLICIES, "later")["spec"]
    assert (stored["checkpointClassName"], stored["interval"]) == ("late-default", "20m")
    assert "checkpointClassName" not in get(cluster, namespace, POLICIES, "plain")["spec"]
    refused = _replace_with_class(cluster, namespace, "plain", "late-default")
    assert refused.returncode != 0 and "make a new policy" in refused.stderr, refused.stderr


def _replace_with_class(cluster: Cluster, namespace: str, name: str,
                        class_name: str) -> subprocess.CompletedProcess[str]:
    """A `kubectl replace` of the stored policy naming another class. The
    operator writes the policy too (its status, Kopf's annotations), so a
    replace of what was read can lose that race with a 409 Conflict that
    says nothing about the class; read again and retry until the answer is
    the apiserver's verdict on the class itself."""
    for _ in range(10):
        moved = get(cluster, namespace, POLICIES, name)
        moved["spec"]["checkpointClassName"] = class_name
        result = cluster.kubectl("replace", "-n", namespace, "-f", "-",
                                 input=json.dumps(moved), check=False)
        if "the object has been modified" not in result.stderr:
            return result
        time.sleep(0.2)
    return result


def test_a_uri_outside_the_class_stores_is_refused_naming_field_and_class(
        classes: Callable[..., None], apply: Callable[..., Any]) -> None:
    classes(checkpoint_class("team-stores", stores=[
        {"uriPrefix": "s3://ckpt-bucket/{namespace}", "endpoint": "http://minio.storage:9000"}]))
    body = policy("outside", checkpointClassName="team-stores",
                  localTier={"path": f"{ROOT}/x"})
    result = apply(body, check=False)
    assert result.returncode != 0
    assert "spec.storage.uri" in result.stderr, result.stderr
    assert "CheckpointClass team-stores" in result.stderr, result.stderr


def test_a_deleted_class_turns_class_resolved_false_and_back(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    classes(checkpoint_class("passing"))
    apply(policy("orphan", checkpointClassName="passing", localTier={"path": f"{ROOT}/o"}))
    wait_for(lambda: _condition(cluster, namespace, "orphan", "ClassResolved")
             .get("status") == "True", what="ClassResolved True")
    cluster.kubectl("delete", CLASSES, "passing", "--wait=true")
    gone = wait_for(lambda: _condition(cluster, namespace, "orphan", "ClassResolved")
                    .get("status") == "False" and _condition(
                        cluster, namespace, "orphan", "ClassResolved"),
                    what="ClassResolved False")
    assert gone["reason"] == "ClassNotFound"
    assert "spec.checkpointClassName" in gone["message"] and "passing" in gone["message"]
    assert get(cluster, namespace, POLICIES, "orphan")["status"]["phase"] == "Invalid"
    # Its pods are refused, as an invalid policy's are.
    refused = _create(cluster, namespace, pod("w-0", {"app": "orphan", **INJECT},
                                              terminationGracePeriodSeconds=600))
    assert refused.returncode != 0
    assert "passing" in refused.stderr, refused.stderr

    classes(checkpoint_class("passing"))
    wait_for(lambda: _condition(cluster, namespace, "orphan", "ClassResolved")
             .get("status") == "True", what="ClassResolved True again")
    back = wait_for(lambda: get(cluster, namespace, POLICIES, "orphan")["status"]["phase"]
                    != "Invalid", what="valid again")
    assert back


def _class_conditions(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    found = json.loads(cluster.kubectl("get", CLASSES, name, "-o", "json").stdout)
    return {c["type"]: c for c in (found.get("status") or {}).get("conditions") or []}


def test_two_defaults_the_oldest_wins_and_both_say_so(
        cluster: Cluster, classes: Callable[..., None]) -> None:
    classes(checkpoint_class("first-default", default=True))
    wait_for(lambda: _class_conditions(cluster, "first-default").get("Default", {})
             .get("reason") == "Default", what="first-default Default")
    # creationTimestamp has one-second resolution: the second is younger.
    time.sleep(1.1)
    classes(checkpoint_class("second-default", default=True))
    second = wait_for(lambda: _class_conditions(cluster, "second-default").get("Default"),
                      what="second-default Default")
    assert (second["status"], second["reason"]) == ("False", "NewerDefault")
    assert "the oldest, first-default, is the default" in second["message"]
    first = wait_for(lambda: _class_conditions(cluster, "first-default")["Default"]
                     if _class_conditions(cluster, "first-default")["Default"]["reason"]
                     == "OldestDefault" else None, what="first-default OldestDefault")
    assert first["status"] == "True"
    assert _class_conditions(cluster, "second-default")["Accepted"]["status"] == "True"


def test_a_class_the_operator_cannot_use_says_why_and_refuses_its_policies(
        cluster: Cluster, classes: Callable[..., None], apply: Callable[..., Any]) -> None:
    # The schema admits it; a Guaranteed pod needs a guaranteed cpu above 0.
    classes(checkpoint_class("zero-cpu", resources={
        "qos": "Guaranteed", "agent": {"guaranteed": {"cpu": "0", "memory": "1Gi"}}}))
    accepted = wait_for(lambda: _class_conditions(cluster, "zero-cpu").get("Accepted"),
                        what="zero-cpu Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "Invalid")
    assert "spec.resources.agent.guaranteed.cpu" in accepted["message"]
    result = apply(policy("uses-zero", checkpointClassName="zero-cpu",
                          localTier={"path": f"{ROOT}/z"}), check=False)
    assert result.returncode != 0
    assert "CheckpointClass zero-cpu cannot be used" in result.stderr, result.stderr
