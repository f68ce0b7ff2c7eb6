"""The node side's few apiserver calls, in a pod, without the Kubernetes SDK.

Restore runs in an init container on every node of every restart, and all it
says to the apiserver is a handful of small JSON requests: the annotations on
its own pod, and with several writers the restore meeting's Leases. Importing
and setting up the `kubernetes` package costs about half a second of CPU
before the first request, paid by every pod of the job while its GPUs wait;
these calls need only `http.client` with the pod's ServiceAccount token and
the cluster CA, which is what the SDK's in-cluster configuration uses too.

`InCluster.from_env()` is None outside a pod (no service host, no mounted
token or CA); callers then use the SDK through a kubeconfig (kubeclient.py).
The classes below answer the SDK's method names for the calls made, so the
code that uses them takes either.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Read anew for every request: the kubelet rotates a projected token in place.
TOKEN_PATH = f"{SERVICE_ACCOUNT_DIR}/token"
CA_PATH = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
DEFAULT_TIMEOUT_S = 5.0
#: Longest body kept in an error's text.
ERROR_TEXT = 300


log = logging.getLogger(__name__)

#: How a kept connection that the apiserver (or a load balancer in front of
#: it) closed while idle fails: at its end of file, with or without TLS's
#: closing alert, or reset. Each request here is safe to send again (a merge
#: patch of annotations, a replace by resourceVersion, a create answered 409
#: the second time), so such a failure is tried once more on a new connection.
_DROPPED = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
            ssl.SSLEOFError, ssl.SSLZeroReturnError)


class ApiError(Exception):
    """The apiserver answered with an error status; `status` and `reason` as
    the SDK's ApiException carries them."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"({status}) {reason}: {message}" if message else f"({status}) {reason}")
        self.status, self.reason, self.message = status, reason, message


def status_message(body: bytes | str | None, limit: int = ERROR_TEXT) -> str | None:
    """The apiserver's own sentence for an error: the message of the Status
    object `body` holds; None when it holds none."""
    try:
        found = json.loads(body or "")
    except (TypeError, ValueError):
        return None
    if isinstance(found, dict) and isinstance(found.get("message"), str):
        return str(found["message"])[:limit]
    return None


def _message(body: bytes) -> str:
    """The apiserver's own sentence, or the start of whatever else it sent."""
    said = status_message(body)
    return said if said is not None else body[:ERROR_TEXT].decode("utf-8", "replace").strip()


class InCluster:
    """One keep-alive HTTPS connection to the apiserver, as this pod's
    ServiceAccount. Thread-safe: requests take turns on the connection."""

    def __init__(self, host: str, port: int, token_path: str = TOKEN_PATH,
                 ca_path: str = CA_PATH) -> None:
        self.host, self.port, self.token_path = host, port, token_path
        self._tls = ssl.create_default_context(cafile=ca_path)
        self._lock = threading.Lock()
        self._conn: http.client.HTTPSConnection | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, token_path: str | None = None,
                 ca_path: str | None = None) -> InCluster | None:
        """This pod's apiserver, as the kubelet tells every container; None
        when any part is missing (not in a pod, or no token mounted)."""
        env = os.environ if environ is None else environ
        token_path = TOKEN_PATH if token_path is None else token_path
        ca_path = CA_PATH if ca_path is None else ca_path
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        port = env.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port.isdigit() or not (os.path.isfile(token_path)
                                                  and os.path.isfile(ca_path)):
            return None
        if _proxied(host, env):
            return None  # the SDK's way through the proxy, as before
        try:
            return cls(host, int(port), token_path, ca_path)
        except (ssl.SSLError, OSError) as err:
            # A CA file that does not load: the SDK's client is built anyway
            # and its requests fail, each with the reason, as before.
            log.warning("the cluster CA %s does not load (%s): using the Kubernetes SDK",
                        ca_path, err)
            return None

    def request(self, method: str, path: str, body: Any = None, *,
                query: Mapping[str, str] | None = None,
                content_type: str = "application/json",
                timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """One request; the answer's JSON object, or ApiError for an error
        status; OSError (timeouts included) or http.client.HTTPException when
        no answer, or no HTTP answer, came."""
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()
        target = path + ("?" + urlencode(query) if query else "")
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                   "User-Agent": "ckptdrain-node"}
        if payload is not None:
            headers["Content-Type"] = content_type
        with self._lock:
            status, reason, data = self._exchange(method, target, payload, headers, timeout)
        if status >= 400:
            raise ApiError(status, reason, _message(data))
        found = json.loads(data) if data else {}
        return found if isinstance(found, dict) else {}

    def _exchange(self, method: str, target: str, payload: bytes | None,
                  headers: dict[str, str], timeout: float) -> tuple[int, str, bytes]:
        # A kept connection found dropped gets one more try on a new one
        # (_DROPPED); a fresh connection's failure is the caller's to see.
        for reused in (self._conn is not None, False):
            conn = self._conn or http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self._tls)
            self._conn = conn
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, target, body=payload, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            except _DROPPED:
                self.close()
                if reused:
                    continue
                raise
            except BaseException:
                self.close()
                raise
            if answer.will_close:
                self.close()
            return answer.status, answer.reason, data
        raise AssertionError("unreachable: the second try raises or returns")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _proxied(host: str, env: Mapping[str, str]) -> bool:
    """Would the SDK reach `host` through an HTTPS proxy (HTTPS_PROXY and
    NO_PROXY of the environment, as urllib reads them)?"""
    names = {k.lower(): v for k, v in env.items() if k.lower() in ("https_proxy", "no_proxy")}
    if not names.get("https_proxy"):
        return False
    bypass = [p.strip().lstrip(".") for p in names.get("no_proxy", "").split(",") if p.strip()]
    return "*" not in bypass and not any(_bypassed(host, b) for b in bypass)


def _bypassed(host: str, entry: str) -> bool:
    """NO_PROXY's entry covers `host`: the name, a parent domain, or (for an
    address) a network such as 10.96.0.0/12. Anything else counts as proxied:
    the SDK then decides, never this client wrongly going direct."""
    if host == entry or host.endswith("." + entry):
        return True
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False


def _path(group: str, version: str, namespace: str, plural: str, name: str = "") -> str:
    base = f"/api/{version}" if not group else f"/apis/{quote(group, safe='')}/{version}"
    out = f"{base}/namespaces/{quote(namespace, safe='')}/{quote(plural, safe='')}"
    return out + (f"/{quote(name, safe='')}" if name else "")


class CoreV1:
    """The part of the SDK's CoreV1Api the node side calls."""

    def __init__(self, api: InCluster) -> None:
        self.api = api

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any],
                             _request_timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        return self.api.request("PATCH", _path("", "v1", namespace, "pods", name), body,
                                content_type="application/merge-patch+json",
                                timeout=_request_timeout)


class CustomObjects:
    """The part of the SDK's CustomObjectsApi the node side calls (the
    restore meeting's Leases)."""

    def __init__(self, api: InCluster) -> None:
        self.api = api

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str,
                                     _request_timeout: float = DEFAULT_TIMEOUT_S
                                     ) -> dict[str, Any]:
        return self.api.request("GET", _path(group, version, namespace, plural, name),
                                timeout=_request_timeout)

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                      plural: str, label_selector: str = "",
                                      _request_timeout: float = DEFAULT_TIMEOUT_S
                                      ) -> dict[str, Any]:
        query = {"labelSelector": label_selector} if label_selector else None
        return self.api.request("GET", _path(group, version, namespace, plural), query=query,
                                timeout=_request_timeout)

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: dict[str, Any],
                                        _request_timeout: float = DEFAULT_TIMEOUT_S
                                        ) -> dict[str, Any]:
        return self.api.request("POST", _path(group, version, namespace, plural), body,
                                timeout=_request_timeout)

    def replace_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                         plural: str, name: str, body: dict[str, Any],
                                         _request_timeout: float = DEFAULT_TIMEOUT_S
                                         ) -> dict[str, Any]:
        return self.api.request("PUT", _path(group, version, namespace, plural, name), body,
                                timeout=_request_timeout)
