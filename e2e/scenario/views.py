"""The scenario's objects, and how a user sees them with kubectl."""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Any

from kube import POLICIES, get, kubectl

NS, S3_NS, RELEASE, OP_NS = "ckptdrain-e2e", "ckptdrain-e2e-s3", "ckptdrain", "ckptdrain"
POLICY, JOB, BUCKET = "mlp", "mlp", "ckptdrain-e2e"
#: The default CheckpointClass (class.yaml) every scenario's policy binds to.
CLASS = "ckptdrain-e2e"
# The trainers' shared step clock: a step every STEP_S seconds, a checkpoint
# on every EVERY-th step; GRACE is the pods' termination grace period.
STEP_S, EVERY, GRACE = 0.1, 100, 30
CHECKPOINT_BYTES, WRITERS = 50_000_000, 2  # policy.yaml's checkpointBytes, writers
HERE = Path(__file__).resolve().parent


def render(name: str, **values: object) -> str:
    """The manifest template `name` beside this file, its $PLACEHOLDERS filled."""
    return string.Template((HERE / name).read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def pod_of(index: int, running: bool = True) -> dict[str, Any] | None:
    pods = get("pods", "-n", NS, "-l", f"batch.kubernetes.io/job-completion-index={index}")
    for pod in pods["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        statuses = {c["name"]: c for c in pod["status"].get("containerStatuses") or []}
        if not running or "running" in (statuses.get("trainer", {}).get("state") or {}):
            return pod
    return None


def records() -> dict[int, dict[str, Any]]:
    return {int(r["spec"]["step"]): r for r in get("checkpoints", "-n", NS)["items"]}


def ranks_in(text: object) -> set[int]:
    """The ranks of a record's range text ("0-2,5" → {0, 1, 2, 5})."""
    out: set[int] = set()
    for part in str(text or "").split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit():
            out.update(range(int(low), int(high or low) + 1))
    return out


def complete_steps() -> list[int]:
    return sorted(s for s, r in records().items() if (r.get("status") or {}).get("state")
                  == "Global")


def policy_status(policy: str = POLICY) -> dict[str, Any]:
    return get(POLICIES, "-n", NS, policy).get("status") or {}


def mid_interval(epoch: float) -> bool:
    """Whether the shared step clock is now between two scheduled checkpoints."""
    return 30 <= ((time.time() - epoch) / STEP_S) % EVERY <= 60


def wait_mid_interval(epoch: float) -> None:
    """Wait until the shared step clock is between two scheduled checkpoints, so a
    SIGTERM never lands on a step every writer also saves."""
    while not mid_interval(epoch):
        time.sleep(0.2)


def remove(policy: str, *jobs: str) -> None:
    """Delete a step's Jobs, then its policy (best effort: a step's cleanup
    runs after a failure too)."""
    for job in jobs:
        kubectl("delete", "job", "-n", NS, job, "--ignore-not-found", "--wait=true",
                "--timeout=90s", timeout=100, check=False)
    kubectl("delete", POLICIES, "-n", NS, policy, "--ignore-not-found",
            "--wait=true", timeout=60, check=False)
