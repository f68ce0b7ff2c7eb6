"""What the admission process logs of a review it could not answer as
asked (admission/review_log.py): the request's uid, namespace and name and
what was wrong (the field, what was expected, the JSON type seen; an
error's type and frames), never a value of the review nor an error's
message; at most one line a minute of each kind after the first."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import review_log
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.admission.server import BadReview

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
SECRET = "hunter2-value"


def pod_review(**spec: Any) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "trainer-0", "labels": {"ckptdrain.io/inject": "true"},
                        "annotations": {"t": SECRET}},
           "spec": {"containers": [{"name": "c", "image": "i",
                                    "env": [{"name": "PASSWORD", "value": SECRET}]}], **spec}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-7", "operation": "CREATE", "namespace": "ml",
                        "name": "trainer-0", "object": pod}}


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ckptdrain.admission"]


def test_a_malformed_review_is_logged_by_uid_and_field_never_a_value(
        caplog: pytest.LogCaptureFixture) -> None:
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    caplog.set_level(logging.WARNING, "ckptdrain.admission")
    with pytest.raises(BadReview) as raised:
        asyncio.run(reviewer(pod_review(volumes=[SECRET]), admission.MUTATE_ID))
    assert "'u-7'" in str(raised.value)
    assert lines(caplog) == [
        "admission: refused a malformed pod review (uid 'u-7', namespace 'ml', name "
        "'trainer-0'): request.object.spec.volumes[0]: expected an object, got a string"]
    # The next within the minute is counted, not said.
    with pytest.raises(BadReview):
        asyncio.run(reviewer(pod_review(volumes=[SECRET]), admission.MUTATE_ID))
    assert len(lines(caplog)) == 1


def test_an_error_the_rules_meet_is_logged_by_uid_and_type_never_its_message(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: Any, **__: Any) -> list[dict[str, Any]]:
        raise KeyError(SECRET)
    monkeypatch.setattr(admission, "admit_pod", broken)
    caplog.set_level(logging.WARNING, "ckptdrain.admission")
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    answer = asyncio.run(reviewer(pod_review(), admission.MUTATE_ID))["response"]
    assert answer["status"] == {"code": 500, "message": (
        "ckptdrain admission failed (KeyError) for request uid 'u-7'; the admission "
        "process's log says where")}
    (line,) = lines(caplog)
    assert line.startswith("admission: the pod review (uid 'u-7', namespace 'ml', name "
                           "'trainer-0') failed with KeyError at process.py:")
    assert "in broken" in line
    assert SECRET not in caplog.text and "Traceback" not in caplog.text


def test_quoted_values_are_cut_and_cannot_forge_a_line() -> None:
    assert review_log.quoted("a\nb") == "'a\\nb'"
    assert review_log.quoted("u" * 1000) == repr("u" * 64) + "..."
    assert review_log.quoted({"a": SECRET}) == "an object"
    assert review_log.request_named({"request": [SECRET]}) == "request a list"


def test_each_kind_is_said_at_most_once_a_minute() -> None:
    now = [0.0]
    said: list[str] = []

    class Logger:
        def warning(self, fmt: str, *args: Any) -> None:
            said.append(fmt % args)

        error = warning

    log = review_log.ReviewLog(Logger(), clock=lambda: now[0])  # type: ignore[arg-type]
    error = KeyError(SECRET)
    for _ in range(3):
        log.failed("policy", pod_review(), error)
    now[0] = 61.0
    log.failed("policy", pod_review(), error)
    assert said == [
        "admission: the policy review (uid 'u-7', namespace 'ml', name 'trainer-0') failed "
        "with KeyError at ?",
        "admission: the policy review (uid 'u-7', namespace 'ml', name 'trainer-0') failed "
        "with KeyError at ? (and 2 more since the last such line)"]
