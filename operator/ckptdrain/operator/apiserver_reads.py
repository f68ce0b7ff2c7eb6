"""The apiserver reads admission makes, on urllib3 alone.

Admission reads a few things (the policies of a namespace, a pod's owners,
the pods holding a writer rank) and watches two (policies, writer pods).
The `kubernetes` package would do it, but importing it loads its
configuration, dynamic, stream, informer and leader-election modules with
pydantic, requests and oauthlib beneath them: about 20 MiB resident, which
was 40% of the admission process (docs/scale.md). So this module speaks
HTTP itself for the two ways a pod or a developer is given credentials:

- in a pod: the service account's token and CA, the token read again
  whenever the kubelet replaces its file (bound tokens rotate hourly);
- a kubeconfig whose user has a client certificate, a token or a token file.

A kubeconfig this cannot follow (an exec plugin, an auth provider, a user
name and password, a proxy, several files to merge) gets the `kubernetes`
package's client, as before; so does any process with a proxy in its
environment, whose apiserver calls the SDK would send through it.
Every answer that is not 2xx raises ApiError with the apiserver's message;
anything else that fails (no connection, a timeout, an unreadable token,
an answer that is not JSON) raises urllib3's HTTPError (ReadFailed for
ours). Neither ever carries a credential.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

from ckptdrain.contract.api import (
    ANNOTATION_POLICY,
    GROUP,
    LABEL_WRITER,
    LABEL_WRITER_POLICY,
    POLICIES,
    VERSION,
    policy_labelled,
)

__all__ = ["ApiError", "HTTPError", "ReadFailed", "get_json", "list_policies", "live_writers",
           "read_object", "stream", "watch_events", "writer_selectors"]

log = logging.getLogger(__name__)

#: Reads made inside an admission request: well under the webhook's timeout.
ADMISSION_READ_TIMEOUT_S = 5
#: Connections kept to the apiserver (admission's threads, two watches).
POOL_SIZE = 8
#: One retry of a connection that could not be made, none of a read (a
#: timeout, or a pooled connection the apiserver had closed, which refuses
#: that admission with a 503 its controller retries): a read inside an
#: admission takes at most two connection attempts and one read, each
#: bounded by the timeout, as with the SDK's client (urllib3's default is
#: three retries, each with the whole timeout again).
RETRIES = Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0)
#: Where the kubelet mounts a pod's service-account credentials.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "ckptdrain-admission"
#: Environment that makes the SDK send its calls to an https apiserver
#: through a proxy (its Configuration reads these), unless NO_PROXY covers it.
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
NO_PROXY_ENV = ("NO_PROXY", "no_proxy")


class ApiError(Exception):
    """The apiserver answered with a status that is not 2xx."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"({status}) {reason}" + (f": {message}" if message else ""))
        self.status, self.reason, self.message = status, reason, message


class ReadFailed(HTTPError):
    """A read that failed on our side: the token could not be read, or the
    answer was not JSON."""


class UnsupportedCredentials(Exception):
    """A connection this module cannot make (the SDK's client can)."""


class TokenFile:
    """A bearer token kept in a file that is replaced while we run (the
    kubelet swaps a projected token's directory): read again whenever the
    file is another one or changed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._token = ""
        self._stale = False

    def __call__(self) -> str:
        with self._lock:
            try:
                info = os.stat(self.path)  # follows the kubelet's symlinks
                seen = (info.st_ino, info.st_mtime_ns, info.st_size)
                if seen != self._seen:
                    self._token = self.path.read_text().strip()
                    self._seen = seen
                    self._stale = False
            except (OSError, ValueError) as error:
                why = getattr(error, "strerror", None) or type(error).__name__
                if not self._token:
                    raise ReadFailed(f"cannot read the token file {self.path}: {why}") from None
                if not self._stale:  # mid-swap, or gone: the last good one meanwhile
                    log.warning("cannot read the token file %s (%s); using the last one read",
                                self.path, why)
                    self._stale = True
            return self._token


class Connection:
    """Where the apiserver is and how to prove who we are to it."""

    def __init__(self, server: str, context: ssl.SSLContext | None,
                 token: Any = None, verify: bool = True, server_name: str | None = None
                 ) -> None:
        self.server = server.rstrip("/")
        self.token = token  # a callable giving the token, or None
        pool_args: dict[str, Any] = {"maxsize": POOL_SIZE, "retries": RETRIES}
        if self.server.startswith("https://"):
            if not verify and context is not None:
                # In this order: ssl refuses CERT_NONE while names are checked.
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            pool_args["ssl_context"] = context
            if not verify:
                pool_args.update(cert_reqs="CERT_NONE", assert_hostname=False)
            elif server_name:
                pool_args.update(server_hostname=server_name, assert_hostname=server_name)
        self.pool = urllib3.PoolManager(**pool_args)

    def request(self, path: str, query: list[tuple[str, str]], timeout: Any,
                preload: bool) -> Any:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token()}"
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        # A number bounds the whole read, as the SDK's client did; a watch
        # gives (connect, between reads).
        limit = (urllib3.Timeout(connect=timeout[0], read=timeout[1])
                 if isinstance(timeout, tuple) else urllib3.Timeout(total=timeout))
        return self.pool.request("GET", url, headers=headers, preload_content=preload,
                                 timeout=limit)


def in_cluster(environ: Any = os.environ, directory: Path = SERVICE_ACCOUNT_DIR
               ) -> Connection | None:
    """The pod's own service account, or None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token = directory / "token"
    if not host or not port or not token.is_file():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    return Connection(f"https://{host}:{port}", context, TokenFile(token))


def from_kubeconfig(path: str | Path) -> Connection:
    """The kubeconfig's current context; UnsupportedCredentials for a user
    this module cannot act as."""
    import yaml  # only here: a pod never needs it

    where = Path(path)
    config = yaml.safe_load(where.read_text()) or {}
    name = config.get("current-context")
    context = _named(config, "contexts", name, where).get("context") or {}
    cluster = _named(config, "clusters", context.get("cluster"), where).get("cluster") or {}
    user = _named(config, "users", context.get("user"), where).get("user") or {}
    for field in ("exec", "auth-provider", "username"):
        if user.get(field):
            raise UnsupportedCredentials(f"{where}: user {context.get('user')!r} has "
                                         f"{field!r}")
    if cluster.get("proxy-url"):
        raise UnsupportedCredentials(f"{where}: cluster {context.get('cluster')!r} has "
                                     "'proxy-url'")
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ValueError(f"{where}: cluster {context.get('cluster')!r} has no server")
    base = where.parent
    tls = ssl.create_default_context(
        cafile=_file(cluster.get("certificate-authority"), base),
        cadata=_data(cluster.get("certificate-authority-data")))
    certificate = _pem(user, "client-certificate", base)
    key = _pem(user, "client-key", base)
    if bool(certificate) != bool(key):
        raise ValueError(f"{where}: user {context.get('user')!r} has a client certificate "
                         "or a client key, not both")
    if certificate and key:
        _load_chain(tls, certificate, key)
    token: Any = None
    if user.get("token"):
        fixed = str(user["token"])
        token = lambda: fixed  # noqa: E731
    elif user.get("tokenFile"):
        token = TokenFile(_file(user["tokenFile"], base) or "")
    return Connection(server, tls, token, verify=not cluster.get("insecure-skip-tls-verify"),
                      server_name=cluster.get("tls-server-name"))


def _named(config: dict[str, Any], kind: str, name: Any, where: Path) -> dict[str, Any]:
    for entry in config.get(kind) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise ValueError(f"{where}: no entry named {name!r} in {kind}")


def _file(value: Any, base: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)


def _data(value: Any) -> str | None:
    return base64.b64decode(value).decode() if value else None


def _pem(user: dict[str, Any], field: str, base: Path) -> bytes | None:
    if user.get(f"{field}-data"):
        return base64.b64decode(user[f"{field}-data"])
    found = _file(user.get(field), base)
    return Path(found).read_bytes() if found else None


def _load_chain(context: ssl.SSLContext, certificate: bytes, key: bytes) -> None:
    """Load a client certificate and key given as bytes. ssl reads only
    files: through an anonymous file in memory where the kernel has them,
    else a private temporary file that is gone before this returns."""
    both = certificate.rstrip(b"\n") + b"\n" + key
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("ckptdrain-client")
        try:
            os.write(fd, both)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    fd, name = tempfile.mkstemp(prefix="ckptdrain-client-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(both)
        context.load_cert_chain(name)
    finally:
        os.unlink(name)


class _SdkConnection:
    """The `kubernetes` package's client, for credentials only it follows."""

    def __init__(self) -> None:
        from ckptdrain import kubeclient

        self.api = kubeclient.api_client(pool_size=POOL_SIZE, retries=RETRIES)
        self.api.user_agent = USER_AGENT  # its default headers win over a request's

    def request(self, path: str, query: list[tuple[str, str]], timeout: Any,
                preload: bool) -> Any:
        try:
            method, url, headers, body, post = self.api.param_serialize(
                "GET", path, query_params=query, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"])
            # Its response is always unread: `.data` reads it whole.
            return self.api.call_api(method, url, headers, body, post,
                                     _request_timeout=timeout).response
        except HTTPError:
            raise
        except Exception as error:  # its credentials' own failures (an exec plugin)
            raise ReadFailed(f"GET {path}: {type(error).__name__}: {error}") from None


@functools.cache
def connection() -> Any:
    """The process's one connection: in a pod its service account, else the
    kubeconfig ($KUBECONFIG, or ~/.kube/config)."""
    try:
        return own_connection(os.environ)
    except UnsupportedCredentials as why:
        log.info("apiserver reads through the kubernetes package: %s", why)
        return _SdkConnection()


def own_connection(environ: Any) -> Connection:
    """This module's connection for `environ`; UnsupportedCredentials where
    the SDK's client must make it."""
    found = in_cluster(environ)
    if found is None:
        files = [f for f in (environ.get("KUBECONFIG") or "").split(os.pathsep) if f]
        if len(files) > 1:
            raise UnsupportedCredentials("KUBECONFIG names several files to merge")
        found = from_kubeconfig(Path(files[0] if files else "~/.kube/config").expanduser())
    proxy = proxied(found.server, environ)
    if proxy:
        raise UnsupportedCredentials(f"{proxy} sends {found.server} through a proxy")
    return found


def proxied(server: str, environ: Any) -> str | None:
    """The variable that sends the SDK's calls to `server` through a proxy
    (its rule: the https or all proxy, unless NO_PROXY names the host, a
    domain above it, or *), or None."""
    name = next((n for n in PROXY_ENV if environ.get(n)), None)
    if name is None or not server.startswith("https://"):
        return None
    parts = urlsplit(server)
    host, host_port = (parts.hostname or "").lower(), parts.netloc.lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    skip = next((environ[n] for n in NO_PROXY_ENV if environ.get(n)), "")
    for entry in (e.strip().lower() for e in skip.split(",")):
        if not entry:
            continue
        if entry == "*" or _in_network(address, entry):
            return None
        domain = entry.lstrip(".")
        if host == domain or host.endswith("." + domain) or host_port == domain:
            return None
    return name


def _in_network(address: Any, entry: str) -> bool:
    if address is None:
        return False
    try:
        return address in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False


def _raise_for(response: Any) -> None:
    if 200 <= response.status < 300:
        return
    body = response.data  # read whole: the connection goes back to the pool
    message = ""
    try:
        found = json.loads(body)
        message = str(found.get("message") or "") if isinstance(found, dict) else ""
    except ValueError:
        message = body[:200].decode(errors="replace")
    raise ApiError(response.status, response.reason or "", message)


def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
    """GET `path` as JSON."""
    response = connection().request(path, query, timeout, preload=True)
    _raise_for(response)
    try:
        found = json.loads(response.data)
    except ValueError:
        raise ReadFailed(f"GET {path}: the answer is not JSON") from None
    return found if isinstance(found, dict) else {}


def stream(path: str, query: list[tuple[str, str]],
           timeout: float | tuple[float, float]) -> Any:
    """GET `path` unread (a watch): the urllib3 response, to read with
    watch_events and then release; raises ApiError on an error status."""
    response = connection().request(path, query, timeout, preload=False)
    if not 200 <= response.status < 300:
        try:
            _raise_for(response)
        finally:
            response.release_conn()
    return response


def watch_events(response: Any) -> Iterator[dict[str, Any]]:
    """The events of a watch's response, one JSON object a line."""
    pending = b""
    for chunk in response.stream(1 << 16):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from (json.loads(line) for line in whole if line.strip())
    if pending.strip():
        yield json.loads(pending)


def policies_path(namespace: str) -> str:
    """Where the CheckpointPolicies of `namespace` (all: "") are listed."""
    where = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    return f"/apis/{GROUP}/{VERSION}{where}/{POLICIES}"


def list_policies(namespace: str) -> list[dict[str, Any]]:
    """The CheckpointPolicies of a namespace, read from the apiserver."""
    found = get_json(policies_path(namespace), [], ADMISSION_READ_TIMEOUT_S)
    return list(found.get("items") or [])


def read_object(api_version: str, plural: str, namespace: str, name: str
                ) -> dict[str, Any] | None:
    """One namespaced object of a group's API (a Job, a JobSet) as a dict;
    None when it is absent, its API is not installed, we may not read it,
    or the read failed: the caller treats an owner as optional knowledge."""
    group, _, version = api_version.rpartition("/")
    path = (f"/apis/{quote(group, safe='')}/{quote(version, safe='')}/namespaces/"
            f"{quote(namespace, safe='')}/{quote(plural, safe='')}/{quote(name, safe='')}")
    try:
        return get_json(path, [], ADMISSION_READ_TIMEOUT_S)
    except ApiError as error:
        if error.status not in (403, 404):
            log.warning("could not read %s %s/%s: %s", plural, namespace, name, error)
    except Exception as error:  # no connection, a timeout, the SDK's own failures
        log.warning("could not read %s %s/%s: %s", plural, namespace, name, error)
    return None


def writer_selectors(policy: str, rank: int) -> list[str]:
    """The label selectors that find every pod of `policy` holding writer
    `rank` (the caller filters by the policy annotation): by writer and
    writer-policy label (pods admitted since every writer carries both), and
    by the writer label among pods without a writer-policy label (admitted
    before that). Each returns the few pods that match, not every pod
    holding that rank under any policy of the namespace. A policy whose name
    is too long for a label value has its writers found by rank alone."""
    if not policy_labelled(policy):
        return [f"{LABEL_WRITER}={rank}"]
    return [f"{LABEL_WRITER}={rank},{LABEL_WRITER_POLICY}={policy}",
            f"{LABEL_WRITER}={rank},!{LABEL_WRITER_POLICY}"]


def live_writers(namespace: str, policy: str, rank: int, cached: bool = False) -> list[str]:
    """Live pods of `policy` labelled with writer `rank`: not Succeeded or
    Failed, not being deleted. `cached`: as the apiserver's watch cache has
    them (resourceVersion 0: no read of etcd, possibly a moment old), for a
    first look; a refusal must rest on a read without it."""
    names: list[str] = []
    for selector in writer_selectors(policy, rank):
        found = get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
                         [("labelSelector", selector),
                          *([("resourceVersion", "0")] if cached else [])],
                         ADMISSION_READ_TIMEOUT_S)
        for pod in found.get("items") or []:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if ((meta.get("annotations") or {}).get(ANNOTATION_POLICY) == policy
                    and not meta.get("deletionTimestamp")
                    and status.get("phase") not in ("Succeeded", "Failed")):
                names.append(meta.get("name", ""))
    return sorted(names)
