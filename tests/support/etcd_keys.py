"""What the test apiserver's etcd holds under a key, read through etcd's
JSON gateway (`POST /v3/kv/range`, keys and values base64): the version an
object is stored at, which no API read shows (the apiserver converts every
read)."""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

from .apiserver import Cluster

#: The apiserver's default etcd prefix.
PREFIX = "/registry"


def custom_object_key(group: str, plural: str, namespace: str, name: str) -> str:
    """Where the apiserver keeps a namespaced custom object."""
    return f"{PREFIX}/{group}/{plural}/{namespace}/{name}"


def stored(cluster: Cluster, key: str) -> dict[str, Any] | None:
    """The JSON object etcd holds at `key` (custom objects are stored as
    JSON); None when there is none."""
    assert cluster.etcd_url, "this cluster did not say where its etcd listens"
    request = urllib.request.Request(
        f"{cluster.etcd_url}/v3/kv/range", method="POST",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        found = json.loads(response.read())
    kvs = found.get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None
