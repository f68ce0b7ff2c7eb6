"""The move step (M): a policy's store moved under a live job, the way
docs/operator.md ("Overlapping selectors and moves under live pods", "After
a move") tells a user to do it, and never a silent restart from step 0.

A CheckpointPolicy `move` (one writer, the simulated trainer, an Indexed
Job of one pod) drains to `s3://<bucket>/move-a`. Once a step is complete
there:

M1. A change of `spec.storage.uri` to `move-b` while the pod lives is
    refused (403, naming the field and the live pod).
M2. The same change with `spec.relocation.reason` is admitted; the policy's
    status remembers `move-a` and the step it reached (`status.storage`).
M3. The Job is deleted (its pod's agent flushes its emergency step to
    `move-a`, where it was injected to) and created again on nodes that
    hold no copy (the local tier is per node and does not move: it is
    wiped here, as for a job rescheduled elsewhere). Its pod's restore
    finds nothing under `move-b` and fails with exit 5
    (`history_elsewhere`), naming `move-a`, instead of telling the trainer
    to start fresh.
M4. The checkpoints are copied from `move-a` to `move-b`, as the docs say;
    the Job's next pod restores the newest step from the store, with the
    state hash the trainer saved.

    run(s3, allowed_root, workdir, report, say, check)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobset
from kube import POLICIES, apply, get, kubectl, wait_for
from trainers import TRAINERS, Logs
from views import BUCKET, GRACE, NS, remove

NAME = POLICY = "move"
OLD, NEW = "move-a", "move-b"
SELECT = f"app={NAME}"
RESTORE = "ckptdrain-restore"
#: restore/result.py: nothing at the new prefix while the history names another.
HISTORY_ELSEWHERE = 5

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def policy_manifest(allowed_root: str, s3_port: int, prefix: str, reason: str | None = None
                    ) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=prefix))
    doc["spec"]["writers"] = 1
    if reason is not None:
        doc["spec"]["relocation"] = {"reason": reason}
    return json.dumps(doc)


def job_manifest(epoch: float) -> str:
    job = jobset.sim_job(epoch, app=NAME)
    job["metadata"]["name"] = NAME
    job["spec"] |= {"completions": 1, "parallelism": 1}
    return json.dumps(job)


def remove_job() -> None:
    kubectl("delete", "job", "-n", NS, NAME, "--wait=true", "--timeout=90s", timeout=100)


def pods() -> list[dict[str, Any]]:
    return [p for p in get("pods", "-n", NS, "-l", SELECT)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def trainer_running(exclude: set[str]) -> dict[str, Any] | None:
    for pod in pods():
        statuses = {c["name"]: c for c in pod["status"].get("containerStatuses") or []}
        if pod["metadata"]["name"] not in exclude \
                and "running" in (statuses.get("trainer", {}).get("state") or {}):
            return pod
    return None


def restore_failed(exclude: set[str]) -> tuple[str, dict[str, Any]] | None:
    """A pod (not in `exclude`) whose restore init container ended, and how."""
    for pod in get("pods", "-n", NS, "-l", SELECT)["items"]:
        if pod["metadata"]["name"] in exclude:
            continue
        for status in pod["status"].get("initContainerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated") \
                or (status.get("lastState") or {}).get("terminated")
            if status["name"] == RESTORE and ended and ended.get("exitCode"):
                return pod["metadata"]["name"], ended
    return None


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("  M. the store of a live job moved: refused, then acknowledged, never a fresh start")
    logs = Logs(workdir / "logs" / "move", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        remove(POLICY, NAME)


def _newest_complete(s3: Any, prefix: str) -> int | None:
    listing = s3.client().list_objects_v2(
        Bucket=BUCKET, Prefix=f"{prefix}/{NS}/{POLICY}/manifests/")
    steps = {int(o["Key"].split("/")[-2]) for o in listing.get("Contents") or []
             if o["Key"].endswith("/00000.json")}
    return max(steps) if steps else None


def _copy(s3: Any, source: str, target: str) -> int:
    """Every object under the policy's `source` prefix to `target` (what
    `aws s3 sync` does in the docs); how many."""
    client, copied = s3.client(), 0
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{source}/{NS}/{POLICY}/")
    for page in pages:
        for obj in page.get("Contents") or []:
            key = f"{target}/{obj['Key'][len(source) + 1:]}"
            client.copy_object(Bucket=BUCKET, Key=key,
                               CopySource={"Bucket": BUCKET, "Key": obj["Key"]})
            copied += 1
    return copied


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    began = time.monotonic()
    apply(policy_manifest(allowed_root, s3.port, OLD))
    epoch = time.time() + 5
    apply(job_manifest(epoch))
    pod = wait_for("the writer running", lambda: trainer_running(set()), 240, every=1)
    first = pod["metadata"]["name"]
    logs.follow(first)
    step = wait_for(f"a step complete under {OLD}", lambda: _newest_complete(s3, OLD), 180,
                    every=1)

    # M1: refused while the pod lives, naming the field and the pod.
    refused = kubectl("apply", "-f", "-", input=policy_manifest(allowed_root, s3.port, NEW),
                      check=False)
    check(refused.returncode != 0 and "spec.storage.uri" in refused.stderr
          and first in refused.stderr,
          f"moving the store under a live pod is refused: {refused.stderr.strip()[-300:]!r}")

    # M2: acknowledged; the status remembers where the checkpoints were.
    apply(policy_manifest(allowed_root, s3.port, NEW, reason="e2e: the bucket moves"))
    earlier = wait_for("status.storage.earlier naming the old prefix", lambda: next(
        (e for e in ((get(POLICIES, "-n", NS, POLICY).get("status") or {})
                     .get("storage") or {}).get("earlier") or []
         if e.get("uri", "").endswith(f"/{OLD}/{NS}/{POLICY}")), None), 60, every=1)
    # The step its Checkpoint records had reached (they follow the store by a moment).
    reached = earlier.get("lastGlobalStep")
    check(isinstance(reached, int) and 0 <= reached <= (_newest_complete(s3, OLD) or 0),
          f"the policy remembers {earlier['uri']} at step {reached} (moved "
          f"{earlier.get('movedAt')}, {earlier.get('reason')!r}; first complete there: {step})")

    # M3: the job restarts on a node that holds no copy (the local tier is
    # per node and never moves: wiped here); restore refuses to start fresh.
    remove_job()
    wait_for(f"{first} gone", lambda: not get("pods", "-n", NS, "-l", SELECT)["items"],
             GRACE + 30, every=1)
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    saved = {e["step"]: e["hash"] for e in logs.trainer(first) if e["event"] == "save"}
    apply(job_manifest(epoch))
    failed_pod, ended = wait_for("the replacement's restore to end", lambda: restore_failed(
        {first}), 180, every=1)
    logs.follow(failed_pod)
    said = ended.get("message") or ""
    check(ended.get("exitCode") == HISTORY_ELSEWHERE and OLD in said and "startFresh" in said,
          f"{failed_pod}: restore exit {ended.get('exitCode')}, not a fresh start: "
          f"{said.strip()[-300:]!r}")

    # M4: the documented move: copy, and the next replacement restores.
    newest = _newest_complete(s3, OLD)
    copied = _copy(s3, OLD, NEW)
    say(f"  copied {copied} objects from {OLD} to {NEW} (newest complete step {newest})")
    kubectl("delete", "pod", "-n", NS, failed_pod, "--wait=false", check=False)
    pod = wait_for("a replacement training again", lambda: trainer_running(
        {first, failed_pod}), 300, every=1)
    name = pod["metadata"]["name"]
    logs.follow(name)
    loaded = wait_for(f"{name} restored", lambda: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None), 120)
    check(loaded["event"] == "load" and loaded.get("step") == newest
          and loaded.get("hash") == saved.get(newest),
          f"{name} loaded step {loaded.get('step')} from the {loaded.get('tier')} tier under "
          f"{NEW}, the state hash its trainer saved under {OLD}")
    report.append(f"| move: store moved under a live job → refused, acknowledged, restore "
                  f"exit {HISTORY_ELSEWHERE} until copied, then step {newest} | "
                  f"{time.monotonic() - began:.0f} s for the step |")
