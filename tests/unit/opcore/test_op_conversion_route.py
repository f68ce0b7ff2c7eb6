"""/convert on the admission process's server: ConversionReviews reach the
converter's envelope (admission/conversion.py) and come back as it wrote
them, under bounds of their own (a larger size, slots apart from
admission's, the apiserver's timeout), counted as the webhook "conversion"; a converter that
breaks is answered with a Failure, never a dropped connection. Through a
real apiserver: tests/cluster/conversion/test_conversion_through_apiserver.py."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.admission_tls import serving

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, heap
from ckptdrain.operator.admission import conversion
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.connection_slots import Slots
from ckptdrain.operator.admission.policy_mirror import PolicyMirror

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def conversion_review(uid: str = "c-1", desired: str = "ckptdrain.io/v1beta1") -> dict[str, Any]:
    stored = {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
              "metadata": {"name": "llama", "namespace": "ml", "uid": "p-1"},
              "spec": {"selector": {"matchLabels": {"app": "a"}},
                       "model": {"parameters": "405B"}, "interval": "1d", "overlap": "0.1",
                       "localTier": {"path": "/mnt/ckptdrain/n"},
                       "storage": {"uri": "s3://bucket/p"}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": [stored]}}


class Recorder:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []
        self.seconds: list[float] = []

    def __call__(self, webhook: str, outcome: str, seconds: float) -> None:
        self.reports.append((webhook, outcome))
        self.seconds.append(seconds)


def test_a_conversion_review_is_answered_by_the_converters_envelope() -> None:
    recorder = Recorder()
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(), recorder)
    review = conversion_review()
    answer = asyncio.run(reviewer(review, CFG.conversion_path))
    assert answer == conversion.review_response(conversion_review())
    assert answer["kind"] == "ConversionReview"
    assert answer["response"]["uid"] == "c-1"
    assert answer["response"]["result"]["status"] == "Success"
    (converted,) = answer["response"]["convertedObjects"]
    assert converted["apiVersion"] == "ckptdrain.io/v1beta1"
    assert converted["metadata"] == conversion_review()["request"]["objects"][0]["metadata"]
    # The server's review is spent: its objects are dropped as converted.
    assert review["request"]["objects"] == [None]
    # A review the envelope refuses is answered (a Failure) and counted as an error.
    refused = asyncio.run(reviewer({"request": {"uid": "c-2"}}, CFG.conversion_path))
    assert refused["response"]["uid"] == "c-2"
    assert refused["response"]["result"]["status"] == "Failure"
    assert recorder.reports == [("conversion", "ok"), ("conversion", "error")]


def test_a_converter_that_breaks_is_answered_with_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(review: dict[str, Any], consume: bool = False) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(conversion, "review_response", broken)
    recorder = Recorder()
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(), recorder)
    answer = asyncio.run(reviewer(conversion_review("c-3"), CFG.conversion_path))
    assert answer["response"]["uid"] == "c-3"
    assert answer["response"]["result"]["status"] == "Failure"
    assert "RuntimeError" in answer["response"]["result"]["message"]
    assert "boom" not in answer["response"]["result"]["message"]  # the log has it
    assert "convertedObjects" not in answer["response"]
    assert recorder.reports == [("conversion", "error")]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[admission_server.Server, str, Recorder]]:
    """The admission server on a free port with a throw-away certificate."""
    recorder = Recorder()
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(), recorder)
    with serving(tmp_path, CFG, reviewer) as (server, cert):
        yield server, str(cert), recorder


def _connect(server: admission_server.Server, cert: str) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", server.server_address[1], timeout=10,
                                       context=ssl.create_default_context(cafile=cert))


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                   **(headers or {})})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_the_server_answers_convert_over_tls(
        served: tuple[admission_server.Server, str, Recorder]) -> None:
    server, cert, recorder = served
    conn = _connect(server, cert)
    body = json.dumps(conversion_review()).encode()
    # The path the apiserver calls (the CRD's clientConfig), with its timeout.
    status, answer = _post(conn, "/convert?timeout=30s", body)
    assert status == 200
    assert answer == conversion.review_response(conversion_review())
    # The same connection serves admission reviews too: one server, one port.
    status, _ = _post(conn, f"/{admission.VALIDATE_ID}", json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
         "request": {"uid": "u", "operation": "DELETE", "object": {}}}).encode())
    assert status == 200
    assert recorder.reports == [("conversion", "ok"), ("policy", "ok")]
    assert _post(conn, "/converts", body)[0] == 404


def _too_big(conn: http.client.HTTPSConnection, path: str, length: int) -> int:
    conn.request("POST", path, body=b"x" * 10, headers={"Content-Length": str(length)})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def _take_all(slots: Slots) -> int:
    taken = 0
    while slots.acquire(blocking=False):
        taken += 1
    return taken


def test_convert_has_bounds_of_its_own(
        served: tuple[admission_server.Server, str, Recorder]) -> None:
    """A ConversionReview carries a whole list: a larger cap than an
    AdmissionReview's, and slots of its own, so a burst of lists neither
    takes admission's slots nor waits for them."""
    server, cert, recorder = served
    conn = _connect(server, cert)
    assert admission_server.MAX_CONVERSION_BYTES > admission_server.MAX_REVIEW_BYTES
    assert _too_big(conn, "/convert", admission_server.MAX_CONVERSION_BYTES + 1) == 413
    assert _too_big(conn, f"/{admission.VALIDATE_ID}",
                    admission_server.MAX_REVIEW_BYTES + 1) == 413
    # Not a review: refused before the converter sees it.
    assert _post(conn, "/convert", b"[1]")[0] == 400
    conn.close()
    review = json.dumps(conversion_review()).encode()
    admissions = _take_all(server.in_flight)
    try:
        assert admissions == admission_server.MAX_IN_FLIGHT
        # Every admission slot taken: a conversion is still answered.
        assert _post(conn, "/convert?timeout=1s", review)[0] == 200
        conversions = _take_all(server.conversions)
        try:
            assert conversions == admission_server.CONVERSIONS_IN_FLIGHT
            # Its own slots taken: it waits until the apiserver's timeout, then 503.
            status, answer = _post(conn, "/convert?timeout=1s", review)
            assert status == 503 and "too many reviews" in answer["error"]
        finally:
            for _ in range(conversions):
                server.conversions.release()
    finally:
        for _ in range(admissions):
            server.in_flight.release()
    conn.close()
    assert _post(conn, "/convert", review)[0] == 200
    assert recorder.reports == [("conversion", "ok"), ("conversion", "ok")]


def test_a_list_larger_than_an_admission_review_is_converted(
        served: tuple[admission_server.Server, str, Recorder]) -> None:
    """`kubectl get ckpol -A` on a large cluster: every policy in one review."""
    server, cert, _ = served
    review = conversion_review()
    one = review["request"]["objects"][0]
    one["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Protected",
                                     "message": "x" * 3000, "lastTransitionTime":
                                     "2026-11-30T00:00:00Z"}]}
    review["request"]["objects"] = [
        {**one, "metadata": {**one["metadata"], "name": f"p{i}", "uid": f"u{i}"}}
        for i in range(2000)]
    body = json.dumps(review).encode()
    assert admission_server.MAX_REVIEW_BYTES < len(body) < admission_server.MAX_CONVERSION_BYTES
    status, answer = _post(_connect(server, cert), "/convert?timeout=30s", body)
    assert status == 200
    assert answer["response"]["result"]["status"] == "Success"
    assert [o["metadata"]["name"] for o in answer["response"]["convertedObjects"]] == [
        f"p{i}" for i in range(2000)]


def test_the_conversion_path_comes_from_the_chart() -> None:
    """webhook.conversionPath reaches the server as CKPTDRAIN_CONVERSION_PATH:
    the path the CRD names is the path answered."""
    assert CFG.conversion_path == "convert"
    moved = config.from_env({"CKPTDRAIN_CONVERSION_PATH": "/ckptdrain-convert"})
    assert moved.conversion_path == "ckptdrain-convert"
    reviewer = admission_process.Reviewer(moved, PolicyMirror(), Recorder())
    answer = asyncio.run(reviewer(conversion_review(), "ckptdrain-convert"))
    assert answer["kind"] == "ConversionReview"
    with pytest.raises(admission_server.UnknownWebhook):
        asyncio.run(reviewer(conversion_review(), "convert"))
    for bad in ("convert", "/", "/convert?x=1"):
        with pytest.raises(InvalidInput, match="CKPTDRAIN_CONVERSION_PATH"):
            config.from_env({"CKPTDRAIN_CONVERSION_PATH": bad})


def test_a_conversion_counts_its_wait_for_the_slot(
        served: tuple[admission_server.Server, str, Recorder]) -> None:
    """Its latency, like an admission's, runs from when the server began
    reading it: the wait for the slot is what the apiserver waited too."""
    server, cert, recorder = served
    assert server.conversions.acquire(blocking=False)
    threading.Timer(0.5, server.conversions.release).start()
    status, _ = _post(_connect(server, cert), "/convert?timeout=5s",
                      json.dumps(conversion_review()).encode())
    assert status == 200
    assert recorder.reports == [("conversion", "ok")]
    assert recorder.seconds[0] >= 0.45, recorder.seconds


def test_a_large_conversion_waits_for_the_slot_as_long_as_the_apiserver(
        served: tuple[admission_server.Server, str, Recorder]) -> None:
    """A list too large to read holding no slot, sent whole with no
    `?timeout=` (as the apiserver sends it, waiting at least 30 s), queued
    behind another conversion for longer than its body would be given
    (admission/body.py: 3 s and its length at 1 MiB/s), is converted: it
    awaits the slot until the review's deadline, and its body's own
    deadline starts once it has the slot."""
    server, cert, _ = served
    review = conversion_review()
    review["request"]["objects"] *= 2_000
    body = json.dumps(review).encode()
    assert admission_server.SMALL_BODY_BYTES < len(body) < 1 << 20
    assert server.conversions.acquire(blocking=False)
    releasing = threading.Timer(5.0, server.conversions.release)
    releasing.daemon = True  # a failing test leaves no thread to outlive it
    releasing.start()
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", server.server_address[1], timeout=40,
                                           context=ssl.create_default_context(cafile=cert))
        status, answer = _post(conn, "/convert", body)
    finally:
        releasing.cancel()
    assert (status, answer.get("error")) == (200, None)
    assert len(answer["response"]["convertedObjects"]) == len(review["request"]["objects"])


def test_a_conversion_keeps_the_heap_from_being_trimmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim takes the allocator's locks; one during a large list would
    stall it, as it would an admission (heap.py)."""
    monkeypatch.setattr(heap, "_last_busy", 0.0)
    reviewer = admission_process.Reviewer(CFG, PolicyMirror(), Recorder())
    reviewer.convert(conversion_review(), time.perf_counter())
    assert heap._last_busy > 0.0


#: The operator's own process at scale (docs/scale.md: 200-250 MiB with
#: 5,000 writer pods and 1,000 policies) and the admission process's before
#: any review (measured: 151 MiB), beside a conversion in one container.
OPERATOR_MIB, ADMISSION_BASELINE_MIB = 250, 151


def _policy(i: int) -> dict[str, Any]:
    review = conversion_review()
    one = review["request"]["objects"][0]
    return {**one, "metadata": {**one["metadata"], "name": f"p{i}", "uid": f"u{i}"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Protected",
                                       "message": "m" * 3000,
                                       "lastTransitionTime": "2026-11-30T00:00:00Z"}],
                       "lastRestoreAgreement": {"startedAt": 1764460000.25 + i}}}


def test_a_conversion_at_its_bound_fits_the_operators_memory_limit() -> None:
    """A review at the size cap, read, converted and encoded as the server
    does, measured: its peak beside both processes' own fits the chart's
    memory limit of the operator container (a 32 MiB review with the
    objects held twice did not)."""
    import tracemalloc

    chart = Path(__file__).resolve().parents[3] / "charts" / "ckptdrain"
    limit = yaml.safe_load((chart / "values.yaml").read_text())[
        "operator"]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    one = len(json.dumps(_policy(0)))
    count = admission_server.MAX_CONVERSION_BYTES // (one + 8)
    review = conversion_review()
    review["request"]["objects"] = [_policy(i) for i in range(count)]
    body = json.dumps(review).encode()
    del review
    assert admission_server.MAX_CONVERSION_BYTES * 0.95 < len(body) <= (
        admission_server.MAX_CONVERSION_BYTES)
    tracemalloc.start()
    try:
        answer = json.dumps(conversion.review_response(json.loads(body), consume=True)).encode()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert json.loads(answer)["response"]["result"]["status"] == "Success"
    peak_mib = (peak + len(body)) / (1 << 20)
    held = OPERATOR_MIB + ADMISSION_BASELINE_MIB + (
        admission_server.CONVERSIONS_IN_FLIGHT * peak_mib)
    assert held <= int(limit[:-2]), (peak_mib, held, limit)
