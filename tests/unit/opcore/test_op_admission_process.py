"""The admission process's parts without a server: its view of the policies
(policy_mirror.py), the review it answers (admission_process.Reviewer), the
reports the operator reads back (admission_supervisor.observe), and how it
finds a rank's holders (apiserver_reads.writer_selectors). The process itself, through
a real apiserver, is in tests/cluster/test_admission_process.py."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.operator import config, metrics
from ckptdrain.operator.admission import certificates as admission_certificates
from ckptdrain.operator.admission import injection
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission import supervisor as admission_supervisor
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def body(name: str, app: str, namespace: str = "ml", writers: int = 2,
         version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
            "spec": {"selector": {"matchLabels": {"app": app}}, "model": {"parameters": "7B"},
                     "interval": "10m", "writers": writers,
                     "localTier": {"path": "/mnt/ckptdrain/n"},
                     "storage": {"uri": "s3://bucket/p"}}}


def names(found: list[dict[str, Any]] | None) -> list[str] | None:
    return None if found is None else sorted(b["metadata"]["name"] for b in found)


def test_the_mirror_offers_nothing_until_listed_and_follows_every_event() -> None:
    mirror = PolicyMirror()
    assert mirror.candidates("ml", {"app": "a"}) is None  # not listed yet: ask the apiserver
    mirror.replace([body("pa", "a"), body("pb", "b"), body("pa", "a", namespace="other")], "10")
    assert mirror.version == "10"
    assert names(mirror.candidates("ml", {"app": "a", "team": "x"})) == ["pa"]
    mirror.apply("ADDED", body("pc", "a", version="11"))
    assert names(mirror.candidates("ml", {"app": "a"})) == ["pa", "pc"]
    # A selector that changes moves the policy to its new label pair.
    mirror.apply("MODIFIED", body("pa", "z", version="12"))
    assert names(mirror.candidates("ml", {"app": "a"})) == ["pc"]
    assert names(mirror.candidates("ml", {"app": "z"})) == ["pa"]
    mirror.apply("DELETED", body("pc", "a", version="13"))
    assert names(mirror.candidates("ml", {"app": "a"})) == []
    mirror.apply("BOOKMARK", {"metadata": {"resourceVersion": "20"}})
    assert mirror.version == "20"
    # A selector without a label pair is a candidate for every pod.
    wide = body("wide", "x")
    wide["spec"]["selector"] = {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
    mirror.apply("ADDED", wide)
    assert names(mirror.candidates("ml", {"team": "x"})) == ["wide"]
    mirror.lost()  # a failed watch: nothing offered until the next list
    assert mirror.candidates("ml", {"app": "z"}) is None
    mirror.replace([body("pb", "b")], "30")
    assert names(mirror.candidates("ml", {"app": "z"})) == []
    assert names(mirror.candidates("ml", {"app": "b"})) == ["pb"]


def review(path: str, operation: str, obj: dict[str, Any], namespace: str = "ml"
           ) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": namespace,
                        "object": obj}}


def job_pod(index: int, app: str = "a") -> dict[str, Any]:
    return {"metadata": {"generateName": "w-", "namespace": "ml",
                         "labels": {"app": app, "ckptdrain.io/inject": "true"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": "train", "controller": True,
                                              "uid": "j-1"}]},
            "spec": {"containers": [{"name": "trainer", "image": "t"}]}}


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"listed": [], "holders": []}

    def list_policies(namespace: str, timeout: float = 5) -> list[dict[str, Any]]:
        state["listed"].append(namespace)
        return state.get("policies", [])

    monkeypatch.setattr(apiserver_reads, "list_policies", list_policies)
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *_: None)
    monkeypatch.setattr(apiserver_reads, "read_object", lambda *ref: {"spec": {"completions": 2}})
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: list(state["holders"]))
    return state


def run(reviewer: admission_process.Reviewer, request: dict[str, Any], path: str
        ) -> dict[str, Any]:
    return asyncio.run(reviewer(request, path))["response"]


def test_a_selected_pod_is_injected_from_the_view_with_no_list(
        apiserver: dict[str, Any]) -> None:
    reports: list[tuple[str, str]] = []
    mirror = PolicyMirror()
    mirror.replace([body("llama", "a")], "1")
    reviewer = admission_process.Reviewer(CFG, mirror, lambda w, o, s: reports.append((w, o)))
    answer = run(reviewer, review(admission.MUTATE_ID, "CREATE", job_pod(1)), admission.MUTATE_ID)
    assert answer["uid"] == "u-1" and answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    labels = {op["path"]: op["value"] for op in ops if op["path"].startswith("/metadata/labels/")}
    assert labels == {"/metadata/labels/ckptdrain.io~1writer": "1",
                      "/metadata/labels/ckptdrain.io~1writer-policy": "llama",
                      "/metadata/labels/ckptdrain.io~1policy": "llama"}
    assert apiserver["listed"] == []  # the view answered
    assert reports == [("pod", "ok")]


def test_a_refusal_and_a_bare_pod_are_answered_with_their_reasons(
        apiserver: dict[str, Any]) -> None:
    reports: list[tuple[str, str]] = []
    mirror = PolicyMirror()
    reviewer = admission_process.Reviewer(CFG, mirror, lambda w, o, s: reports.append((w, o)))
    # The view is not current: the apiserver is asked, and nothing selects the
    # opted-in pod: refused (CKPTDRAIN_UNSELECTED_PODS defaults to Refuse).
    answer = run(reviewer, review(admission.MUTATE_ID, "CREATE", job_pod(0)), admission.MUTATE_ID)
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert apiserver["listed"] == ["ml"]
    assert "no CheckpointPolicy in ml selects this pod" in answer["status"]["message"]
    # A live pod holds the rank: refused with the apiserver's word and a 409.
    mirror.replace([body("llama", "a")], "1")
    apiserver["holders"] = ["w-old"]
    answer = run(reviewer, review(admission.MUTATE_ID, "CREATE", job_pod(1)), admission.MUTATE_ID)
    assert answer["allowed"] is False and answer["status"]["code"] == 409
    assert "which live pod w-old already holds" in answer["status"]["message"]
    # A bad policy: refused naming the field.
    bad = body("llama", "a")
    bad["spec"]["localTier"]["path"] = "/etc"
    answer = run(reviewer, review(admission.VALIDATE_ID, "CREATE", bad), admission.VALIDATE_ID)
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert "localTier.path" in answer["status"]["message"]
    answer = run(reviewer, review(admission.VALIDATE_ID, "UPDATE", body("llama", "a")),
                 admission.VALIDATE_ID)
    assert answer["allowed"] is True
    assert reports == [("pod", "error"), ("pod", "error"), ("policy", "error"),
                       ("policy", "ok")]
    with pytest.raises(admission_server.UnknownWebhook):
        run(reviewer, review("elsewhere", "CREATE", job_pod(1)), "elsewhere")


def test_an_unexpected_failure_is_answered_not_dropped(
        apiserver: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(namespace: str) -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(apiserver_reads, "list_policies", broken)
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    answer = run(reviewer, review(admission.MUTATE_ID, "CREATE", job_pod(0)), admission.MUTATE_ID)
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    # The error's kind, never its text: a bare error may quote the review.
    assert "RuntimeError" in answer["status"]["message"]
    assert "boom" not in answer["status"]["message"]


def test_the_operator_reads_the_reports_into_its_metrics() -> None:
    before = metrics.WEBHOOK_SECONDS.labels("pod", "ok")._sum.get()  # type: ignore[attr-defined]
    assert admission_supervisor.observe("admitted pod ok 0.250000")
    after = metrics.WEBHOOK_SECONDS.labels("pod", "ok")._sum.get()  # type: ignore[attr-defined]
    assert after - before == pytest.approx(0.25)
    for line in ("admitted pod ok", "hello", "admitted pod ok soon"):
        assert not admission_supervisor.observe(line)


def test_a_ranks_holders_are_found_by_writer_and_policy_and_older_pods_too() -> None:
    assert apiserver_reads.writer_selectors("llama", 3) == [
        "ckptdrain.io/writer=3,ckptdrain.io/writer-policy=llama",
        "ckptdrain.io/writer=3,!ckptdrain.io/writer-policy"]
    long_name = "p" * 64  # too long for a label value: found by rank alone
    assert apiserver_reads.writer_selectors(long_name, 0) == ["ckptdrain.io/writer=0"]
    p = policy.parse("ml", long_name, body(long_name, "a")["spec"], CFG)
    ops = injection.build_pod_patch(job_pod(0), p, CFG, default_rate=1e9, rank=0)
    assert not [op for op in ops if "writer-policy" in op["path"]]
    assert [op for op in ops if op["path"] == "/metadata/labels/ckptdrain.io~1writer"]


def test_the_client_configuration_kopf_is_given_names_the_process_and_its_ca(
        tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"CA-ONE")
    server = admission_supervisor.RemoteServer(
        config.OperatorConfig(webhook_host="ckptdrain.ops.svc", webhook_port=9443), str(ca))

    async def first() -> dict[str, Any]:
        async for client_config in server(None):
            return client_config
        raise AssertionError("nothing yielded")

    got = asyncio.run(first())
    assert got == {"url": "https://ckptdrain.ops.svc:9443",
                   "caBundle": base64.b64encode(b"CA-ONE").decode()}


def _certificate(directory: Path, host: str = "127.0.0.1") -> tuple[str, str]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName=IP:{host}"], check=True, capture_output=True)
    return str(cert), str(key)


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_the_server_answers_reviews_over_tls_and_survives_what_is_not_one(
        tmp_path: Path, apiserver: dict[str, Any]) -> None:
    cert, key = _certificate(tmp_path)
    certificates = admission_certificates.Certificates(cert, key)
    reports: list[tuple[str, str]] = []
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(),
                                          lambda w, o, s: reports.append((w, o)))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = admission_server.Server(("127.0.0.1", 0), certificates, reviewer, loop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        # A connection that never speaks TLS (a tcpSocket readiness probe).
        socket.create_connection(("127.0.0.1", port)).close()
        trusted = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
        good = json.dumps(review(admission.VALIDATE_ID, "CREATE", body("llama", "a"))).encode()
        status, answer = _post(conn, "/" + admission.VALIDATE_ID, good)
        assert status == 200 and answer["response"] == {"uid": "u-1", "allowed": True}
        bad = body("llama", "a")
        bad["spec"]["localTier"]["path"] = "/etc"
        status, answer = _post(conn, "/" + admission.VALIDATE_ID, json.dumps(
            review(admission.VALIDATE_ID, "CREATE", bad)).encode())  # the same connection
        assert status == 200 and answer["response"]["allowed"] is False
        assert answer["response"]["status"]["code"] == 422
        assert _post(conn, "/elsewhere", good)[0] == 404
        # An error answer ends its connection (what is left of the request is
        # not read); the next request opens another.
        conn.request("POST", "/" + admission.VALIDATE_ID, body=b"x" * 10,
                     headers={"Content-Length": str(admission_server.MAX_REVIEW_BYTES + 1)})
        too_big = conn.getresponse()
        assert too_big.status == 413 and too_big.getheader("Connection") == "close"
        too_big.read()
        conn.close()
        assert _post(conn, "/" + admission.VALIDATE_ID, b"[1, 2]")[0] == 400
        assert reports == [("policy", "ok"), ("policy", "error")]
        # A renewed certificate is served to new connections.
        old = Path(cert).read_bytes()
        _certificate(tmp_path)
        assert Path(cert).read_bytes() != old
        assert certificates.check() and not certificates.check()
        renewed = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=renewed, timeout=10)
        assert _post(conn, "/" + admission.VALIDATE_ID, good)[0] == 200
        stale = http.client.HTTPSConnection("127.0.0.1", port, context=trusted, timeout=10)
        with pytest.raises(ssl.SSLError):
            _post(stale, "/" + admission.VALIDATE_ID, good)
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)


def test_a_pod_that_did_not_opt_in_is_never_injected(apiserver: dict[str, Any]) -> None:
    mirror = PolicyMirror()
    mirror.replace([body("llama", "a")], "1")
    reviewer = admission_process.Reviewer(CFG, mirror)
    bare = job_pod(1)
    del bare["metadata"]["labels"]["ckptdrain.io/inject"]  # a selector widened by hand
    answer = run(reviewer, review(admission.MUTATE_ID, "CREATE", bare), admission.MUTATE_ID)
    assert answer == {"uid": "u-1", "allowed": True}
    # A review without its request part is answered, not dropped: an HTTP
    # 400 (BadReview) naming what was wrong, which the pod webhook's
    # failurePolicy decides.
    with pytest.raises(admission_server.BadReview, match="ckptdrain admission: request: "
                                                         "expected an object, got a string"):
        asyncio.run(reviewer({"apiVersion": "admission.k8s.io/v1",
                              "kind": "AdmissionReview", "request": "junk"},
                             admission.MUTATE_ID))


def test_reports_never_wait_for_an_operator_that_does_not_read() -> None:
    read_end, write_end = os.pipe()
    try:
        reports = admission_process.Reports(os.fdopen(write_end, "w"))
        began = time.monotonic()
        for _ in range(admission_process.REPORT_QUEUE + 50_000):
            reports.admitted("pod", "ok", 0.01)
        assert time.monotonic() - began < 10  # no call waited for the full pipe
        assert reports.dropped > 0
        first = os.read(read_end, 64).decode()
        assert first.startswith("admitted pod ok 0.010000\n")
    finally:
        os.close(read_end)


def test_a_silent_admission_process_is_killed_and_started_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    script = ("import sys, time; print('ready', flush=True); time.sleep(120)")
    monkeypatch.setattr(admission_supervisor, "command",
                        lambda files: [sys.executable, "-c", script])
    monkeypatch.setattr(admission_supervisor, "SILENT_S", 2.0)
    supervisor = admission_supervisor.Supervisor(("c", "k", None), logging.getLogger("t"))
    supervisor.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(started) < 2:
            process = supervisor.process
            if process is not None and process.pid not in started:
                started.append(process.pid)
            time.sleep(0.1)
        assert len(started) >= 2, "a silent process was not replaced"
        assert supervisor.ready.is_set()
    finally:
        supervisor.stop()


def test_a_review_lasts_as_long_as_the_apiserver_waits_for_it() -> None:
    assert admission_server.request_timeout("timeout=5s") == 5.0
    assert admission_server.request_timeout("a=b&timeout=2.5s") == 2.5
    assert admission_server.request_timeout("timeout=100s") == 30.0
    assert admission_server.request_timeout("") == admission_server.ANSWER_TIMEOUT_S
    assert admission_server.request_timeout("timeout=xs") == admission_server.ANSWER_TIMEOUT_S
