"""What the Kueue step (kueue.py) checks against the trainers' logs: the
recency published on the real Workload before the preemption, and what the
policy's status.goodput and `ckptdrain goodput` say the preemption cost;
and what the operator says of Kueue's settings (KueueCompatible)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import jobset
from jobset import Check, Say
from kube import get, wait_for
from trainers import Logs
from views import NS, policy_status

NAME = POLICY = "kq"
WORKLOADS = "workloads.kueue.x-k8s.io"
RECENCY = "ckptdrain.io/checkpoint-recency"
#: The trainers' step (kueue.STEP_S) plus goodput_check's half second: the
#: client notes the first step after a restore up to one step after the
#: trainer's `start` line.
RECOVERY_TOLERANCE_S = 0.5 + 0.5


def workload() -> dict[str, Any] | None:
    """The JobSet's Kueue Workload, found by Kueue's job-uid label."""
    uid = get("jobset", "-n", NS, NAME)["metadata"]["uid"]
    items = get(WORKLOADS, "-n", NS, "-l", f"kueue.x-k8s.io/job-uid={uid}")["items"]
    return items[0] if len(items) == 1 else None


def _when(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def check_recency(logs: Logs, old: dict[int, str], every: int, check: Check) -> None:
    """The annotation on the real Workload names, as `pod`, a step every
    trainer logged saving, at most one checkpoint interval (`every` steps)
    behind the newest such step, and as `all` a step complete on S3 that
    every trainer saved, at the times the trainers were at them; the JobSet
    carries the same. Not "the newest of each at one reading": the operator
    publishes at most one pass every 5 s (docs/recency.md), so `all` may be
    written only with the next checkpoint's `pod`."""
    def matched() -> tuple[dict[str, Any], dict[str, list[float]]] | None:
        value = ((workload() or {}).get("metadata", {}).get("annotations") or {}).get(RECENCY)
        doc = json.loads(value) if value else {}
        if "pod" not in doc or "all" not in doc:
            return None
        saved = [{e["step"]: e["at"] for e in logs.trainer(n) if e["event"] == "save"}
                 for n in old.values()]
        common = set.intersection(*(set(s) for s in saved))
        pod, all_ = doc["pod"]["step"], doc["all"]["step"]
        if not (pod in common and all_ in common and all_ in jobset.complete_steps(POLICY)
                and pod >= all_ and max(common) - pod <= every):
            return None
        return doc, {k: [s[doc[k]["step"]] for s in saved] for k in ("pod", "all")}
    doc, at = wait_for("the Workload's recency matching the trainers' logs", matched, 120,
                       every=1)
    for domain in ("pod", "all"):
        when = _when(doc[domain]["time"])
        check(min(at[domain]) - 5 <= when <= max(at[domain]) + 5,
              f"recency {domain}: step {doc[domain]['step']} at {doc[domain]['time']}, "
              f"when the trainers saved it ({min(at[domain]):.1f}–{max(at[domain]):.1f}; "
              f"{'complete on S3, ' if domain == 'all' else ''}saved by every trainer)")
    owner = get("jobset", "-n", NS, NAME)["metadata"].get("annotations", {}).get(RECENCY)
    check(owner is not None and json.loads(owner)["all"]["step"] >= doc["all"]["step"],
          f"the JobSet carries the recency too: {owner}")


def check_goodput(logs: Logs, old: dict[int, str], new: dict[int, str],
                  loaded: dict[int, dict[str, Any]], sigterms: dict[int, dict[str, Any]],
                  report: list[str], say: Say, check: Check) -> None:
    """status.goodput holds each preempted pod's interruption as the trainers
    logged it; `ckptdrain goodput` reads it back."""
    for w, name in sorted(old.items()):
        entry = wait_for(f"status.goodput: {name}'s interruption, training again", lambda
                         name=name: next((e for e in (policy_status(POLICY).get("goodput") or {})
                                          .get("recent") or [] if e.get("pod") == name
                                          and e.get("recoverySeconds") is not None), None),
                         60, 1)
        sigterm, load = sigterms[w], loaded[w]
        resume = next(e for e in logs.trainer(new[w]) if e["event"] == "resume")
        logged = resume["at"] - sigterm["at"]
        check(entry["step"] == sigterm["step"] and entry["restoredStep"] == load["step"]
              and entry["lostSteps"] == sigterm["step"] - load["step"]
              and entry["restoredTier"] == load["tier"] and entry["restorePod"] == new[w]
              and abs(entry["recoverySeconds"] - logged) <= RECOVERY_TOLERANCE_S
              # The emergency step restored: no training time lost either.
              and (load["step"] != sigterm["step"] or entry["lostSeconds"] <= 0.5),
              f"goodput: {name} preempted at step {entry['step']}, {new[w]} restored step "
              f"{entry['restoredStep']} ({entry['restoredTier']}): {entry['lostSteps']} steps "
              f"and {entry['lostSeconds']:.1f} s lost, training again after "
              f"{entry['recoverySeconds']:.1f} s (trainers: {logged:.1f} s), of which "
              f"{entry.get('waitingSeconds')} s waiting for resources")
    done = subprocess.run([sys.executable, "-m", "ckptdrain", "goodput", "-n", NS, "--policy",
                           POLICY, "--output", "json"], capture_output=True, text=True,
                          env=os.environ, timeout=60)
    check(done.returncode == 0, f"ckptdrain goodput exits 0 ({done.stderr.strip()[-200:]})")
    (doc,) = json.loads(done.stdout)["policies"]
    lost = sum(sigterms[w]["step"] - loaded[w]["step"] for w in old)
    check(doc["interruptions"] == len(old) and doc["lostSteps"] == lost,
          f"ckptdrain goodput: {doc['interruptions']} interruptions, {doc['lostSteps']} steps "
          f"lost, {doc['recoverySeconds']:.1f} s to training again, "
          f"{doc['waitingForResourcesSeconds']:.1f} s waiting for resources")
    say(f"  ckptdrain goodput: {json.dumps(doc)[:400]}")
    report.append(f"| Kueue preemption in `ckptdrain goodput` | {doc['interruptions']} "
                  f"interruptions (one a writer), {doc['lostSteps']} steps lost, "
                  f"{doc['recoverySeconds']:.1f} s to training again, "
                  f"{doc['waitingForResourcesSeconds']:.1f} s waiting for resources |")


def check_conflicts(timeout: str, injected: str, check: Check) -> None:
    """Kueue's waitForPodsReady.timeout (`timeout`) is below the policy's
    restore.retryDeadline (10m, the default): the policy's KueueCompatible
    says so and names the fix, and says what the quota does not count
    (`injected`: the agent's requests per pod and how many pods); the real
    Workload carries a Warning Event for each."""
    def said() -> dict[str, Any] | None:
        conditions = (policy_status(POLICY) or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "KueueCompatible"
                     and c["status"] == "False" and "waitForPodsReady." in c["message"]
                     and "quota does not count" in c["message"]), None)
    found = wait_for("the policy's KueueCompatible naming both conflicts", said, 120, every=1)
    text = found["message"]
    check(found["reason"] == "WaitForPodsReadyTooShort"
          and f"waitForPodsReady.timeout ({timeout}) is not above "
              "spec.restore.retryDeadline (10m)" in text
          and "raise waitForPodsReady.timeout above" in text,
          f"KueueCompatible False, {found['reason']}: {text}")
    check(f"does not count the injected ckptdrain-agent (w: {injected}" in text,
          f"KueueCompatible names what Kueue's quota does not count ({injected})")
    uid = ((workload() or {}).get("metadata") or {}).get("uid")
    events = get("events", "-n", NS, "--field-selector", f"involvedObject.uid={uid}")["items"]
    reasons = sorted(e["reason"] for e in events if e["type"] == "Warning"
                     and e["reason"] in ("WaitForPodsReadyTooShort", "QuotaExcludesInjected"))
    check(reasons == ["QuotaExcludesInjected", "WaitForPodsReadyTooShort"],
          f"a Warning Event on the Workload per conflict, once each: {reasons}")
