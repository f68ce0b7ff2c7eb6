"""Whether a webhook clientConfig calls this replica's webhook server (pure).

The operator keeps the CheckpointPolicy CRD's conversion caBundle equal to
its own CA (webhook_certs.py). The CRD is cluster-wide and may be another
release's: two namespace-scoped installs share it, the second with
crds.install=false, and the CRD calls the first one's Service. Were both to
set their own CA there, each would undo the other every check and half the
conversions would fail. So a replica sets it only where the CRD calls its
own server:

- `service: {namespace, name}`: the Service that CKPTDRAIN_WEBHOOK_HOST
  names (the chart sets `<name>.<namespace>.svc`; `.svc.<cluster domain>`
  after it is the same Service);
- `url:` (development, tests, a server outside the cluster): the URL's host
  and port are CKPTDRAIN_WEBHOOK_HOST and CKPTDRAIN_WEBHOOK_PORT, where the
  apiserver dials it as written, with no Service between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

HTTPS_PORT = 443


@dataclass(frozen=True)
class WebhookAddress:
    """Where the apiserver reaches this replica's webhook server."""

    host: str
    port: int

    def service(self) -> tuple[str, str] | None:
        """(namespace, name) of the Service `host` names, None when it names
        none (an IP address, an outside name)."""
        parts = self.host.rstrip(".").split(".")
        if len(parts) >= 3 and parts[2] == "svc" and parts[0] and parts[1]:
            return parts[1], parts[0]
        return None

    def describe(self) -> str:
        service = self.service()
        if service is not None:
            return f"Service {service[0]}/{service[1]}"
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{netloc}:{self.port}"


def other_webhook(client_config: dict[str, Any], ours: WebhookAddress) -> str | None:
    """None when `client_config` calls `ours`; else what it calls instead,
    in words for a log line."""
    service = client_config.get("service")
    if isinstance(service, dict):
        named = (str(service.get("namespace") or ""), str(service.get("name") or ""))
        return None if named == ours.service() else f"Service {named[0]}/{named[1]}"
    url = client_config.get("url")
    if isinstance(url, str) and url:
        try:
            parts = urlsplit(url)
            port = parts.port or HTTPS_PORT
        except ValueError:
            return f"URL {url}"
        return None if (parts.hostname, port) == (ours.host, ours.port) else f"URL {url}"
    return "neither a Service nor a URL"
