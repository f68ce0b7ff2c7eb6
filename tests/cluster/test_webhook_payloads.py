"""Hostile webhook payloads against the admission process itself
(admission/process.py, started as the operator starts it), over TLS, with a
real apiserver behind it and a policy that selects the sample's pods, so
that a review reaches the rules, the class lookup and the injection.

The sample (webhook_payloads.py: a hand-written corpus by class and seeded
mutations; webhook_unread.py: each field of a real pod set to each wrong
JSON type; the same on every run) is sent one case per connection, one
case at a time (many at once: test_webhook_concurrency.py). Every
answer must be a 200 with a well-formed review that echoes the uid exactly,
or a 4xx naming what was wrong: never a 5xx (nor a review refused with
500), a traceback, no answer within 60 s, or the secret planted in env
values, annotations and Secret data. The valid cases (webhook_valid.py,
and the well-formed reviews among the hostile ones) must be admitted (a
selected pod with a patch) or converted: a false refusal fails the test.
A pod with a field of the wrong type is refused naming that field, or
admitted with a patch that applies to the very object sent.
Afterwards the process is alive and answers a valid review as before, and
its log holds neither the secret nor a traceback.

Its times and memory are measured, not asserted (they depend on the
machine's load): with CKPTDRAIN_WEBHOOK_FIGURES=<file>, the figures of the
run are written there (docs/security.md quotes them)."""

from __future__ import annotations

import base64
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import webhook_payloads as payloads
import webhook_probe as probe
import webhook_unread
import webhook_valid
from cluster_helpers import INJECT
from webhook_served import (  # noqa: F401 -- `served`: the fixture, used by name
    FUZZ,
    Served,
    assert_alive_and_clean,
    injected,
    problems,
    sample,
    served,
)

from ckptdrain.contract.api import ANNOTATION_POLICY
from ckptdrain.operator.admission.rules import MUTATE_ID as POD_WEBHOOK
from support.apiserver import Cluster

FIGURES_ENV = "CKPTDRAIN_WEBHOOK_FIGURES"
#: Seconds of quiet before the memory the sample left is measured.
QUIET_S = 3.0


@dataclass
class Figures:
    by_class: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    slowest: float = 0.0
    slowest_case: str = ""
    seconds: float = 0.0
    rss_kib: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, case: payloads.Case, answer: probe.Answer) -> None:
        self.by_class[case.kind] += 1
        self.by_status[outcome(case, answer)] += 1
        if answer.seconds >= self.slowest:
            self.slowest = answer.seconds
            self.slowest_case = f"{case.kind}, {outcome(case, answer)}"

    def text(self) -> str:
        before, after = self.rss_kib["before"], self.rss_kib["after"]
        settled = self.rss_kib["settled"]
        lines = [f"cases sent: {sum(self.by_class.values())} in {self.seconds:.1f} s",
                 *(f"  {kind}: {n}" for kind, n in sorted(self.by_class.items())),
                 "answers:", *(f"  {what}: {n}" for what, n in sorted(self.by_status.items())),
                 f"slowest answer: {self.slowest:.2f} s ({self.slowest_case})",
                 f"RSS: {before['VmRSS'] / 1024:.0f} MiB before, "
                 f"{after['VmRSS'] / 1024:.0f} MiB right after "
                 f"(+{(after['VmRSS'] - before['VmRSS']) / 1024:.0f} MiB), "
                 f"{settled['VmRSS'] / 1024:.0f} MiB {QUIET_S:.0f} s later "
                 f"(+{(settled['VmRSS'] - before['VmRSS']) / 1024:.0f} MiB), "
                 f"peak {settled['VmHWM'] / 1024:.0f} MiB"]
        return "\n".join(lines) + "\n"


def outcome(case: payloads.Case, answer: probe.Answer) -> str:
    """How `answer` is counted: its status, and for a 200 review whether it
    admitted or refused (with the code it gave)."""
    if answer.status != 200:
        return f"HTTP {answer.status}" if answer.status else "no answer"
    try:
        response = json.loads(answer.body).get("response") or {}
    except (ValueError, AttributeError):
        return "HTTP 200, not JSON"
    if case.path.split("?")[0] == payloads.CONVERT_PATH:
        return f"HTTP 200, conversion {(response.get('result') or {}).get('status')}"
    if response.get("allowed"):
        return "HTTP 200, allowed" + (" with a patch" if "patch" in response else "")
    return f"HTTP 200, refused ({(response.get('status') or {}).get('code')})"


def test_hostile_webhook_payloads_are_answered_and_leak_nothing(
        served: Served) -> None:  # noqa: F811
    # The rules are reached: a valid pod is injected (the policy's bucket in the patch).
    first = injected(served, "before")
    assert b"ckpt-bucket" in base64.b64decode(first["patch"])
    cases = sample(served)
    figures = Figures()
    figures.rss_kib["before"] = probe.rss_kib(served.pid)
    failures: list[str] = []
    began = time.monotonic()
    for case in cases:
        answer = served.send(case)
        figures.count(case, answer)
        failures.extend(problems(case, answer))
    figures.seconds = time.monotonic() - began
    figures.rss_kib["after"] = probe.rss_kib(served.pid)
    assert_alive_and_clean(served)
    # Freed memory goes back to the system once the process is quiet
    # (operator/heap.py): what is still held then is what the sample left.
    time.sleep(QUIET_S)
    figures.rss_kib["settled"] = probe.rss_kib(served.pid)
    written = os.environ.get(FIGURES_ENV)
    if written:
        Path(written).write_text(figures.text())
    print(figures.text())
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
    assert len(cases) >= 1_000
    # Every valid case was sent and counted (a false refusal is a failure above).
    assert sum(n for kind, n in figures.by_class.items() if kind.startswith("valid")) >= 15
    # Fields of every kind were changed, the rules' and others alike.
    assert figures.by_class[webhook_unread.KIND] >= 500


def test_valid_pods_created_through_the_apiserver_are_injected(
        served: Served, cluster: Cluster) -> None:  # noqa: F811
    """The sample's valid pods, created with kubectl through the real
    apiserver (its own encoding of each, its webhook call, its application
    of the patch), with the admission process registered as the pod
    webhook of this namespace alone, failing closed: each is created, and
    injected."""
    name = f"fuzz-pods-{served.namespace}"
    hook = {"name": "pods.inject.ckptdrain.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{served.server.port}/{POD_WEBHOOK}",
                             "caBundle": base64.b64encode(served.ca_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": INJECT},
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": served.namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration", "metadata": {"name": name},
        "webhooks": [hook]}))
    try:
        pods = list(webhook_valid.valid_pods(payloads.Corpus(served.namespace, FUZZ)))
        assert len(pods) >= 7
        # The apiserver calls a webhook once its watch has seen the
        # configuration: a dry run until it does.
        deadline = time.monotonic() + 30
        while True:
            done, said = injected_by(cluster, served.namespace, pods[0][1], "--dry-run=server")
            if done:
                break
            assert time.monotonic() < deadline, ("the apiserver never called the webhook",
                                                 said)
            time.sleep(0.5)
        for index, (what, pod) in enumerate(pods):
            if "name" in pod["metadata"]:
                pod["metadata"]["name"] = f"valid-{index}"
            done, said = injected_by(cluster, served.namespace, pod)
            assert done, (what, said)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")


def injected_by(cluster: Cluster, namespace: str, pod: dict[str, Any],
                *flags: str) -> tuple[bool, str]:
    """Whether `pod`, created with kubectl, came back injected; what kubectl said."""
    made = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", *flags,
                           input=json.dumps(pod), check=False)
    if made.returncode:
        return False, made.stderr[-2000:]
    meta = json.loads(made.stdout)["metadata"]
    return ANNOTATION_POLICY in (meta.get("annotations") or {}), str(meta)[:2000]
