"""Hostile webhook payloads against the admission process itself
(admission/process.py, started as the operator starts it), over TLS, with a
real apiserver behind it and a policy that selects the sample's pods, so
that a review reaches the rules, the class lookup and the injection.

The sample (webhook_payloads.py: a hand-written corpus by class and seeded
mutations, the same on every run) is sent one case per connection, once
one case at a time and once CONCURRENT cases at once, as an apiserver
calls the webhook for the many pods of one job. Every
answer must be a 200 with a well-formed review that echoes the uid exactly,
or a 4xx naming what was wrong: never a 5xx (nor a review refused with
500), a traceback, no answer within 60 s, or the secret planted in env
values, annotations and Secret data. The valid cases (webhook_valid.py,
and the well-formed reviews among the hostile ones) must be admitted (a
selected pod with a patch) or converted: a false refusal fails the test.
Afterwards the process is alive and answers a valid review as before, and
its log holds neither the secret nor a traceback.

Its times and memory are measured, not asserted (they depend on the
machine's load): with CKPTDRAIN_WEBHOOK_FIGURES=<file>, the figures of the
run are written there (docs/security.md quotes them)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import webhook_payloads as payloads
import webhook_probe as probe
import webhook_valid
from cluster_helpers import INJECT, policy

from ckptdrain.contract.api import ANNOTATION_POLICY
from ckptdrain.operator.admission.rules import MUTATE_ID as POD_WEBHOOK
from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import ConversionServer
from support.ports import free_port

FIGURES_ENV = "CKPTDRAIN_WEBHOOK_FIGURES"
#: The sample's pods; a second policy's for the check after it (no rank of
#: it is claimed by the sample).
FUZZ = {"app": "fuzz", **INJECT}
SANE = {"app": "sane", **INJECT}
#: Seconds of quiet before the memory the sample left is measured.
QUIET_S = 3.0
#: Connections open at once in the concurrent pass.
CONCURRENT = 16


@dataclass
class Served:
    server: ConversionServer
    context: ssl.SSLContext
    log: Path
    namespace: str
    ca_pem: bytes

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid


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


@pytest.fixture
def served(cluster: Cluster, crds: None, namespace: str, apply: Callable[..., Any],
           tmp_path: Path) -> Iterator[Served]:
    """The admission process on a port of its own, its log kept, with
    policies in `namespace` selecting FUZZ and SANE pods."""
    apply(policy("fuzz"))
    apply(policy("sane"))
    ca = apiserver.make_ca(tmp_path, "fuzz-ca")
    cert, key = apiserver.make_cert(tmp_path, "fuzz-webhook", ca)
    log = tmp_path / "admission.log"
    server = ConversionServer(cluster, cert, key, free_port(), log=log)
    server.start()
    try:
        yield Served(server, ssl.create_default_context(cafile=str(ca[0])), log, namespace,
                     Path(ca[0]).read_bytes())
    finally:
        server.stop()


def injected(served: Served, name: str) -> dict[str, Any]:
    """The answer to a valid review of a SANE pod (a dry run: no rank kept)."""
    review = payloads.admission(f"sane-{name}", served.namespace,
                                payloads.pod(served.namespace, SANE))
    review["request"]["dryRun"] = True
    case = payloads.Case("sane", payloads.POD_PATH, json.dumps(review).encode(),
                         uid=f"sane-{name}")
    answer = probe.send(served.server.port, served.context, case)
    assert answer.status == 200, answer
    assert probe.problems(case, answer) == []
    response = json.loads(answer.body)["response"]
    assert response["allowed"] and "patch" in response, response
    return response


def test_hostile_webhook_payloads_are_answered_and_leak_nothing(served: Served) -> None:
    # The rules are reached: a valid pod is injected (the policy's bucket in the patch).
    first = injected(served, "before")
    assert b"ckpt-bucket" in base64.b64decode(first["patch"])
    corpus = payloads.Corpus(served.namespace, FUZZ)
    cases = [*webhook_valid.valid_cases(corpus), *corpus.cases()]
    figures = Figures()
    figures.rss_kib["before"] = probe.rss_kib(served.pid)
    failures: list[str] = []
    began = time.monotonic()
    for case in cases:
        answer = probe.send(served.server.port, served.context, case)
        figures.count(case, answer)
        failures.extend(f"{case.kind} at {case.path} (uid {str(case.uid)[:40]!r}): {p}"
                        for p in probe.problems(case, answer))
    figures.seconds = time.monotonic() - began
    figures.rss_kib["after"] = probe.rss_kib(served.pid)
    assert served.server.proc is not None and served.server.proc.poll() is None, \
        "the admission process died"
    injected(served, "after")
    # Freed memory goes back to the system once the process is quiet
    # (operator/heap.py): what is still held then is what the sample left.
    time.sleep(QUIET_S)
    figures.rss_kib["settled"] = probe.rss_kib(served.pid)
    written = os.environ.get(FIGURES_ENV)
    if written:
        Path(written).write_text(figures.text())
    print(figures.text())
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
    assert_clean_log(served)
    assert len(cases) >= 500
    # Every valid case was sent and counted (a false refusal is a failure above).
    assert sum(n for kind, n in figures.by_class.items() if kind.startswith("valid")) >= 15


def test_the_sample_sent_concurrently_is_answered_as_one_at_a_time(served: Served) -> None:
    corpus = payloads.Corpus(served.namespace, FUZZ)
    cases = [*webhook_valid.valid_cases(corpus), *corpus.cases()]

    def send(case: payloads.Case) -> list[str]:
        answer = probe.send(served.server.port, served.context, case)
        return [f"{case.kind} at {case.path} (uid {str(case.uid)[:40]!r}): {p}"
                for p in probe.problems(case, answer)]

    with ThreadPoolExecutor(CONCURRENT) as pool:
        failures = [p for found in pool.map(send, cases) for p in found]
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
    assert served.server.proc is not None and served.server.proc.poll() is None, \
        "the admission process died"
    injected(served, "after")
    assert_clean_log(served)


def assert_clean_log(served: Served) -> None:
    """Neither the planted secret nor a traceback in the admission log."""
    log = served.log.read_text(errors="replace")
    assert payloads.MARKER not in log, "the planted secret is in the admission log"
    assert "Traceback" not in log, log[log.index("Traceback") - 400:][:3000]


def test_valid_pods_created_through_the_apiserver_are_injected(
        served: Served, cluster: Cluster) -> None:
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
