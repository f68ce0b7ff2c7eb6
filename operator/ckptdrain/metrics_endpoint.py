"""/metrics and /healthz over HTTP in a thread: what the agent and the CSI
driver each serve (the operator uses prometheus_client's own server, with
Kopf's health endpoint beside it).

`healthy` is asked on every /healthz: a process whose main loop has
stalled answers 503 there, so that its liveness probe restarts it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MetricsEndpoint:
    """Serves `registry` on /metrics and `healthy` on /healthz at `port`
    (0 picks a free one), in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, healthy: Callable[[], bool], *,
                 host: str = "0.0.0.0", stalled: str = "main loop stalled") -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
                elif self.path.split("?")[0] == "/healthz":
                    ok = healthy()
                    body, ctype = (b"ok\n" if ok else f"{stalled}\n".encode()), "text/plain"
                    code = 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every 15 s would drown the process's own log

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
