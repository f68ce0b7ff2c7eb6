"""The admission server (admission/server.py, its real 128 connection
slots) against slow clients, in this process over loopback TLS:

1. `held`: every slot held by a bare TCP connect or a request line sent a
   byte every 0.2 s; valid reviews sent one at a time meanwhile, each on a
   new connection: their latency, and how many were answered 200 within
   the chart's webhook timeoutSeconds (5 s).
2. `flood`: `--flooders` threads opening bare TCP connects as fast as they
   can (each kept until the server closes it); the same valid reviews.
3. `bodies` (`--tricklers`, default 136: more than the slots): each a
   connection that sends a review's headers at once under the longest
   wait a review may ask (`?timeout=30s`) and its 1,000-byte body a byte
   every 0.2 s, opening another as soon as the server closes it; the same
   valid reviews, once every slot is held, one every 0.5 s (so that the
   trickled bodies are cut and reopened meanwhile: `cut_per_s`).

Run: .venv/bin/python -m benchmarks webhook_slow_clients [--reviews 20]
Prints one JSON object. Figures go into docs/security.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.support.admission_tls import serving  # noqa: E402

from ckptdrain.operator import config  # noqa: E402
from ckptdrain.operator.admission import process as admission_process  # noqa: E402
from ckptdrain.operator.admission import rules as admission  # noqa: E402
from ckptdrain.operator.admission import server as admission_server  # noqa: E402
from ckptdrain.operator.admission.policy_mirror import PolicyMirror  # noqa: E402

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
WAIT_S = 5.0  # the chart's webhook timeoutSeconds
REVIEW = json.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {"uid": "u", "operation": "CREATE", "namespace": "ml",
                "object": {"metadata": {"name": "p"}, "spec": {"containers": [
                    {"name": "c", "image": "i"}]}}}}).encode()


def _reviews(port: int, context: ssl.SSLContext, count: int,
             pause_s: float = 0.0) -> dict[str, Any]:
    took, answered = [], 0
    for _ in range(count):
        time.sleep(pause_s)
        began = time.monotonic()
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=WAIT_S)
        try:
            conn.request("POST", f"/{admission.MUTATE_ID}?timeout=5s", body=REVIEW,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status == 200 and time.monotonic() - began < WAIT_S:
                answered += 1
        except OSError:
            pass
        finally:
            conn.close()
        took.append(time.monotonic() - began)
    ordered = sorted(took)
    return {"sent": count, "answered_within_5s": answered,
            "p50_ms": round(ordered[len(ordered) // 2] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 1)}


def _held(port: int, context: ssl.SSLContext, count: int) -> dict[str, Any]:
    slots = admission_server.MAX_CONNECTIONS
    bare = [socket.create_connection(("127.0.0.1", port)) for _ in range(slots // 2)]
    slow = [context.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                server_hostname="127.0.0.1") for _ in range(slots - len(bare))]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.2):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"P")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        return _reviews(port, context, count)
    finally:
        stop.set()
        thread.join()
        for sock in bare + slow:
            sock.close()


def _flood(port: int, context: ssl.SSLContext, count: int, flooders: int) -> dict[str, Any]:
    stop, opened, counting = threading.Event(), [0], threading.Lock()

    def flood() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                with counting:  # `+=` from several threads loses counts
                    opened[0] += 1
            if len(held) > 256:  # those the server closed long since
                for sock in held[:128]:
                    sock.close()
                del held[:128]
        for sock in held:
            sock.close()

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(flooders)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    try:
        result = _reviews(port, context, count)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    result["connects_per_s"] = round(opened[0] / (time.monotonic() - began))
    return result


def _bodies(port: int, context: ssl.SSLContext, count: int, tricklers: int,
            body_bytes: int = 1000) -> dict[str, Any]:
    stop, cut, counting = threading.Event(), [0], threading.Lock()
    started = threading.Semaphore(0)
    head = (f"POST /{admission.MUTATE_ID}?timeout=30s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body_bytes}\r\n\r\n{{").encode()

    def trickle() -> None:
        first = True
        while not stop.is_set():
            with contextlib.suppress(OSError), context.wrap_socket(
                    socket.create_connection(("127.0.0.1", port), timeout=30),
                    server_hostname="127.0.0.1") as sock:
                sock.sendall(head)
                if first:
                    first = False
                    started.release()
                while not stop.wait(0.2):
                    sock.sendall(b" ")  # raises once the server has closed it
            if not stop.is_set():
                with counting:
                    cut[0] += 1

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(tricklers)]
    for thread in threads:
        thread.start()
    for _ in range(min(tricklers, admission_server.MAX_CONNECTIONS)):
        # Every slot held by a trickled body, else the figures mean nothing.
        if not started.acquire(timeout=30):
            stop.set()
            raise SystemExit(f"the {tricklers} trickling clients did not all get in "
                             "within 30 s")
    began = time.monotonic()
    try:
        # Spread over several of the bodies' deadlines: they are cut and reopen.
        result = _reviews(port, context, count, pause_s=0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    result["tricklers"], result["body_bytes"] = tricklers, body_bytes
    result["cut_per_s"] = round(cut[0] / (time.monotonic() - began), 1)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="webhook_slow_clients")
    parser.add_argument("--reviews", type=int, default=20)
    parser.add_argument("--flooders", type=int, default=4)
    parser.add_argument("--tricklers", type=int, default=admission_server.MAX_CONNECTIONS + 8)
    # Over SMALL_BODY_BYTES: all but 8 trickling clients wait for a body's slot.
    parser.add_argument("--body-bytes", type=int, default=1000)
    args = parser.parse_args(argv)
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    with tempfile.TemporaryDirectory() as directory, serving(
            Path(directory), CFG, reviewer) as (server, cert):
        port = server.server_address[1]
        context = ssl.create_default_context(cafile=str(cert))
        report = {"slots": admission_server.MAX_CONNECTIONS,
                  "held": _held(port, context, args.reviews)}
        time.sleep(4)  # every slow connection gone (their deadline)
        report["flood"] = _flood(port, context, args.reviews, args.flooders)
        report["flood"]["flooders"] = args.flooders
        report["bodies"] = _bodies(port, context, args.reviews, args.tricklers,
                                   args.body_bytes)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
