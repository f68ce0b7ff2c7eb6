"""kubectl and helm, as the scenario driver uses them (a user's view)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
KUBECTL = os.environ.get("KUBECTL", "kubectl")
HELM = os.environ.get("HELM", "helm")
#: CheckpointPolicies read at v1alpha1. The scenarios write v1beta1 (what
#: users write, stored from 0.3.0), but read status here: its times
#: (`startedAt`, `heldSince`, each interruption's `at`) are Unix seconds at
#: v1alpha1, the numbers the steps compare with the trainers' clocks, and
#: RFC3339 strings at v1beta1. Such a read is converted by the operator's
#: /convert; the operator's own reads and status patches are not (v1beta1,
#: as the objects and their managedFields were written).
POLICIES = "checkpointpolicies.v1alpha1.ckptdrain.io"
#: The same objects as users read them (kubectl's preferred version):
#: converted by the operator's webhook.
POLICIES_V1BETA1 = "checkpointpolicies.v1beta1.ckptdrain.io"


class Failed(AssertionError):
    pass


class Fatal(Failed):
    """A failure no more waiting can mend: `wait_for` lets it through at once."""


def run(*argv: str, check: bool = True, input: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
    if check and done.returncode != 0:
        raise Failed(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def kubectl(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run(KUBECTL, *args, **kw)


def helm(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run(HELM, *args, **kw)


def get(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def apply(manifest: str) -> None:
    kubectl("apply", "-f", "-", input=manifest)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float,
             every: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy; Failed after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Fatal:
            raise
        except (Failed, subprocess.TimeoutExpired, KeyError, ValueError) as err:
            last = err
        time.sleep(every)
    raise Failed(f"timed out after {timeout:.0f}s waiting for {what}"
                 + (f" (last error: {last})" if last else ""))


def logs(namespace: str, pod: str, container: str, previous: bool = False) -> list[dict[str, Any]]:
    """JSON lines a container printed (other lines skipped)."""
    args = ["logs", "-n", namespace, pod, "-c", container] + (["--previous"] if previous else [])
    out = kubectl(*args, check=False).stdout
    events = []
    for line in out.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events
