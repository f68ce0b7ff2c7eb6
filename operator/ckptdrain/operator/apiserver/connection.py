"""How the admission process reaches the apiserver without the
`kubernetes` package: its credentials and its one pool of connections.

Importing the SDK loads its configuration, dynamic, stream, informer and
leader-election modules with pydantic, requests and oauthlib beneath them:
about 20 MiB resident, 40% of the admission process (docs/scale.md). So
this module makes the connection itself for the two ways a pod or a
developer is given credentials:

- in a pod: the service account's token and CA, the token read again
  whenever the kubelet replaces its file (bound tokens rotate hourly);
- a kubeconfig whose user has a client certificate, a token or a token file.

Where it cannot (a kubeconfig user with an exec plugin, an auth provider,
a user name and password; several files to merge; a proxy the SDK would
use for the apiserver) the SDK's client makes it, as before. Reads go
through apiserver/reads.py.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

log = logging.getLogger(__name__)

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
