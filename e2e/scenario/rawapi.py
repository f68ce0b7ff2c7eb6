"""Pod creates straight to the apiserver, over one kept-alive TLS connection,
for the chaos step: it counts every refusal and times admission, which
`kubectl` would blur with its own start-up (a few hundred ms a call here).

Credentials come from $KUBECONFIG as e2e/cluster/pki.sh writes it: a
certificate authority and a client certificate/key, all as file paths.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import yaml


@dataclass(frozen=True)
class Answer:
    status: int  # HTTP status; 0 when the connection itself failed
    body: dict[str, Any]
    seconds: float

    @property
    def message(self) -> str:
        return str(self.body.get("message") or self.body.get("error") or self.status)


class Api:
    def __init__(self, kubeconfig: str | None = None) -> None:
        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        with open(path) as f:
            config = yaml.safe_load(f)
        current = {c["name"]: c["context"] for c in config["contexts"]}[config["current-context"]]
        cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[current["cluster"]]
        user = {u["name"]: u["user"] for u in config["users"]}[current["user"]]
        missing = [k for k in ("client-certificate", "client-key") if k not in user]
        if "certificate-authority" not in cluster or missing:
            raise SystemExit(f"{path}: expected certificate-authority, client-certificate and "
                             "client-key as file paths (e2e/cluster/pki.sh writes them so)")
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])
        url = urlparse(cluster["server"])
        self.host, self.port = url.hostname or "", url.port or 443
        self.conn: http.client.HTTPSConnection | None = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None,
                 timeout: float) -> Answer:
        began = time.monotonic()
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port,
                                                        context=self.context, timeout=timeout)
            try:
                self.conn.request(method, path, body=data,
                                  headers={"Content-Type": "application/json"})
                response = self.conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as err:
                # A connection the server closed while idle is retried once, fresh.
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    return Answer(0, {"error": str(err)}, time.monotonic() - began)
                began = time.monotonic()
                continue
            try:
                parsed = json.loads(raw) if raw else {}
            except ValueError:
                parsed = {"error": raw[:200].decode(errors="replace")}
            return Answer(response.status, parsed, time.monotonic() - began)
        raise AssertionError("unreachable")

    def create_pod(self, namespace: str, pod: dict[str, Any], dry_run: bool = False,
                   timeout: float = 30) -> Answer:
        query = "?dryRun=All" if dry_run else ""
        return self._request("POST", f"/api/v1/namespaces/{namespace}/pods{query}", pod,
                             timeout)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n × p / 100)
    return ordered[int(rank) - 1]
