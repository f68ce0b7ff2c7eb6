"""Client certificates on the admission process's server
(CKPTDRAIN_WEBHOOK_CLIENT_CA): a forged AdmissionReview from a pod that
reaches the Service gets no injection patch back, neither without a client
certificate nor with one from another CA; the apiserver's certificate gets
the answer; the conversion path, to which the apiserver never presents a
client certificate, stays open. A real TLS server on a free port."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.apiserver import make_ca, make_cert

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import certificates as admission_certificates
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import reads as apiserver_reads

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def _policy() -> dict[str, Any]:
    return {"metadata": {"name": "tenant-a", "namespace": "team-a", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
                     "interval": "10m", "writers": 2,
                     "localTier": {"path": "/mnt/ckptdrain/n"},
                     "storage": {"uri": "s3://tenant-a-bucket/secret-prefix"}}}


def _forged_pod_review() -> bytes:
    """What a hostile pod posts: a pod 'in tenant A's namespace'."""
    pod = {"metadata": {"generateName": "w-", "namespace": "team-a",
                        "labels": {"app": "a", "ckptdrain.io/inject": "true"},
                        "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                             "name": "train", "controller": True,
                                             "uid": "j-1"}]},
           "spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "operation": "CREATE",
                                   "namespace": "team-a", "object": pod}}).encode()


def _conversion_review() -> bytes:
    stored = {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
              **_policy()}
    return json.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                       "request": {"uid": "c-1", "desiredAPIVersion": "ckptdrain.io/v1beta1",
                                   "objects": [stored]}}).encode()


@dataclass
class Served:
    server: admission_server.Server
    certificates: admission_certificates.Certificates
    server_ca: Path
    client_ca: Path
    apiserver_client: tuple[Path, Path]
    reports: list[tuple[str, str]]
    directory: Path

    def connect(self, client: tuple[Path, Path] | None) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.server_ca))
        if client is not None:
            context.load_cert_chain(str(client[0]), str(client[1]))
        return http.client.HTTPSConnection("127.0.0.1", self.server.server_address[1],
                                           context=context, timeout=10)


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda *_, **__: [])
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *_: None)
    monkeypatch.setattr(apiserver_reads, "read_object", lambda *_: {"spec": {"completions": 2}})
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *_, **__: [])
    server_ca = make_ca(tmp_path, "serving-ca")
    cert, key = make_cert(tmp_path, "webhook", server_ca)
    client_ca = make_ca(tmp_path, "client-ca")
    apiserver_client = make_cert(tmp_path, "apiserver", client_ca, sans=("DNS:apiserver",))
    mirror = PolicyMirror()
    mirror.replace([_policy()], "1")
    reports: list[tuple[str, str]] = []
    reviewer = admission_process.Reviewer(CFG, mirror, lambda w, o, s: reports.append((w, o)))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    certificates = admission_certificates.Certificates(str(cert), str(key), str(client_ca[0]))
    server = admission_server.Server(("127.0.0.1", 0), certificates, reviewer, loop,
                                     converter=reviewer.convert,
                                     conversion_path=CFG.conversion_path)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Served(server, certificates, server_ca[0], client_ca[0], apiserver_client,
                     reports, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)


def test_the_apiservers_certificate_gets_the_injection_patch(served: Served) -> None:
    status, answer = _post(served.connect(served.apiserver_client),
                           "/" + admission.MUTATE_ID, _forged_pod_review())
    assert status == 200
    assert answer["response"]["allowed"] is True and answer["response"]["patch"]
    assert served.reports == [("pod", "ok")]


def test_a_review_without_a_client_certificate_gets_no_patch(served: Served) -> None:
    status, answer = _post(served.connect(None), "/" + admission.MUTATE_ID,
                           _forged_pod_review())
    assert status == 403
    assert answer["kind"] == "Status" and "CKPTDRAIN_WEBHOOK_CLIENT_CA" in answer["message"]
    assert "response" not in answer
    assert served.reports == []  # never reviewed: no writer rank claimed either


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ckptdrain.admission")
    other_ca = make_ca(served.directory, "other-ca")
    forged = make_cert(served.directory, "forged", other_ca, sans=("DNS:apiserver",))
    conn = served.connect(forged)
    # TLS 1.3 finishes the client's side of the handshake before the server
    # has checked its certificate: the refusal arrives at the first read.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _post(conn, "/" + admission.MUTATE_ID, _forged_pod_review())
    assert served.reports == []
    # Said in the operator's log, for whoever watches for such attempts.
    deadline = time.monotonic() + 5
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [r.getMessage() for r in caplog.records if "refused a client certificate"
            in r.getMessage()], caplog.text


def test_a_forger_retrying_gets_one_warning_not_one_per_connection(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ckptdrain.admission")
    other_ca = make_ca(served.directory, "other-ca")
    forged = make_cert(served.directory, "forged", other_ca, sans=("DNS:apiserver",))
    for _ in range(5):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _post(served.connect(forged), "/" + admission.MUTATE_ID, _forged_pod_review())
    # The server's thread logs after the client has seen the refusal: wait
    # for the first line, then long enough for any others to have come.
    deadline = time.monotonic() + 5
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    said = [r.getMessage() for r in caplog.records
            if "refused a client certificate" in r.getMessage()]
    assert len(said) == 1, said
    assert served.reports == []


def test_client_renegotiation_is_off(tmp_path: Path) -> None:
    """A renegotiation would let a client ask for a new handshake mid-connection
    (TLS 1.2): work the server does on the client's say, with or without a
    client CA."""
    if not hasattr(ssl, "OP_NO_RENEGOTIATION"):
        pytest.skip("this OpenSSL has no OP_NO_RENEGOTIATION")
    ca = make_ca(tmp_path)
    cert, key = make_cert(tmp_path, "webhook", ca)
    for client_ca in (None, str(ca[0])):
        context = admission_certificates.Certificates(str(cert), str(key), client_ca).context()
        assert context.options & ssl.OP_NO_RENEGOTIATION


def test_the_conversion_path_stays_open_without_a_client_certificate(
        served: Served) -> None:
    status, answer = _post(served.connect(None), "/convert", _conversion_review())
    assert status == 200
    assert answer["response"]["result"]["status"] == "Success"
    (converted,) = answer["response"]["convertedObjects"]
    assert converted["apiVersion"] == "ckptdrain.io/v1beta1"


def test_a_renewed_client_ca_is_trusted_by_new_connections(served: Served) -> None:
    renewed_ca = make_ca(served.directory, "client-ca")  # the same file, rewritten
    assert Path(served.client_ca).read_bytes() == renewed_ca[0].read_bytes()
    assert served.certificates.check()
    renewed_client = make_cert(served.directory, "apiserver-2", renewed_ca,
                               sans=("DNS:apiserver",))
    status, _ = _post(served.connect(renewed_client), "/" + admission.MUTATE_ID,
                      _forged_pod_review())
    assert status == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):  # signed by the CA replaced
        _post(served.connect(served.apiserver_client), "/" + admission.MUTATE_ID,
              _forged_pod_review())


def test_without_a_client_ca_no_certificate_is_asked(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = make_cert(tmp_path, "webhook", ca)
    context = admission_certificates.Certificates(str(cert), str(key)).context()
    assert context.verify_mode == ssl.CERT_NONE


def test_the_client_ca_setting_names_itself_when_refused(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)[0]
    assert config.from_env({"CKPTDRAIN_WEBHOOK_CLIENT_CA": str(ca)}).webhook_client_ca == str(ca)
    assert config.from_env({}).webhook_client_ca is None
    with pytest.raises(InvalidInput) as missing:
        config.from_env({"CKPTDRAIN_WEBHOOK_CLIENT_CA": str(tmp_path / "absent.crt")})
    assert missing.value.field == "CKPTDRAIN_WEBHOOK_CLIENT_CA"
    with pytest.raises(InvalidInput) as in_process:
        config.from_env({"CKPTDRAIN_WEBHOOK_CLIENT_CA": str(ca),
                         "CKPTDRAIN_WEBHOOK_PROCESS": "false"})
    assert in_process.value.field == "CKPTDRAIN_WEBHOOK_CLIENT_CA"
    assert "CKPTDRAIN_WEBHOOK_PROCESS" in str(in_process.value)
