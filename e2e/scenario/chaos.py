"""The chaos step: opted-in pods while the operator's pods die, with the
default chart (2 replicas, the pod webhook failing closed), and what a
cluster that chose `Ignore` sees. Three measurements, all in the report:

C1. Operator pods deleted in a loop while a burst of opted-in pods is
    created: first one replica at a time (the other keeps answering), then
    every replica at once (admission dark until one is back). Every create
    the apiserver refuses (no replica answered, failure policy Fail) is
    retried, as a pod's controller would. Afterwards: pods that exist
    without injection (must be 0), and the refusals retried.
C2. webhook.podFailurePolicy=Ignore, the operator scaled to 0, an opted-in
    pod created (admitted bare), the operator scaled back: how long until
    the sweep flags it (the pod's Unprotected Event, the policy's
    PodsUnprotected condition).
C3. Admission latency of a labelled pod (server-side dry run, timed at the
    client) in steady state and during `kubectl rollout restart` of the
    operator: p50, p99, and refusals (counted and printed, not fatal: the
    pod's controller retries a refusal; a pod admitted without injection
    is fatal).

The pods are real API objects admitted through the real webhooks, but
pinned to a node that does not exist, so 40 of them never start: admission
is what is measured, and 40 checkpointing pods would not fit 2 cores.
"""

from __future__ import annotations

import calendar
import json
import string
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kube import KUBECTL, POLICIES, Failed, apply, get, helm, kubectl, wait_for
from rawapi import Api, percentile
from views import BUCKET, NS, OP_NS, RELEASE, S3_NS

POLICY, APP, RANK = "chaos", "chaos", "example.com/chaos-rank"
BURST = 40
#: Rounds of deletions per burst, at most: with every replica deleted, a round
#: is a start-up's length of dark admission (~15 s on the test VM).
ROUNDS = 5
OPERATOR = f"app.kubernetes.io/instance={RELEASE}"
INJECTED = "ckptdrain.io/injected"
HERE = Path(__file__).resolve().parent

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    text = string.Template((HERE / "policy.yaml").read_text()).substitute(
        NAMESPACE=NS, CHECKPOINT_BYTES="40M", ALLOWED_ROOT=allowed_root, BUCKET=BUCKET,
        S3_NAMESPACE=S3_NS, S3_PORT=str(s3_port))
    doc = yaml.safe_load(text)
    doc["metadata"]["name"] = POLICY
    doc["spec"]["selector"] = {"matchLabels": {"app": APP}}
    doc["spec"]["writers"] = BURST
    # Bare pods carry no workload index: the policy says where the rank is.
    doc["spec"]["identity"] = {"rankLabel": RANK}
    doc["spec"]["storage"]["uri"] = f"s3://{BUCKET}/{POLICY}"
    return json.dumps(doc)


def pod(name: str, rank: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {
            "app": APP, "ckptdrain.io/inject": "true", RANK: str(rank)}},
        "spec": {
            "serviceAccountName": "ckptdrain-agent", "restartPolicy": "Never",
            # No node has this label: admitted, never started.
            "nodeSelector": {"ckptdrain.io/e2e-nowhere": "true"},
            "containers": [{"name": "trainer", "image": "docker.io/library/ckptdrain:dev",
                            "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
        },
    }


def operator_pods() -> list[str]:
    return [p["metadata"]["name"] for p in get("pods", "-n", OP_NS, "-l", OPERATOR)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def operator_ready(timeout: float = 180) -> None:
    kubectl("-n", OP_NS, "rollout", "status", "deploy", RELEASE, f"--timeout={timeout:.0f}s",
            timeout=timeout + 10)


def chaos_pods() -> list[dict[str, Any]]:
    return get("pods", "-n", NS, "-l", f"app={APP}")["items"]


def clear_pods() -> None:
    kubectl("delete", "pods", "-n", NS, "-l", f"app={APP}", "--wait=false")
    wait_for("chaos pods gone", lambda: not chaos_pods(), 90)


# -- C1 --------------------------------------------------------------------------
def ready_replicas() -> list[dict[str, Any]]:
    """Live operator pods whose Ready condition is True, oldest first."""
    pods = [p for p in get("pods", "-n", OP_NS, "-l", OPERATOR)["items"]
            if not p["metadata"].get("deletionTimestamp") and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions") or [])]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def burst_under_restarts(api: Api, every: bool, say: Say, check: Check,
                         report: list[str]) -> None:
    """`every`: each round deletes every operator pod (admission dark until one
    is back); else only the oldest (the other replica keeps answering). A round
    starts once the replicas are back (one, or both), so admission is dark
    for a restart's length, not for good."""
    what = "every operator pod" if every else "one operator pod (the oldest)"
    say(f"C1. {what} deleted in a loop while {BURST} opted-in pods are created")
    stop = threading.Event()
    rounds: list[float] = []

    def killer() -> None:
        while not stop.is_set() and len(rounds) < ROUNDS:
            victims = [p["metadata"]["name"] for p in ready_replicas()]
            if every or len(victims) >= 2:
                kubectl("delete", "pods", "-n", OP_NS, *(victims if every else victims[:1]),
                        "--wait=false", check=False, timeout=30)
                rounds.append(time.monotonic())
            # The next round once the Deployment has replaced them.
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                if len(ready_replicas()) >= (1 if every else 2):
                    break
                stop.wait(0.5)
            # Some creates between dark windows: a restart every few seconds
            # would only measure the operator's start-up time.
            stop.wait(5 if every else 2)

    began = time.monotonic()
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    refused: dict[str, int] = {}
    messages: set[str] = set()
    try:
        for i in range(BURST):
            name = f"chaos-{i:02d}"
            deadline = time.monotonic() + 180
            while True:
                answer = api.create_pod(NS, pod(name, i))
                if answer.status in (201, 409):  # 409: a timed-out try had landed
                    break
                refused[name] = refused.get(name, 0) + 1
                messages.add(answer.message[:160])
                if time.monotonic() > deadline:
                    raise Failed(f"{name} still refused after 180 s: {answer.message}")
                time.sleep(0.5)  # a controller's retry, without its backoff
            time.sleep(1)
    finally:
        stop.set()
        thread.join(timeout=150)
    took = time.monotonic() - began
    operator_ready()
    pods = chaos_pods()
    bare = [p["metadata"]["name"] for p in pods
            if INJECTED not in (p["metadata"].get("annotations") or {})]
    check(len(pods) == BURST, f"all {BURST} opted-in pods exist")
    check(not bare, f"pods without injection: {len(bare)} {bare[:5]} (of {BURST}, over "
          f"{len(rounds)} rounds, {took:.0f} s)")
    say(f"  creates refused while no replica answered: {sum(refused.values())} over "
        f"{len(refused)} pods{', e.g. ' + min(messages) if messages else ''}")
    report.append(f"| C1: {what} deleted in a loop ({len(rounds)} rounds in {took:.0f} s) "
                  f"while {BURST} opted-in pods were created: admitted without injection | "
                  f"{len(bare)} of {BURST} |")
    retried = (f"{sum(refused.values())} refusals over {len(refused)} pods, each admitted "
               "with injection on a later retry" if refused else "none")
    report.append(f"| C1: the same, creates refused (no replica answered) and retried | "
                  f"{retried} |")
    clear_pods()


# -- C2 --------------------------------------------------------------------------
def sweep_latency(api: Api, say: Say, check: Check, report: list[str]) -> None:
    say("C2. failurePolicy Ignore, operator at 0, an opted-in pod admitted bare: sweep")
    set_pod_failure_policy("Ignore")
    try:
        kubectl("-n", OP_NS, "scale", "deploy", RELEASE, "--replicas=0")
        wait_for("operator pods gone", lambda: not get(
            "pods", "-n", OP_NS, "-l", OPERATOR)["items"], 120)
        answer = api.create_pod(NS, pod("chaos-bare", 0))
        check(answer.status == 201 and INJECTED not in (
            answer.body["metadata"].get("annotations") or {}),
            f"with Ignore and no replica the pod is admitted bare ({answer.status})")
        scaled = time.monotonic()
        kubectl("-n", OP_NS, "scale", "deploy", RELEASE, "--replicas=2")
        event = wait_for("the Unprotected Event on chaos-bare", lambda: get(
            "events", "-n", NS, "--field-selector",
            "involvedObject.name=chaos-bare,reason=Unprotected")["items"], 180, every=0.5)
        to_event = time.monotonic() - scaled
        condition = wait_for("PodsUnprotected on the policy", lambda: next(
            (c for c in policy_conditions() if c.get("type") == "PodsUnprotected"
             and c.get("status") == "True"), None), 60, every=0.5)
        to_condition = time.monotonic() - scaled
        started = first_start_after(scaled)
        check("chaos-bare" in json.dumps(condition), f"policy condition PodsUnprotected: "
              f"{condition.get('message', '')[:120]}")
        say(f"  Event: {event[0].get('message', '')[:100]}")
        report.append(f"| C2: operator scaled 0 → 2 → sweep flags a bare pod (Event; "
                      f"policy condition) | {to_event:.1f} s; {to_condition:.1f} s "
                      f"(the first operator container started {started:.1f} s after "
                      "the scale-up) |")
        kubectl("delete", "pod", "-n", NS, "chaos-bare", "--wait=true", timeout=60)
        wait_for("PodsUnprotected cleared", lambda: not any(
            c.get("type") == "PodsUnprotected" and c.get("status") == "True"
            for c in policy_conditions()), 60)
        say("  ok: deleting the pod clears the condition")
    finally:
        set_pod_failure_policy("Fail")
        operator_ready()


def set_pod_failure_policy(value: str) -> None:
    helm("upgrade", RELEASE, str(HERE.parent.parent / "charts/ckptdrain"), "-n", OP_NS,
         "--reuse-values", "--set", f"webhook.podFailurePolicy={value}", timeout=120)
    hooks = [h for item in get("mutatingwebhookconfigurations", "-l",
                               f"app.kubernetes.io/instance={RELEASE}")["items"]
             for h in item["webhooks"]]
    pods = [h for h in hooks if "pods" in json.dumps(h.get("rules"))]
    if not pods or any(h.get("failurePolicy") != value for h in pods):
        raise Failed(f"pod webhook failurePolicy is not {value} after helm upgrade")


def policy_conditions() -> list[dict[str, Any]]:
    status = get(POLICIES, "-n", NS, POLICY).get("status") or {}
    return status.get("conditions") or []


def first_start_after(since: float) -> float:
    """Seconds from `since` (monotonic) to the first operator container's start
    (the kubelet's startedAt: wall clock, second resolution)."""
    wall_since = time.time() - (time.monotonic() - since)
    starts = [calendar.timegm(time.strptime(running["startedAt"], "%Y-%m-%dT%H:%M:%SZ"))
              for p in get("pods", "-n", OP_NS, "-l", OPERATOR)["items"]
              for c in p["status"].get("containerStatuses") or []
              if (running := (c.get("state") or {}).get("running"))]
    return min(starts) - wall_since if starts else float("nan")


# -- C3 --------------------------------------------------------------------------
def rollout_latency(api: Api, say: Say, check: Check, report: list[str]) -> None:
    say("C3. admission latency (server-side dry run) steady and during a rolling restart")
    probe = pod("chaos-probe", 0)

    refusals: list[str] = []

    def sample() -> tuple[float, bool]:
        """(seconds, answered); a pod admitted without injection fails at once."""
        answer = api.create_pod(NS, probe, dry_run=True)
        if answer.status != 201:
            refusals.append(f"{answer.status}: {answer.message[:200]}")
            return answer.seconds, False
        if INJECTED not in (answer.body.get("metadata", {}).get("annotations") or {}):
            raise Failed("a labelled pod was admitted without injection (dry run)")
        return answer.seconds, True

    steady = [sample() for _ in range(100)]
    baseline = [api.create_pod(NS, {**probe, "metadata": {
        "name": "chaos-probe", "namespace": NS}}, dry_run=True).seconds for _ in range(30)]
    before = operator_pods()
    kubectl("-n", OP_NS, "rollout", "restart", "deploy", RELEASE)
    status = subprocess.Popen([KUBECTL, "-n", OP_NS, "rollout", "status", "deploy", RELEASE,
                               "--timeout=240s"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    during: list[tuple[float, bool]] = []
    began = time.monotonic()
    while status.poll() is None and time.monotonic() - began < 250:
        during.append(sample())
        time.sleep(0.05)
    took = time.monotonic() - began
    check(status.wait(timeout=10) == 0, f"rollout restart finished in {took:.0f} s")
    check(not set(before) & set(operator_pods()), "every operator pod was replaced")
    for refusal in refusals:
        say(f"  refused: {refusal}")
    for label, pairs in (("steady", steady), ("during rolling restart", during)):
        samples = [seconds for seconds, _ in pairs]
        p50, p99 = 1000 * percentile(samples, 50), 1000 * percentile(samples, 99)
        refused = sum(1 for _, ok in pairs if not ok)
        say(f"  {label}: n={len(samples)} p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
            f"max {1000 * max(samples):.0f} ms, {refused} refused")
        report.append(f"| C3: labelled pod dry-run create, {label} (n={len(samples)}) | "
                      f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {1000 * max(samples):.0f} ms, "
                      f"{refused} refused |")
    report.append(f"| C3: the same pod unlabelled (no webhook), for scale (n={len(baseline)}) | "
                  f"p50 {1000 * percentile(baseline, 50):.0f} ms, p99 "
                  f"{1000 * percentile(baseline, 99):.0f} ms |")


def run(s3: Any, allowed_root: str, report: list[str], say: Say, check: Check) -> None:
    apply(policy_manifest(allowed_root, s3.port))
    wait_for("chaos policy status", lambda: (get(POLICIES, "-n", NS, POLICY)
                                             .get("status") or {}).get("requiredBandwidth"), 60)
    api = Api()
    try:
        burst_under_restarts(api, False, say, check, report)
        burst_under_restarts(api, True, say, check, report)
        sweep_latency(api, say, check, report)
        rollout_latency(api, say, check, report)
    finally:
        api.close()
        kubectl("delete", "pods", "-n", NS, "-l", f"app={APP}", "--wait=false", check=False)
        kubectl("delete", POLICIES, "-n", NS, POLICY, "--ignore-not-found",
                "--wait=true", check=False, timeout=60)
