"""Admission in a process of its own: the pod and policy webhooks, served
beside the operator but never behind it.

In the operator's process, an admission request waited for the event loop,
which also decodes and dispatches every pod event of every job: at
thousands of pods its p99 was 50-200 ms (docs/scale.md). Here it has an
interpreter to itself, its own view of the policies (policy_mirror.py) and
the apiserver's watch cache for the holders of a rank, so it waits for
nothing the operator does. It loads neither Kopf nor an HTTP framework:
the standard library's server, one thread per connection, and one event
loop for the rules (admission.py), whose API reads run on its threads.

The operator starts it (admission_supervisor.py) with the certificate
files it keeps, and starts it again if it dies. It serves until its
standard input closes (the operator is gone). On its standard output it
says when it listens and, one line each, every admission's webhook,
outcome and seconds, for the operator's metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import os
import queue
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from urllib3.util.retry import Retry

from ckptdrain.contract.api import LABEL_INJECT
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import admission, config, heap, kube, policy_mirror
from ckptdrain.operator.config import OperatorConfig

log = logging.getLogger("ckptdrain.admission")
#: What the operator reads on our standard output.
REPORT = "admitted"
READY = "ready"
ALIVE = "alive"
#: How often the certificate files are read for a renewal (webhook_tls.py
#: renews them in place; a mounted Secret changes under us).
CERT_CHECK_S = 30.0
#: The largest review we read: a pod near etcd's object size limit, encoded.
MAX_REVIEW_BYTES = 4 << 20
#: Connections open at once, and reviews read and answered at once (so at
#: most MAX_IN_FLIGHT × MAX_REVIEW_BYTES are held).
MAX_CONNECTIONS = 128
MAX_IN_FLIGHT = 8
#: A TLS handshake must be done within this; a connection idle this long is
#: closed (the apiserver opens another).
HANDSHAKE_S = 10.0
IDLE_S = 120.0  # longer than the apiserver's own idle timeout (90 s)
#: How often the event loop says it is alive (and its threads answer); the
#: operator starts the process again when it has been silent for long.
HEARTBEAT_S = 5.0
#: Report lines waiting for the operator to read them; more are dropped
#: rather than ever making an admission wait for a pipe.
REPORT_QUEUE = 10_000
#: How long a review may take when the apiserver does not say (its
#: `?timeout=`, the webhook's timeoutSeconds: at most 30 s). Later than that
#: the apiserver has given up, and nothing is gained by answering.
ANSWER_TIMEOUT_S = 10.0


class UnknownWebhook(Exception):
    """A path we do not serve."""


class Reviewer:
    """Answers AdmissionReview requests."""

    def __init__(self, cfg: OperatorConfig, mirror: policy_mirror.PolicyMirror,
                 report: Any = None) -> None:
        self.cfg, self.mirror = cfg, mirror
        self.report = report or (lambda webhook, outcome, seconds: None)

    async def __call__(self, request: dict[str, Any], path: str,
                       received: float | None = None) -> dict[str, Any]:
        """The response to `request`, which came to /`path`; `received`: when
        its connection began reading it (perf_counter), so that its time
        counts the wait for a slot and the read too."""
        which = {admission.MUTATE_ID: "pod", admission.VALIDATE_ID: "policy"}.get(path)
        if which is None:
            raise UnknownWebhook(f"no webhook at /{path}")
        payload = request.get("request")
        if not isinstance(payload, dict):
            payload = {}
        answer: dict[str, Any] = {"uid": str(payload.get("uid") or ""), "allowed": True}
        warnings: list[str] = []
        started, outcome = received or time.perf_counter(), "error"
        heap.busy()  # no heap trim while admissions come in
        try:
            if which == "pod":
                ops = await self._pod(payload, warnings)
                if ops:
                    answer["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
                    answer["patchType"] = "JSONPatch"
            else:
                self._policy(payload)
            outcome = "ok"
        except admission.Refused as refused:
            answer["allowed"] = False
            answer["status"] = {"message": str(refused), "code": refused.code}
        except Exception as error:  # answered, never a dropped connection
            log.exception("admission of a %s failed", which)
            answer["allowed"] = False
            answer["status"] = {"message": f"ckptdrain admission failed: {error!r}",
                                "code": 500}
        finally:
            self.report(which, outcome, time.perf_counter() - started)
        if warnings:
            answer["warnings"] = [str(w) for w in warnings]
        return {"apiVersion": request.get("apiVersion", "admission.k8s.io/v1"),
                "kind": request.get("kind", "AdmissionReview"), "response": answer}

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
        return await admission.admit_pod(pod, namespace, self.cfg, warnings, log,
                                         self.mirror.candidates(namespace, labels), None)

    def _policy(self, payload: dict[str, Any]) -> None:
        body = payload.get("object")
        if payload.get("operation") not in ("CREATE", "UPDATE") or not isinstance(body, dict):
            return
        spec = body.get("spec")
        admission.validate_policy(spec if isinstance(spec, dict) else {},
                                  (body.get("metadata") or {}).get("name") or "", self.cfg)


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


class Certificates:
    """The TLS context of new connections, made again when the files change."""

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._digest = b""
        self._context = self._load()

    def _read_digest(self) -> bytes:
        return hashlib.sha256(Path(self.cert).read_bytes() + Path(self.key).read_bytes()).digest()

    def _load(self) -> ssl.SSLContext:
        digest = self._read_digest()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no client certificates asked
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        self._digest = digest
        return context

    def context(self) -> ssl.SSLContext:
        return self._context

    def check(self) -> bool:
        """Load the files again if they changed; True if they did."""
        try:
            if self._read_digest() == self._digest:
                return False
            self._context = self._load()
        except (OSError, ssl.SSLError) as error:  # caught mid-write: the next check
            log.warning("admission: reading the certificate files failed (%s)", error)
            return False
        log.info("admission: serving the renewed certificate")
        return True

    def follow(self) -> None:
        """Check the files every CERT_CHECK_S in a daemon thread."""
        def loop() -> None:
            while True:
                time.sleep(CERT_CHECK_S)
                self.check()
        threading.Thread(target=loop, name="ckptdrain-admission-tls", daemon=True).start()


class Server(ThreadingHTTPServer):
    """HTTPS, one thread per connection; each review is answered on one event
    loop (`loop`), where the rules run and hand their API reads to threads.

    Bounded: at most MAX_CONNECTIONS at once (one more is closed at once),
    at most MAX_IN_FLIGHT reviews read and answered at once (the others
    wait), a TLS handshake within HANDSHAKE_S, a connection idle for IDLE_S
    closed."""

    daemon_threads = True
    allow_reuse_address = True
    #: Kopf's server (aiohttp) listened with a backlog of 128; a job's burst of
    #: pod creations opens many connections at once.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], certificates: Certificates,
                 reviewer: Reviewer, loop: asyncio.AbstractEventLoop) -> None:
        self.certificates, self.reviewer, self.loop = certificates, reviewer, loop
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        # Answers are small and must not wait for the peer's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The handshake happens in the connection's own thread (Handler.setup),
        # so a slow or silent client never holds up the next accept.
        return (self.certificates.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False), address)

    def process_request(self, request: Any, client_address: Any) -> None:
        # At the cap, the next connection waits here (and those after it in
        # the listen backlog) until one closes, rather than being refused.
        self.connections.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: nobody else releases it
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Probes that connect and leave (a kubelet's tcpSocket readiness
        # check), clients that give up: not worth a traceback.
        log.debug("admission: connection from %s ended: %s", client_address, sys.exc_info()[1])

    def answer(self, request: dict[str, Any], path: str, received: float,
               deadline: float) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(
            self.reviewer(request, path, received), self.loop)
        try:
            return future.result(max(0.0, deadline - time.monotonic()))
        finally:
            future.cancel()  # no-op once done; a late one must not run on


def request_timeout(query: str) -> float:
    """The seconds the apiserver waits for this review (its `?timeout=5s`),
    else ANSWER_TIMEOUT_S; at most 30 s."""
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "timeout" and value.endswith("s"):
            try:
                return min(30.0, max(0.5, float(value[:-1])))
            except ValueError:
                break
    return ANSWER_TIMEOUT_S


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the apiserver reuses connections
    #: Buffered: the status line, headers and body leave in one write.
    wbufsize = 1 << 16
    server: Server

    def setup(self) -> None:
        self.request.settimeout(HANDSHAKE_S)
        self.request.do_handshake()
        self.request.settimeout(IDLE_S)
        super().setup()

    def handle_expect_100(self) -> bool:
        answered = super().handle_expect_100()
        self.wfile.flush()  # buffered: the client waits for it before the body
        return answered

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._fail(411, "Content-Length: expected a number of bytes")
            return
        if not 0 < length <= MAX_REVIEW_BYTES:
            self._fail(413, f"Content-Length: expected 1 to {MAX_REVIEW_BYTES} bytes, "
                            f"got {length}")
            return
        received = time.perf_counter()
        path, _, query = self.path.partition("?")
        path = path.strip("/")
        deadline = time.monotonic() + request_timeout(query)
        if not self.server.in_flight.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._fail(503, "too many reviews at once; the apiserver's time is up")
            return
        try:
            try:
                self.request.settimeout(max(0.1, deadline - time.monotonic()))
                request = json.loads(self.rfile.read(length))
                if not isinstance(request, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, TimeoutError) as error:
                self._fail(400, f"body: expected an AdmissionReview ({error})")
                return
            finally:
                self.request.settimeout(IDLE_S)
            try:
                self._send(200, self.server.answer(request, path, received, deadline))
            except UnknownWebhook as error:
                self._fail(404, str(error))
            except Exception as error:  # a timeout, a bug: answered, never dropped
                log.warning("admission: no answer to a review at /%s: %r", path, error)
                self._fail(500, f"no answer: {error!r}")
        finally:
            self.server.in_flight.release()

    def _fail(self, code: int, message: str) -> None:
        # What is left of the request is not read: this connection ends here.
        self.close_connection = True
        self._send(code, {"error": message})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # every review is counted in the operator's metrics instead


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
    certificates = Certificates(cert, key)
    certificates.follow()
    server = Server((cfg.webhook_addr, cfg.webhook_port), certificates, reviewer, loop)
    log.info("admission: serving on %s:%d", cfg.webhook_addr, cfg.webhook_port)
    reports.ready()
    server.serve_forever()


def warm_up(namespace: str, connections: int = 4) -> None:
    """Open connections to the apiserver before the first review: a job's
    first pods arrive together, and each would otherwise wait for a TLS
    handshake of its own and the client's first set-up."""
    def look(_: int) -> None:
        try:
            kube.live_writers(namespace or "default", "ckptdrain-warm-up", 0, cached=True)
        except Exception as error:  # only a head start: the reviews will say
            log.debug("admission: warm-up read failed: %s", error)
    kube._api()  # one client, made before the threads share it
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(look, range(connections)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptdrain.operator.admission_process")
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
    # A read inside an admission is bounded by its timeout: one retry of a
    # connection that failed (a pooled one the apiserver closed), none of a
    # read that timed out (urllib3's default is three, each with the whole
    # timeout again).
    kube.configure_reads(Retry(total=1, connect=1, read=0, status=0, other=0))
    reports = Reports(sys.stdout)
    loop = start_loop(reports)  # its heartbeat runs from here on
    mirror = policy_mirror.PolicyMirror()
    policy_mirror.start(mirror, cfg.namespace, log, threading.Event())
    warm_up(cfg.namespace)
    serve(cfg, args.cert, args.key, Reviewer(cfg, mirror, reports.admitted), reports, loop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
