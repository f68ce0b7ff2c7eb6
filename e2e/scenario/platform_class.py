"""The platform's default CheckpointClass, installed before any policy
(docs/checkpoint-classes.md): no scenario's policy names a class, so
admission binds every one of them to this class."""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kube import apply, get, kubectl, wait_for
from views import BUCKET, CLASS, S3_NS

HERE = Path(__file__).resolve().parent


def install(s3: Any, allowed_root: str, say: Callable[[str], None],
            check: Callable[[object, str], None]) -> None:
    """The class for the chart's allowed root and the scenarios' bucket, Accepted."""
    say("   the platform's default CheckpointClass: the allowed root, the bucket")
    apply(string.Template((HERE / "class.yaml").read_text()).substitute(
        CLASS=CLASS, ALLOWED_ROOT=allowed_root, BUCKET=BUCKET, S3_NAMESPACE=S3_NS,
        S3_PORT=s3.port))
    accepted = wait_for(f"CheckpointClass {CLASS} Accepted", lambda: next(
        (c for c in (get("checkpointclasses", CLASS).get("status") or {}).get("conditions", [])
         if c["type"] == "Accepted" and c["status"] == "True"), None), 30)
    check(accepted, f"CheckpointClass {CLASS} Accepted ({accepted.get('reason')})")


def remove() -> None:
    """Cluster-scoped, the platform's: neither the namespaces nor the release hold it.
    Quiet when absent (a fresh cluster has not even the CRD)."""
    kubectl("delete", "checkpointclass", CLASS, "--ignore-not-found", "--wait=true",
            check=False, timeout=60)
