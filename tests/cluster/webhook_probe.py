"""Sending a webhook_payloads.Case to the admission process over TLS, as
raw bytes (so that a lying Content-Length or a body never sent can be
said), and what its answer must be: 200 with a well-formed review that
echoes the uid exactly, or a 4xx naming what was wrong; never a 5xx, a
traceback, or MARKER."""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

from webhook_payloads import (
    ADMISSION_PATHS,
    CONVERT_PATH,
    MARKER,
    MAX_CONVERSION_BYTES,
    MAX_REVIEW_BYTES,
    PATCHED,
    POD_PATH,
    SUCCESS,
    Case,
)

#: The `?timeout=` sent with every admission case (a conversion is sent
#: none, as the apiserver sends it: the server then waits up to 30 s).
TIMEOUT_S = 5
#: No answer may take longer: a bound on a hang, not a timing target (the
#: sample's times are figures, recorded in docs/security.md, not asserted).
BOUND_S = 60.0
ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


@dataclass(frozen=True)
class Answer:
    status: int  # 0: none came
    body: bytes
    seconds: float
    error: str = ""


def _request(case: Case) -> bytes:
    path = case.path if "?" in case.path or case.path == CONVERT_PATH \
        else f"{case.path}?timeout={TIMEOUT_S}s"
    headers = {"Host": "127.0.0.1", **case.headers, "Connection": "close"}
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        headers["Content-Length"] = str(case.declared if case.declared is not None
                                        else len(case.body))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    target = path.encode("utf-8", "surrogatepass")
    return f"{case.method} ".encode() + target + b" HTTP/1.1\r\n" + head.encode() + b"\r\n"


def send(port: int, context: ssl.SSLContext, case: Case) -> Answer:
    """`case` sent on a connection of its own; the answer, or status 0 and why none came."""
    began = time.monotonic()
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S * 2)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(_request(case))
            # A body over the server's limit is refused by its length (413)
            # before it is read, and the connection closed: it is announced,
            # not sent, so that the answer is read rather than a reset.
            limit = MAX_CONVERSION_BYTES if case.path.startswith(CONVERT_PATH) \
                else MAX_REVIEW_BYTES
            if case.declared is None and len(case.body) <= limit:
                sock.sendall(case.body)
            response = http.client.HTTPResponse(sock, method=case.method)  # type: ignore[arg-type]
            response.begin()
            data = response.read()
            return Answer(response.status, data, time.monotonic() - began)
    except (OSError, http.client.HTTPException) as error:
        return Answer(0, b"", time.monotonic() - began, f"{type(error).__name__}: {error}")


def problems(case: Case, answer: Answer) -> list[str]:
    """What is wrong with `answer` to `case` ([] when nothing is)."""
    found = []
    if answer.status == 0:
        return [f"no answer ({answer.error}) after {answer.seconds:.1f}s"]
    if case.expect is not None:
        found.extend(_expectation_problems(case, answer))
    if answer.seconds > BOUND_S:
        found.append(f"answered after {answer.seconds:.1f}s (bound {BOUND_S}s)")
    if answer.status >= 500:
        found.append(f"status {answer.status}")
    if case.method == "HEAD" and answer.status == 405:
        return [*found] if answer.body == b"" else [*found, "a body in an answer to HEAD"]
    if b"Traceback" in answer.body:
        found.append("a traceback in the body")
    try:
        body = json.loads(answer.body)
    except ValueError:
        if MARKER.encode() in answer.body:
            found.append("the planted secret in the body")
        return [*found, f"status {answer.status} with a body that is not JSON: "
                        f"{answer.body[:200]!r}"]
    if MARKER in json.dumps(_echo_removed(body), ensure_ascii=False):
        found.append("the planted secret in the body")
    if not isinstance(body, dict):
        return [*found, f"a body that is not an object: {answer.body[:200]!r}"]
    if 400 <= answer.status < 500:
        message = body.get("error") or body.get("message")
        if not isinstance(message, str) or not message:
            found.append(f"status {answer.status} with no message: {body}")
    elif answer.status == 200:
        path = case.path.split("?")[0]
        if path == CONVERT_PATH:
            found.extend(_conversion_problems(case, body))
        elif path in ADMISSION_PATHS:
            found.extend(_admission_problems(case, body))
        else:
            found.append(f"200 at a path nothing serves: {path!r}")
    else:
        found.append(f"status {answer.status}")
    return found


def _expectation_problems(case: Case, answer: Answer) -> list[str]:
    """A valid case's answer is not what it must be: a false refusal."""
    seen = f"status {answer.status}: {answer.body[:300]!r}"
    try:
        response = json.loads(answer.body).get("response") or {}
    except (ValueError, AttributeError):
        return [f"expected {case.expect}, got {seen}"]
    if answer.status != 200 or not isinstance(response, dict):
        return [f"expected {case.expect}, got {seen}"]
    if case.expect == SUCCESS:
        ok = (response.get("result") or {}).get("status") == SUCCESS
    else:
        ok = response.get("allowed") is True and (case.expect != PATCHED or "patch" in response)
    return [] if ok else [f"expected {case.expect}, got {seen}"]


def _echo_removed(body: Any) -> Any:
    """`body` without a conversion's converted objects: the policies it was
    sent, annotations and all, are what a conversion answers."""
    response = body.get("response") if isinstance(body, dict) else None
    if isinstance(response, dict) and "convertedObjects" in response:
        return {**body, "response": {**response, "convertedObjects": []}}
    return body


def _uid_problems(case: Case, response: dict[str, Any]) -> list[str]:
    uid = response.get("uid")
    if not isinstance(uid, str):
        return [f"response.uid is {type(uid).__name__}, not a string"]
    if case.uid is None:
        return [] if uid == "" else [f"a uid echoed that no string uid gave: {uid[:80]!r}"]
    return [] if uid == case.uid else [f"uid {uid[:80]!r} echoed for {case.uid[:80]!r}"]


def _admission_problems(case: Case, body: dict[str, Any]) -> list[str]:
    found = []
    if body.get("kind") != "AdmissionReview" or body.get("apiVersion") not in ADMISSION_VERSIONS:
        found.append(f"not an AdmissionReview: {body.get('apiVersion')!r}, {body.get('kind')!r}")
    response = body.get("response")
    if not isinstance(response, dict):
        return [*found, "no response object"]
    found.extend(_uid_problems(case, response))
    if not isinstance(response.get("allowed"), bool):
        found.append("response.allowed is not a boolean")
    status = response.get("status")
    if status is not None:
        code = status.get("code") if isinstance(status, dict) else None
        if not isinstance(code, int) or code >= 500:
            found.append(f"response.status {status}")
        elif code == 400 and case.path.split("?")[0] == POD_PATH:
            # A malformed pod review is a webhook failure (HTTP 400), which
            # the pod webhook's failurePolicy decides, never a refused pod.
            found.append("a malformed pod review refused as a review, not an HTTP 400")
        elif not status.get("message"):
            found.append("a refusal with no message")
    if "patch" in response:
        try:
            patch = base64.b64decode(response["patch"], validate=True)
            json.loads(patch)
        except (binascii.Error, ValueError, TypeError):
            found.append("a patch that is not base64 JSON")
        else:
            if MARKER.encode() in patch:
                found.append("the planted secret in the patch")
    return found


def _conversion_problems(case: Case, body: dict[str, Any]) -> list[str]:
    found = []
    if body.get("kind") != "ConversionReview" or \
            body.get("apiVersion") != "apiextensions.k8s.io/v1":
        found.append(f"not a ConversionReview: {body.get('apiVersion')!r}, {body.get('kind')!r}")
    response = body.get("response")
    if not isinstance(response, dict):
        return [*found, "no response object"]
    found.extend(_uid_problems(case, response))
    result = response.get("result")
    if not isinstance(result, dict) or result.get("status") not in ("Success", "Failure"):
        found.append(f"response.result {result!r}")
    elif result["status"] == "Failure" and not result.get("message"):
        found.append("a Failure with no message")
    return found


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid`, in KiB."""
    with open(f"/proc/{pid}/status") as status:
        lines = dict(line.split(":", 1) for line in status if ":" in line)
    return {key: int(lines[key].split()[0]) for key in ("VmRSS", "VmHWM")}
