"""Admission in a process of its own: the pod and policy webhooks, and the
CheckpointPolicy CRD's conversion webhook, served beside the operator but
never behind it.

In the operator's process, an admission request waited for the event loop,
which also decodes and dispatches every pod event of every job: at
thousands of pods its p99 was 50-200 ms (docs/scale.md). Here it has an
interpreter to itself, its own view of the policies (admission/policy_mirror.py) and
of which pods hold which writer rank (admission/holder_mirror.py), so it waits for
nothing the operator does, and most admissions make no API call at all. It
loads neither Kopf nor an HTTP framework nor the `kubernetes` package: the
standard library's server, one thread per connection, one event loop for
the rules (admission/rules.py), whose API reads (apiserver/reads.py) run on its
threads.

The operator starts it (admission/supervisor.py) with the certificate
files it keeps, and starts it again if it dies. It serves until its
standard input closes (the operator is gone). On its standard output it
says when it listens and, one line each, every admission's webhook,
outcome and seconds, for the operator's metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckptdrain.contract.api import ANNOTATION_POLICY, KIND_POLICY, LABEL_INJECT, LABEL_WRITER
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, heap
from ckptdrain.operator.admission import (
    agent_images,
    conversion,
    holder_mirror,
    policy_mirror,
    policy_rules,
    review_log,
    review_shape,
)
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.certificates import Certificates
from ckptdrain.operator.admission.server import BadReview, Server, UnknownWebhook
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig

log = logging.getLogger("ckptdrain.admission")
#: What the operator reads on our standard output.
REPORT = "admitted"
READY = "ready"
ALIVE = "alive"
#: How often the event loop says it is alive (and its threads answer); the
#: operator starts the process again when it has been silent for long.
HEARTBEAT_S = 5.0
#: Report lines waiting for the operator to read them; more are dropped
#: rather than ever making an admission wait for a pipe.
REPORT_QUEUE = 10_000


class Reviewer:
    """Answers AdmissionReview requests, and ConversionReview requests at
    the configured conversion path (config.conversion_path)."""

    def __init__(self, cfg: OperatorConfig, mirror: policy_mirror.PolicyMirror,
                 report: Any = None, writers: holder_mirror.HolderMirror | None = None,
                 allowed: agent_images.AllowedImages | None = None) -> None:
        self.cfg, self.mirror, self.writers = cfg, mirror, writers
        self.pinning = None if allowed is None else agent_images.Pinning(
            allowed, writers.running if writers is not None else None)
        self.report = report or (lambda webhook, outcome, seconds: None)
        self.log = review_log.ReviewLog(log)

    async def __call__(self, request: dict[str, Any], path: str,
                       received: float | None = None) -> dict[str, Any]:
        """The response to `request`, which came to /`path`; `received`: when
        its connection began reading it (perf_counter), so that its time
        counts the wait for a slot and the read too."""
        if path == self.cfg.conversion_path:  # served in the connection's thread (serve())
            return self.convert(request, received)
        which = {admission.MUTATE_ID: "pod", admission.VALIDATE_ID: "policy",
                 admission.MUTATE_POLICY_ID: "policy-class"}.get(path)
        if which is None:
            raise UnknownWebhook(f"no webhook at /{path}")
        started, outcome = received or time.perf_counter(), "error"
        try:
            payload = review_shape.request_of(request)
            review_shape.check_request(payload, pod=which == "pod")
        except review_shape.MalformedReview as error:
            self.report(which, outcome, time.perf_counter() - started)
            self.log.malformed(which, request, error)
            refusal = review_shape.refusal(request, error)
            if which == "pod":
                # Not a refusal of the pod but a webhook failure (HTTP 400):
                # the pod webhook's failurePolicy decides, as it does when
                # the webhook cannot be reached (docs/pod-contract.md).
                raise BadReview(refusal["response"]["status"]["message"]) from None
            return refusal
        answer: dict[str, Any] = {"uid": payload["uid"], "allowed": True}
        warnings: list[str] = []
        heap.busy()  # no heap trim while admissions come in
        try:
            if which in ("pod", "policy-class"):
                ops = await (self._pod(payload, warnings) if which == "pod" else
                             self._policy_class(payload, warnings))
                if ops:
                    answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
                    answer["patchType"] = "JSONPatch"
            else:
                await self._policy(payload, warnings)
            outcome = "ok"
        except admission.Refused as refused:
            answer["allowed"] = False
            answer["status"] = {"message": str(refused), "code": refused.code}
        except Exception as error:  # answered, never a dropped connection
            self.log.failed(which, request, error)
            answer["allowed"] = False
            # Its type only: the message of a bare error may quote the review.
            answer["status"] = {"message": f"ckptdrain admission failed "
                                           f"({type(error).__name__}) for request uid "
                                           f"{review_log.quoted(payload['uid'])}; the "
                                           f"admission process's log says where", "code": 500}
        finally:
            self.report(which, outcome, time.perf_counter() - started)
        if warnings:
            answer["warnings"] = [str(w) for w in warnings]
        return {"apiVersion": request["apiVersion"], "kind": request["kind"],
                "response": answer}

    def convert(self, request: dict[str, Any], received: float | None = None
                ) -> dict[str, Any]:
        """The ConversionReview answering `request`: pure (no API call), so
        the server answers it in the connection's own thread, never on the
        admission loop. Counted as the webhook "conversion"; a Failure answer
        counts as an error."""
        started, outcome = received or time.perf_counter(), "error"
        heap.busy()  # no heap trim while a list is converted, as for admissions
        try:
            answer = conversion.review_response(request, consume=True)
            if (answer.get("response") or {}).get("result", {}).get("status") == "Success":
                outcome = "ok"
            return answer
        except Exception as error:  # answered as a Failure, never a dropped connection
            self.log.failed("conversion", request, error)
            payload = request.get("request")
            uid = payload.get("uid") if isinstance(payload, dict) else None
            return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                    "response": {"uid": uid if isinstance(uid, str) else "", "result": {
                        "status": "Failure",
                        "message": f"ckptdrain conversion failed ({type(error).__name__}) "
                                   f"for request uid {review_log.quoted(uid)}; the "
                                   f"admission process's log says where"}}}
        finally:
            self.report("conversion", outcome, time.perf_counter() - started)

    async def _pod(self, payload: dict[str, Any], warnings: list[str]) -> list[dict[str, Any]]:
        pod = payload.get("object")
        if payload.get("operation") != "CREATE" or not isinstance(pod, dict):
            return []
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        if labels.get(LABEL_INJECT) != "true":
            # The webhook's objectSelector sends only opted-in pods; one widened
            # by hand must still not inject pods the operator does not watch.
            return []
        namespace = payload.get("namespace") or meta.get("namespace") or ""
        writers = self.writers
        holders = None if writers is None else (
            lambda policy: writers.holders_of(namespace, policy))
        ops = await admission.admit_pod(pod, namespace, self.cfg, warnings, log,
                                        self.mirror.candidates(namespace, labels), holders,
                                        self.pinning,
                                        None if self.cfg.csi else self.mirror.every())
        claim = claimed_rank(ops)
        if writers is not None and claim is not None and not payload.get("dryRun"):
            # Held from now on, for this process, until the pod's own event.
            writers.claimed(namespace, *claim)
        return ops

    async def _policy(self, payload: dict[str, Any], warnings: list[str]) -> None:
        body, old = payload.get("object"), payload.get("oldObject")
        if payload.get("operation") not in ("CREATE", "UPDATE") or not isinstance(body, dict):
            return
        if body.get("kind", KIND_POLICY) != KIND_POLICY:
            # Not judged as a policy: the webhook is registered for policies
            # only, so only a rule widened by hand (or a forger) sends another
            # kind, and a Secret's fields are no CheckpointPolicy's.
            return
        await policy_rules.admit_policy(
            body, old if payload.get("operation") == "UPDATE" and isinstance(old, dict) else None,
            str(payload.get("namespace") or ""), self.cfg, requested_version(payload),
            self.mirror.every(), warnings)

    async def _policy_class(self, payload: dict[str, Any], warnings: list[str]
                            ) -> list[dict[str, Any]]:
        body = payload.get("object")
        if payload.get("operation") != "CREATE" or not isinstance(body, dict):
            return []
        return await policy_rules.default_class_patch(body, warnings,
                                                      str(payload.get("namespace") or ""))


def requested_version(payload: dict[str, Any]) -> str | None:
    """The apiVersion the user's request was made at: a webhook registered
    for one version with matchPolicy Equivalent is sent the object
    converted, and requestKind says what was written. None: not said."""
    kind = payload.get("requestKind")
    if not isinstance(kind, dict) or not kind.get("group") or not kind.get("version"):
        return None
    return f"{kind['group']}/{kind['version']}"


def claimed_rank(ops: list[dict[str, Any]]) -> tuple[str, int] | None:
    """(policy, rank) an injection patch gives a pod, or None (no rank)."""
    labels: dict[str, Any] = {}
    notes: dict[str, Any] = {}
    for op in ops:
        path, value = op.get("path", ""), op.get("value")
        if path == "/metadata/labels" and isinstance(value, dict):
            labels.update(value)
        elif path == "/metadata/annotations" and isinstance(value, dict):
            notes.update(value)
        elif path.startswith("/metadata/labels/"):
            labels[_unpointer(path.removeprefix("/metadata/labels/"))] = value
        elif path.startswith("/metadata/annotations/"):
            notes[_unpointer(path.removeprefix("/metadata/annotations/"))] = value
    rank, policy = labels.get(LABEL_WRITER), notes.get(ANNOTATION_POLICY)
    if isinstance(rank, str) and rank.isdigit() and isinstance(policy, str):
        return policy, int(rank)
    return None


def _unpointer(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


class Reports:
    """Lines for the operator on our standard output, written by a thread of
    their own from a bounded queue: an operator that stops reading (frozen,
    busy) never makes an admission wait; what does not fit is dropped."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.queue: queue.Queue[str] = queue.Queue(REPORT_QUEUE)
        self.dropped = 0
        threading.Thread(target=self._write, name="ckptdrain-admission-reports",
                         daemon=True).start()

    def _write(self) -> None:
        while True:
            line = self.queue.get()
            try:
                self.out.write(line + "\n")
                self.out.flush()
            except (OSError, ValueError):  # the operator is gone: we leave with it
                return

    def _say(self, line: str) -> None:
        try:
            self.queue.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def admitted(self, which: str, outcome: str, seconds: float) -> None:
        self._say(f"{REPORT} {which} {outcome} {seconds:.6f}")

    def ready(self) -> None:
        self._say(READY)

    def alive(self) -> None:
        self._say(ALIVE)


async def heartbeat(reports: Reports) -> None:
    """Say ALIVE every HEARTBEAT_S while the event loop runs: a process whose
    loop is stuck falls silent, and the operator replaces it. (Its threads'
    reads are bounded by their timeouts, and a review by its deadline.)"""
    while True:
        reports.alive()
        await asyncio.sleep(HEARTBEAT_S)


def _exit_with_parent() -> None:
    """Leave when the operator is gone: its end of our standard input closes."""
    def wait() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            os._exit(0)
    threading.Thread(target=wait, name="ckptdrain-admission-parent", daemon=True).start()


def start_loop(reports: Reports) -> asyncio.AbstractEventLoop:
    """The event loop the reviews run on, in a thread, with its heartbeat."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="ckptdrain-admission-loop",
                     daemon=True).start()
    asyncio.run_coroutine_threadsafe(heartbeat(reports), loop)
    return loop


def serve(cfg: OperatorConfig, cert: str, key: str, reviewer: Reviewer,
          reports: Reports, loop: asyncio.AbstractEventLoop) -> None:
    """Serve until the process ends."""
    certificates = Certificates(cert, key, cfg.webhook_client_ca)
    certificates.follow()
    server = Server((cfg.webhook_addr, cfg.webhook_port), certificates, reviewer, loop,
                    converter=reviewer.convert, conversion_path=cfg.conversion_path)
    log.info("admission: serving on %s:%d", cfg.webhook_addr, cfg.webhook_port)
    reports.ready()
    server.serve_forever()


def warm_up(namespace: str, connections: int = 4) -> None:
    """Open connections to the apiserver before the first review: a job's
    first pods arrive together, and each would otherwise wait for a TLS
    handshake of its own and the client's first set-up."""
    def look(_: int) -> None:
        try:
            apiserver_reads.live_writers(namespace or "default", "ckptdrain-warm-up", 0,
                                         cached=True)
        except Exception as error:  # only a head start: the reviews will say
            log.debug("admission: warm-up read failed: %s", error)
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(look, range(connections)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptdrain.operator.admission.process")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s")
    try:
        cfg = config.from_env()
    except InvalidInput as error:
        print(f"ckptdrain admission: {error}", file=sys.stderr)
        return error.exit_code
    _exit_with_parent()
    heap.start()  # few malloc arenas for its many threads, trimmed when quiet
    reports = Reports(sys.stdout)
    loop = start_loop(reports)  # its heartbeat runs from here on
    apiserver_reads.connection()  # one, made before the threads below share it
    mirror = policy_mirror.PolicyMirror()
    policy_mirror.start(mirror, cfg.namespace, log, threading.Event())
    writers = holder_mirror.HolderMirror(cfg.namespace)
    holder_mirror.start(writers, cfg.namespace, log, threading.Event())
    class_view.start(log)  # the CheckpointClasses policies and pods are judged under
    allowed = None
    if cfg.agent_images:
        allowed = agent_images.AllowedImages(cfg)
        agent_images.follow(allowed, threading.Event())
    warm_up(cfg.namespace)
    serve(cfg, args.cert, args.key,
          Reviewer(cfg, mirror, reports.admitted, writers, allowed), reports, loop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
