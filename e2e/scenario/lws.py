"""The LeaderWorkerSet step: writer identity for a leader/worker workload, on
the real LeaderWorkerSet controller (built from sigs.k8s.io/lws by
`e2e/deps/jobset.sh lws`; `make e2e` only, CI's short run stays without it).

A LeaderWorkerSet of 2 groups × size 2 is 4 writers of one CheckpointPolicy.
LWS runs each group as a leader pod plus a StatefulSet of workers, and its
own pod webhook labels them with the group and worker index; the operator's
rank is group × size + worker (operator/ckptdrain/operator/policy/identity.py). The
step asserts 4 distinct `ckptdrain.io/writer` labels, each equal to the rank
read back from the pod's own LWS labels and size annotation, and a step
committed on S3 by all 4 writers. The pods, policy, S3 helpers and simulated
trainer are the JobSet step's (jobset.py).

    install_controller(chart, image)   at the start (no wait: the controller's
                                       certificates settle meanwhile)
    run(s3, allowed_root, workdir, report, say, check)
                                       after the main scenario's steps
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jobset
from jobset import WRITERS, Check, Say
from kube import POLICIES, Failed, apply, get, helm, kubectl, wait_for
from trainers import TRAINERS, Logs
from views import NS

LWS_NS, LWS_RELEASE = "lws-system", "lws"
NAME = POLICY = PREFIX = "lws"
API = "leaderworkerset.x-k8s.io/v1"
GROUPS, SIZE = 2, 2
SELECT = f"leaderworkerset.sigs.k8s.io/name={NAME}"
GROUP = "leaderworkerset.sigs.k8s.io/group-index"
WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
SIZE_KEY = "leaderworkerset.sigs.k8s.io/size"


def install_controller(chart: str, image: str) -> None:
    """helm install LWS's own chart (from its module) with our image; returns
    once the objects exist, readiness is awaited by `ready`."""
    repo, tag = image.rsplit(":", 1)
    helm("upgrade", "--install", LWS_RELEASE, chart, "-n", LWS_NS, "--create-namespace",
         "--set", f"image.manager.repository={repo}", "--set", f"image.manager.tag={tag}",
         "--set", "image.manager.pullPolicy=Never",
         # The chart asks for a whole CPU and 1Gi: more than a 2-core test node can spare.
         "--set", "resources.requests.cpu=50m",
         "--set", "resources.requests.memory=64Mi",
         "--set", "resources.limits.memory=512Mi", timeout=120)


def ready(say: Say) -> float:
    """Waits for the controller and its webhooks (a server-side dry run of a
    LeaderWorkerSet passes them); returns how long that took from now."""
    began = time.monotonic()
    kubectl("-n", LWS_NS, "rollout", "status", "deploy", "--timeout=180s", timeout=190)
    probe = lws_manifest(0.0)
    wait_for("LWS's webhooks answering (server-side dry run)", lambda: kubectl(
        "apply", "--dry-run=server", "-f", "-", input=probe, check=False).returncode == 0,
        120, every=2)
    say(f"  LeaderWorkerSet controller and webhooks ready (+{time.monotonic() - began:.1f}s "
        "here)")
    return time.monotonic() - began


def lws_manifest(epoch: float) -> str:
    """job.yaml's pod, run by the simulated trainer, as every leader and worker."""
    pod = jobset.sim_job(epoch, app=NAME)["spec"]["template"]
    # StatefulSet pods: a stopped trainer is restarted in place, not replaced.
    pod["spec"]["restartPolicy"] = "Always"
    return json.dumps({
        "apiVersion": API, "kind": "LeaderWorkerSet",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"replicas": GROUPS, "leaderWorkerTemplate": {
            "size": SIZE, "workerTemplate": pod}},
    })


def expected_rank(pod: dict[str, Any]) -> int:
    """group × size + worker, read from what LWS itself put on the pod."""
    meta = pod["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    try:
        return int(labels[GROUP]) * int(annotations[SIZE_KEY]) + int(labels[WORKER])
    except (KeyError, ValueError) as err:
        raise Failed(f"{meta['name']}: no LWS group/worker index or size ({err})") from None


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say(f"L. LeaderWorkerSet ({GROUPS} groups × {SIZE}) on the real LWS controller: "
        f"{WRITERS} writers")
    took = ready(say)
    report.append(f"| LeaderWorkerSet controller Ready (waited after the main steps) | "
                  f"{took:.1f} s |")
    logs = Logs(workdir / "logs" / "lws", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, check)
    finally:
        logs.stop()


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str], check: Check) -> None:
    apply(jobset.policy_manifest(allowed_root, s3.port, policy=POLICY, app=NAME, prefix=PREFIX))
    began = time.monotonic()
    apply(lws_manifest(time.time()))
    pods = wait_for(f"{WRITERS} LWS pods running", lambda: (
        p := jobset.running_pods(SELECT)) and len(p) == WRITERS and p, 240, every=1)
    for pod in pods.values():
        logs.follow(pod["metadata"]["name"])
    ranks = {w: expected_rank(p) for w, p in pods.items()}
    named = ", ".join(f"{p['metadata']['name']}={w}" for w, p in sorted(pods.items()))
    check(sorted(pods) == list(range(WRITERS)) and all(w == r for w, r in ranks.items()),
          f"{WRITERS} distinct writers {sorted(pods)}, each group × size + worker of its "
          f"pod's LWS labels ({named})")
    first = wait_for(f"a step complete on S3 for all {WRITERS} writers",
                     lambda: jobset.complete_steps(POLICY), 180, every=1)
    committed = jobset.committed_writers(s3, first[0], policy=POLICY, prefix=PREFIX)
    check(committed == [f"{w:05d}.json" for w in range(WRITERS)],
          f"step {first[0]} committed on S3 by writers {committed}")
    report.append(f"| LeaderWorkerSet: first step committed by {WRITERS} writers | "
                  f"{time.monotonic() - began:.1f} s after the LeaderWorkerSet |")
    kubectl("delete", "leaderworkerset", "-n", NS, NAME, "--wait=true", "--timeout=90s",
            timeout=100)
    wait_for("LWS pods gone", lambda: not get("pods", "-n", NS, "-l", SELECT)["items"], 120)
    kubectl("delete", POLICIES, "-n", NS, POLICY, "--wait=true", timeout=60)
