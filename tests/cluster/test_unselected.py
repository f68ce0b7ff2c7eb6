"""Opted-in pods no CheckpointPolicy selects, against a real apiserver: with
CKPTDRAIN_UNSELECTED_PODS=Refuse (the default) creating one fails with a
message that names the label and the ways out; with Flag it is admitted
bare, and the sweep posts an Unselected Event on each pod and one on their
controller (a Job: no controller runs here, so the test makes the Job and
its pods itself), once, a restart included, and counts them in
ckptdrain_unselected_pods."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, owned_by, pod, policy, wait_for
from operator_process import OperatorProcess

from support.apiserver import Cluster


def _create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)


def _objects(text: str) -> list[dict[str, Any]]:
    """What `kubectl create -o json` prints for a List: one document per object."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        obj, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        out.append(obj)
    return out


def _events(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    return list(get(cluster, namespace, "events", "--field-selector",
                    f"involvedObject.kind={kind},involvedObject.name={name},"
                    "reason=Unselected")["items"])


def _gauge(operator: OperatorProcess, namespace: str) -> float | None:
    found = re.search(r'^ckptdrain_unselected_pods\{namespace="' + re.escape(namespace)
                      + r'"\} (\S+)$', operator.metrics(), re.M)
    return float(found.group(1)) if found else None


@contextmanager
def _events_held(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Every Event created in `namespace` refused (a webhook nobody answers,
    failurePolicy Fail) until the block ends: what the sweep finds meanwhile
    is posted by a later sweep (a refused post is retried), from all it
    knows by then."""
    name = f"hold-events-{namespace}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name},
        "webhooks": [{
            "name": "hold-events.test.ckptdrain.io",
            "clientConfig": {"url": "https://127.0.0.1:9/hold"},  # nothing listens
            "rules": [{"apiGroups": ["", "events.k8s.io"], "apiVersions": ["v1"],
                       "operations": ["CREATE"], "resources": ["events"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 2}]}))
    try:
        probe = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "probe-"},
                 "involvedObject": {"kind": "Pod", "name": "none", "namespace": namespace},
                 "reason": "Probe", "message": "refused while held", "type": "Normal"}
        # The apiserver takes a configuration up a moment after it is written.
        wait_for(lambda: _create(cluster, namespace, probe).returncode != 0,
                 what="Events refused in the namespace")
        yield
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, check=False)


def _job(cluster: Cluster, namespace: str, name: str, app: str) -> dict[str, Any]:
    """A suspended Job (nothing runs it here): the owner the pods name."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"suspend": True, "template": {
               "metadata": {"labels": {"app": app, **INJECT}},
               "spec": {"restartPolicy": "Never",
                        "containers": [{"name": "trainer", "image": "trainer:1"}]}}}}
    made = _create(cluster, namespace, job)
    assert made.returncode == 0, made.stderr
    return dict(json.loads(made.stdout))


def _owned_pod(name: str, app: str, job: dict[str, Any]) -> dict[str, Any]:
    return owned_by(pod(name, {"app": app, **INJECT}, terminationGracePeriodSeconds=3600), job)


def test_an_opted_in_pod_no_policy_selects_is_refused(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("llama"))  # a policy exists, but its selector is not the pod's
    refused = _create(cluster, namespace, pod("typo", {"app": "lama", **INJECT}))
    assert refused.returncode != 0
    assert f"no CheckpointPolicy in {namespace} selects this pod (typo)" in refused.stderr
    assert "ckptdrain.io/inject=true" in refused.stderr
    assert "whose spec.selector matches the pod's labels" in refused.stderr
    assert "remove the label ckptdrain.io/inject" in refused.stderr
    # The pod's labels beside the namespace's selectors: the typo shows.
    assert '"app": "lama"' in refused.stderr
    assert 'its policies: llama selects {"matchLabels": {"app": "llama"}}' in refused.stderr
    assert cluster.kubectl("get", "-n", namespace, "pod", "typo", check=False).returncode != 0
    # The same pod, once a policy selects it, is admitted and injected.
    apply(policy("lama"))
    made = _create(cluster, namespace, pod("typo", {"app": "lama", **INJECT},
                                           terminationGracePeriodSeconds=3600))
    assert made.returncode == 0, made.stderr
    assert "ckptdrain.io/injected" in json.loads(made.stdout)["metadata"]["annotations"]


def test_flag_admits_it_bare_and_flags_the_pod_and_its_job(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], tmp_path: Path) -> None:
    operator.stop()  # one operator answers the test webhook: this one flags
    flagging = OperatorProcess(cluster, tmp_path / "flag", CKPTDRAIN_UNSELECTED_PODS="Flag")
    flagging.workdir.mkdir()
    try:
        flagging.start()
        apply(policy("llama"))
        job = _job(cluster, namespace, "train", "lama")
        # Both pods in one call, as a Job controller creates them. A sweep
        # may run between the two creations (every second here, and 0.5 s
        # after a pod event), so the Events are held until both exist: the
        # Job's then counts both.
        with _events_held(cluster, namespace):
            made = _create(cluster, namespace, {"apiVersion": "v1", "kind": "List", "items": [
                _owned_pod("train-0", "lama", job), _owned_pod("train-1", "lama", job)]})
        assert made.returncode == 0, made.stderr
        assert f"no CheckpointPolicy in {namespace} selects this pod; not injected" \
            in made.stderr  # the admission warning
        items = _objects(made.stdout)
        assert [i["metadata"]["name"] for i in items] == ["train-0", "train-1"]
        assert all("ckptdrain.io/injected" not in (i["metadata"].get("annotations") or {})
                   for i in items)

        on_pod = wait_for(lambda: _events(cluster, namespace, "Pod", "train-0"),
                          what="an Unselected Event on the pod")
        assert on_pod[0]["type"] == "Warning"
        assert f"no CheckpointPolicy in {namespace} selects it" in on_pod[0]["message"]
        on_job = wait_for(lambda: _events(cluster, namespace, "Job", "train"),
                          what="an Unselected Event on the pod's Job")
        involved = on_job[0]["involvedObject"]
        assert (involved["apiVersion"], involved["uid"]) == ("batch/v1",
                                                             job["metadata"]["uid"])
        assert on_job[0]["type"] == "Warning"
        # One Event on the Job for both its pods, with their count.
        assert on_job[0]["message"].startswith(
            "2 of its pods (e.g. train-0) are labelled ckptdrain.io/inject")
        assert wait_for(lambda: _gauge(flagging, namespace) == 2.0, what="gauge 2")
        # Once per object: later sweeps (every second here) post nothing more,
        # nor does a restarted operator (it reads its own Events back first).
        time.sleep(3)
        flagging.stop()
        flagging.start()
        assert wait_for(lambda: _gauge(flagging, namespace) == 2.0, what="gauge 2 again")
        time.sleep(3)
        for name in ("train-0", "train-1"):
            assert len(_events(cluster, namespace, "Pod", name)) == 1
        assert len(_events(cluster, namespace, "Job", "train")) == 1
        # A policy that selects them: no longer unselected (now unprotected),
        # and the namespace's series goes.
        apply(policy("lama"))
        assert wait_for(lambda: _gauge(flagging, namespace) is None, what="no gauge series")
    finally:
        flagging.stop()
        cluster.kubectl("delete", "-n", namespace, "jobs", "--all", "--wait=false",
                        check=False)
        operator.start()


def test_an_injected_pod_whose_policy_is_deleted_is_flagged(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("orphan"))
    made = _create(cluster, namespace, pod("orphan-0", {"app": "orphan", **INJECT},
                                           terminationGracePeriodSeconds=3600))
    assert made.returncode == 0, made.stderr
    assert "ckptdrain.io/injected" in json.loads(made.stdout)["metadata"]["annotations"]
    time.sleep(2)  # sweeps run meanwhile: while the policy exists, nothing is flagged
    assert _events(cluster, namespace, "Pod", "orphan-0") == []
    assert _gauge(operator, namespace) is None
    cluster.kubectl("delete", "-n", namespace, POLICIES, "orphan")
    on_pod = wait_for(lambda: _events(cluster, namespace, "Pod", "orphan-0"),
                      what="an Unselected Event on the pod whose policy went")
    assert on_pod[0]["message"].startswith(
        "labelled ckptdrain.io/inject=true and injected for CheckpointPolicy orphan, "
        f"which no longer exists in {namespace}")
    assert wait_for(lambda: _gauge(operator, namespace) == 1.0, what="gauge 1")
    # The policy is back: the pod is no longer flagged.
    apply(policy("orphan"))
    assert wait_for(lambda: _gauge(operator, namespace) is None, what="no gauge series")
