"""The JobSet step: writer identity for a real multi-Job workload, on the real
JobSet controller (built from sigs.k8s.io/jobset by e2e/deps/jobset.sh).

A JobSet of two replicated Jobs, `a` (one Job of 2 pods) and `b` (2 Jobs of
1 pod), is 4 writers of one CheckpointPolicy. The sizes are uneven on
purpose: JobSet's per-Job indexes restart at 0 in every child Job, so only
the JobSet's spec gives each pod a distinct rank (a: 0, 1; b: 2, 3), and a
guess from one Job's size would collide. The step asserts 4 distinct
`ckptdrain.io/writer` labels, a step committed on S3 by all 4 writers, then
deletes writer 3's pod: its Job recreates it, it is writer 3 again, and it
restores exactly what writer 3 saved (the simulated trainer's bytes are
random per process, so equal digests can only come from its own shard).
Before that, on the same JobSet, a gang restart (e2e/scenario/gang.py): one
rank's trainer fails, `failurePolicy.maxRestarts: 1` restarts every Job,
and every rank restores one agreed step.

    install_controller(chart, image)   at the start (no wait: the controller's
                                       certificates settle meanwhile)
    run(s3, allowed_root, report)      after the main scenario's steps
"""

from __future__ import annotations

import json
import shutil
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kube import POLICIES, Failed, apply, get, helm, kubectl, wait_for
from trainers import TRAINERS, Logs
from views import BUCKET, EVERY, GRACE, NS, S3_NS, STEP_S, wait_mid_interval

JS_NS, JS_RELEASE = "jobset-system", "jobset"
NAME, POLICY, PREFIX = "js", "js", "js"
API = "jobset.x-k8s.io/v1alpha2"
WRITERS, CHECKPOINT_BYTES = 4, 20_000_000
#: replicated Job -> (Jobs, pods per Job); ranks follow in this order.
SHAPE = {"a": (1, 2), "b": (2, 1)}
SELECT = f"jobset.sigs.k8s.io/jobset-name={NAME}"
WRITER = "ckptdrain.io/writer"
HERE = Path(__file__).resolve().parent

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def install_controller(chart: str, image: str) -> None:
    """helm install JobSet's own chart (from its module) with our image; returns
    once the objects exist, readiness is awaited by `ready`."""
    repo, tag = image.rsplit(":", 1)
    helm("upgrade", "--install", JS_RELEASE, chart, "-n", JS_NS, "--create-namespace",
         "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
         "--set", "image.pullPolicy=Never",
         # The chart asks for half a CPU: more than a 2-core test node can spare.
         "--set", "controller.resources.requests.cpu=50m",
         "--set", "controller.resources.requests.memory=64Mi",
         "--set", "controller.resources.limits.memory=512Mi", timeout=120)


def ready(say: Say) -> float:
    """Waits for the controller and its webhooks (a server-side dry run of a
    JobSet passes them); returns how long that took from now."""
    began = time.monotonic()
    kubectl("-n", JS_NS, "rollout", "status", "deploy", "--timeout=180s", timeout=190)
    probe = jobset_manifest(0.0)
    wait_for("JobSet's webhooks answering (server-side dry run)", lambda: kubectl(
        "apply", "--dry-run=server", "-f", "-", input=probe, check=False).returncode == 0,
        120, every=2)
    say(f"  JobSet controller and webhooks ready (+{time.monotonic() - began:.1f}s here)")
    return time.monotonic() - began


def _render(name: str, **values: object) -> str:
    return string.Template((HERE / name).read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def policy_manifest(allowed_root: str, s3_port: int, policy: str = POLICY, app: str = NAME,
                    prefix: str = PREFIX) -> str:
    """A CheckpointPolicy of WRITERS writers selecting pods labelled app=<app>."""
    doc = yaml.safe_load(_render(
        "policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES=f"{CHECKPOINT_BYTES // 1_000_000}M",
        ALLOWED_ROOT=allowed_root, BUCKET=BUCKET, S3_NAMESPACE=S3_NS, S3_PORT=s3_port))
    doc["metadata"]["name"] = policy
    doc["spec"]["selector"] = {"matchLabels": {"app": app}}
    doc["spec"]["writers"] = WRITERS
    doc["spec"]["storage"]["uri"] = f"s3://{BUCKET}/{prefix}"
    return json.dumps(doc)


def sim_job(epoch: float, app: str = NAME) -> dict[str, Any]:
    """job.yaml run by the simulated trainer, its pod labelled app=<app>; a
    workload takes its pod template."""
    job_yaml = _render("job.yaml", NAMESPACE=NS, GRACE=GRACE, EPOCH=f"{epoch:.3f}",
                       TORCH_SITE="/nonexistent")
    job = json.loads(TRAINERS["sim"].job(job_yaml, EVERY, STEP_S, epoch,
                                         CHECKPOINT_BYTES // WRITERS))
    pod = job["spec"]["template"]
    pod["metadata"]["labels"] = {"app": app, "ckptdrain.io/inject": "true"}
    # Six simulated trainers share two cores with everything else here.
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "50m", "memory": "128Mi"},
                                                 "limits": {"memory": "1Gi"}}
    return job


def jobset_manifest(epoch: float) -> str:
    """job.yaml's pod, run by the simulated trainer, in every Job of the JobSet."""
    job = sim_job(epoch)
    pod = job["spec"]["template"]
    replicated = []
    # Rules run in order: after job.yaml's (an interruption, exit 143, is
    # ignored), any other non-zero exit of the trainer fails its Job at once
    # rather than running the index again.
    job["spec"]["podFailurePolicy"]["rules"].append({"action": "FailJob", "onExitCodes": {
        "containerName": "trainer", "operator": "NotIn", "values": [143]}})
    for name, (replicas, pods) in SHAPE.items():
        spec = {k: v for k, v in job["spec"].items() if k != "template"}
        spec |= {"completions": pods, "parallelism": pods, "template": pod}
        replicated.append({"name": name, "replicas": replicas, "template": {"spec": spec}})
    return json.dumps({
        "apiVersion": API, "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NS},
        # A preempted pod is replaced by its own Job (podFailurePolicy in
        # job.yaml); a trainer that fails fails its Job, and JobSet restarts
        # the whole gang, once (gang.py).
        "spec": {"failurePolicy": {"maxRestarts": 1}, "replicatedJobs": replicated},
    })


def expected_rank(labels: dict[str, str]) -> int:
    offset = 0
    for name, (replicas, pods) in SHAPE.items():
        if name == labels["jobset.sigs.k8s.io/replicatedjob-name"]:
            return (offset + int(labels["jobset.sigs.k8s.io/job-index"]) * pods
                    + int(labels["batch.kubernetes.io/job-completion-index"]))
        offset += replicas * pods
    raise Failed(f"pod labels name no replicated Job of {NAME}: {labels}")


def running_pods(select: str = SELECT) -> dict[int, dict[str, Any]]:
    """Live pods matching `select` whose trainer runs, by their writer label."""
    out = {}
    for pod in get("pods", "-n", NS, "-l", select)["items"]:
        statuses = {c["name"]: c for c in pod["status"].get("containerStatuses") or []}
        if pod["metadata"].get("deletionTimestamp") or "running" not in (
                statuses.get("trainer", {}).get("state") or {}):
            continue
        out[int(pod["metadata"]["labels"][WRITER])] = pod
    return out


def complete_steps(policy: str = POLICY) -> list[int]:
    recs = get("checkpoints", "-n", NS, "-l", f"ckptdrain.io/policy={policy}")["items"]
    return sorted(int(r["spec"]["step"]) for r in recs
                  if (r.get("status") or {}).get("state") == "Global")


def committed_writers(s3: Any, step: int, policy: str = POLICY,
                      prefix: str = PREFIX) -> list[str]:
    listing = s3.client().list_objects_v2(
        Bucket=BUCKET, Prefix=f"{prefix}/{NS}/{policy}/manifests/{step:020d}/")
    return sorted(o["Key"].rsplit("/", 1)[1] for o in listing.get("Contents") or [])


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("J. JobSet (2 replicated Jobs, 4 pods) on the real JobSet controller: 4 writers")
    took = ready(say)
    report.append(f"| JobSet controller Ready (waited after the main steps) | {took:.1f} s |")
    logs = Logs(workdir / "logs" / "jobset", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    # What a failed earlier run left on the node would be restored at start.
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    apply(policy_manifest(allowed_root, s3.port))
    epoch = time.time()
    began = time.monotonic()
    apply(jobset_manifest(epoch))
    pods = wait_for("4 JobSet pods running", lambda: (p := running_pods()) and len(p) == 4
                    and p, 240, every=1)
    for pod in pods.values():
        logs.follow(pod["metadata"]["name"])
    ranks = {w: expected_rank(p["metadata"]["labels"]) for w, p in pods.items()}
    check(sorted(pods) == list(range(WRITERS)) and all(w == r for w, r in ranks.items()),
          f"4 distinct writers {sorted(pods)}, each the JobSet's global rank of its pod "
          f"({', '.join(p['metadata']['name'] + '=' + str(w) for w, p in sorted(pods.items()))})")
    first = wait_for("a step complete on S3 for all 4 writers", complete_steps, 180, every=1)
    committed = committed_writers(s3, first[0])
    check(committed == [f"{w:05d}.json" for w in range(WRITERS)],
          f"step {first[0]} committed on S3 by writers {committed}")
    report.append(f"| JobSet: first step committed by 4 writers | "
                  f"{time.monotonic() - began:.1f} s after the JobSet |")

    # First the gang restart, while every rank trains on one timeline (a
    # rank replaced alone restores into a new one that the others, training
    # on, do not share: the steps after it would not be one checkpoint).
    # Imported here: gang builds on agreement's helpers, which import this module.
    import gang
    before = pods[3]["metadata"]["name"]
    pods = gang.run(logs, pods, epoch, report, say, check)

    # Writer 3: the second Job of `b`, the rank a per-Job index alone would get wrong.
    old = pods[3]["metadata"]["name"]
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    say(f"  deleted {old} (writer 3)")
    saved = wait_for(f"{old}: emergency checkpoint", lambda: next(
        (e for e in logs.trainer(old) if e["event"] == "save" and e["reason"] == "sigterm"),
        None), GRACE)
    new_pod = wait_for("writer 3's replacement running", lambda: (
        p := running_pods().get(3)) and p["metadata"]["name"] != old and p, 180, every=1)
    new = new_pod["metadata"]["name"]
    logs.follow(new)
    check(new_pod["metadata"]["labels"][WRITER] == "3"
          and expected_rank(new_pod["metadata"]["labels"]) == 3,
          f"{new} replaces {old} as writer 3")
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    # Writer 3's saves in both its earlier pods (the step may be the one
    # the gang restart restored, which the pod before it saved).
    mine = {e["step"]: e["hash"] for name in (before, old) for e in logs.trainer(name)
            if e["event"] == "save"}
    check(load["event"] == "load" and load["step"] in mine and load["hash"] == mine[load["step"]],
          f"{new}: restored step {load.get('step')} from the {load.get('tier')} tier, "
          f"state hash equal to what writer 3 saved ({str(load.get('hash'))[:16]}…; "
          f"emergency step {saved['step']})")
    others = {e["hash"] for w, p in pods.items() if w != 3
              for e in logs.trainer(p["metadata"]["name"]) if e["event"] == "save"}
    check(load["hash"] not in others, "no other writer's shard has that hash")
    annotation = wait_for("restored-from annotation", lambda: get("pod", "-n", NS, new)[
        "metadata"].get("annotations", {}).get("ckptdrain.io/restored-from"), 30)
    check(f"step={load['step']}" in annotation, f"{new}: ckptdrain.io/restored-from "
          f"{annotation}")
    report.append(f"| JobSet: writer 3 deleted → restored as writer 3 ({load['tier']} tier) | "
                  f"{load['restore_seconds']:.2f} s in the init container; pod deleted → "
                  f"trainer loaded {load['at'] - deleted:.1f} s |")
    kubectl("delete", "jobset", "-n", NS, NAME, "--wait=true", "--timeout=90s", timeout=100)
    wait_for("JobSet pods gone", lambda: not get("pods", "-n", NS, "-l", SELECT)["items"], 90)
    kubectl("delete", POLICIES, "-n", NS, POLICY, "--wait=true", timeout=60)
