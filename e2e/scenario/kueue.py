"""The Kueue step: a preemption by the real Kueue (built from sigs.k8s.io/kueue
by `e2e/deps/jobset.sh kueue`; full run only, or E2E_ONLY=kueue) costs no
step beyond the interrupted one.

Kueue is installed with its own chart (JobSet integration on), with one
ResourceFlavor, a ClusterQueue of QUOTA_CPU that preempts lower priorities
within itself, a LocalQueue and two WorkloadPriorityClasses. A JobSet of
WRITERS simulated trainers (one CheckpointPolicy) is queued at low priority,
admitted, and checkpoints; the recency annotation on its real Kueue Workload
is checked against the trainers' logs. A high-priority Job that does not fit
beside it makes Kueue preempt it: the JobSet is suspended, its pods get
SIGTERM, and each writer's emergency step must be committed on S3 before the
pods are gone (within the grace period). The high Job finishes and is
deleted; Kueue readmits the JobSet, and every rank restores its emergency
step with the hash it saved: steps lost = 0.

The trainers step every STEP_S (slower than the other steps' 0.1 s): the
pods get SIGTERM a few milliseconds apart, and an emergency step is the one
a trainer is on then; only a step boundary between two SIGTERMs gives two
ranks different emergency steps, which a longer step makes rare. Then
restore rightly takes the newest step every rank saved (it never mixes two
steps), and the step expects that one, with the steps it loses.

    run(s3, chart, image, allowed_root, workdir, report, say, check)
        after the main scenario's steps: installs Kueue first (its webhooks
        on every Job would otherwise stand in the way of the other steps
        while it starts) and uninstalls it at the end
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import jobset
import kueue_checks
import yaml
from jobset import Check, Say
from kube import POLICIES, Failed, apply, get, helm, kubectl, wait_for
from trainers import TRAINERS, Logs
from views import GRACE, NS, OP_NS, RELEASE

KQ_NS, KQ_RELEASE = "kueue-system", "kueue"
REPO = Path(__file__).resolve().parents[2]
NAME, POLICY, PREFIX = kueue_checks.NAME, kueue_checks.POLICY, "kq"
HIGH = "kq-high"
QUEUE, CLUSTER_QUEUE, FLAVOR = "kq", "kq", "kq-default"
API = "kueue.x-k8s.io/v1beta1"
WRITERS, CHECKPOINT_BYTES = 2, 10_000_000
#: The shared step clock of this step's trainers: a checkpoint every 10 s.
STEP_S, EVERY = 0.5, 20
#: Each trainer and the high Job's pod ask for POD_CPU; the queue holds three.
POD_CPU, QUOTA_CPU = "50m", "150m"
SELECT = f"jobset.sigs.k8s.io/jobset-name={NAME}"
workload = kueue_checks.workload
DOC = Path(__file__).resolve().parents[2] / "docs" / "kueue.md"
DOC_MARK = ("<!-- docs-test: fragment kueue objects, applied as written (the namespace "
            "aside) by e2e/scenario/kueue.py -->")
CHART_CONFIG = """\
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
integrations:
  frameworks: ["batch/job", "jobset.x-k8s.io/jobset"]
waitForPodsReady:
  enable: true
  timeout: 5m
"""
#: Kueue's waitForPodsReady.timeout above: shorter than the policy's
#: restore.retryDeadline (10m, the default), which the operator must say.
PODS_READY_TIMEOUT = "5m"
#: What Kueue's quota does not count: the agent's requests (the chart's
#: default containers.agent.requests) on each of the WRITERS pods.
UNCOUNTED = f"cpu 100m, memory 256Mi per pod × {WRITERS}"


def install_controller(chart: str, image: str, workdir: Path) -> None:
    """helm install Kueue's own chart (from its module) with our image; returns
    once the objects exist, readiness is awaited by `ready`."""
    repo, tag = image.rsplit(":", 1)
    config = workdir / "kueue-config.yaml"
    config.write_text(CHART_CONFIG)
    helm("upgrade", "--install", KQ_RELEASE, chart, "-n", KQ_NS, "--create-namespace",
         "--set", f"controllerManager.manager.image.repository={repo}",
         "--set", f"controllerManager.manager.image.tag={tag}",
         "--set", "controllerManager.manager.image.pullPolicy=Never",
         # The chart asks for half a CPU and 512Mi: more than a 2-core test node can spare.
         "--set", "controllerManager.manager.resources.requests.cpu=50m",
         "--set", "controllerManager.manager.resources.requests.memory=64Mi",
         "--set-file", f"managerConfig.controllerManagerConfigYaml={config}", timeout=180)


def point_chart_at_kueue(on: bool) -> None:
    """The ckptdrain chart told where Kueue's ConfigMap is (docs/kueue.md), or
    no longer; the operator restarts with it."""
    namespace, name = (KQ_NS, f"{KQ_RELEASE}-manager-config") if on else ("", "")
    helm("upgrade", RELEASE, str(REPO / "charts/ckptdrain"), "-n", OP_NS, "--reuse-values",
         "--set", f"kueue.configMap.namespace={namespace}",
         "--set", f"kueue.configMap.name={name}", "--wait", "--timeout", "180s",
         timeout=200, check=on)
    kubectl("-n", OP_NS, "rollout", "status", "deploy", "--timeout=120s", timeout=130,
            check=on)


def ready(say: Say) -> float:
    """Waits for Kueue and its webhooks (a server-side dry run of a queued
    JobSet passes them); returns how long that took from now."""
    began = time.monotonic()
    kubectl("-n", KQ_NS, "rollout", "status", "deploy", "--timeout=240s", timeout=250)
    probe = jobset_manifest(0.0)
    wait_for("Kueue's webhooks answering (server-side dry run)", lambda: kubectl(
        "apply", "--dry-run=server", "-f", "-", input=probe, check=False).returncode == 0,
        180, every=2)
    say(f"  Kueue controller and webhooks ready (+{time.monotonic() - began:.1f}s here)")
    return time.monotonic() - began


def queues_manifest() -> str:
    """docs/kueue.md's queues, as a user copies them, in this namespace: a
    flavour with no node labels, a ClusterQueue of QUOTA_CPU that preempts
    lower priorities within itself, its LocalQueue, a low and a high priority."""
    text = DOC.read_text()
    block = text[text.index(DOC_MARK):].split("```yaml\n", 1)[1].split("```", 1)[0]
    objects = [d for d in yaml.safe_load_all(block) if d]
    for obj in objects:
        if obj["kind"] == "LocalQueue":
            obj["metadata"]["namespace"] = NS
    names = {o["kind"]: o["metadata"]["name"] for o in objects}
    quota = objects[1]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    if (names.get("LocalQueue"), names.get("ClusterQueue"), quota["nominalQuota"]) != (
            QUEUE, CLUSTER_QUEUE, QUOTA_CPU):
        raise Failed(f"docs/kueue.md's queues: expected LocalQueue {QUEUE} of ClusterQueue "
                     f"{CLUSTER_QUEUE} with {QUOTA_CPU} CPU, found {names}, {quota}")
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def queued(priority: str) -> dict[str, str]:
    return {"kueue.x-k8s.io/queue-name": QUEUE, "kueue.x-k8s.io/priority-class": priority}


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = WRITERS
    return json.dumps(doc)


def jobset_manifest(epoch: float) -> str:
    """One replicated Job of WRITERS simulated trainers, queued at low priority."""
    job_yaml = jobset._render("job.yaml", NAMESPACE=NS, GRACE=GRACE, EPOCH=f"{epoch:.3f}",
                              TORCH_SITE="/nonexistent")
    job = json.loads(TRAINERS["sim"].job(job_yaml, EVERY, STEP_S, epoch,
                                         CHECKPOINT_BYTES // WRITERS))
    pod = job["spec"]["template"]
    pod["metadata"]["labels"] = {"app": NAME, "ckptdrain.io/inject": "true"}
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": POD_CPU, "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    spec = {k: v for k, v in job["spec"].items() if k != "template"}
    spec |= {"completions": WRITERS, "parallelism": WRITERS, "template": pod}
    return json.dumps({
        "apiVersion": jobset.API, "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NS, "labels": queued("kq-low")},
        "spec": {"failurePolicy": {"maxRestarts": 0},
                 "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": spec}}]},
    })


def high_manifest() -> str:
    """A Job at high priority that does not fit beside the JobSet: 2 pods."""
    return json.dumps({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": HIGH, "namespace": NS, "labels": queued("kq-high")},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": HIGH}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "work", "image": "docker.io/library/ckptdrain:dev",
                "imagePullPolicy": "Never",
                "command": ["python3", "-c", "import time; time.sleep(10)"],
                "resources": {"requests": {"cpu": POD_CPU, "memory": "64Mi"}}}]}}},
    })


def condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((wl or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind and cond["status"] == "True":
            return cond
    return None


def mid_interval(epoch: float) -> bool:
    return 0.3 * EVERY <= ((time.time() - epoch) / STEP_S) % EVERY <= 0.6 * EVERY


def run(s3: Any, chart: str, image: str, allowed_root: str, workdir: Path,
        report: list[str], say: Say, check: Check) -> None:
    say(f"K. Kueue preempts a queued JobSet of {WRITERS} writers; readmitted, no step lost")
    logs = Logs(workdir / "logs" / "kueue", NS, TRAINERS["sim"])
    try:
        install_controller(chart, image, workdir)
        took = ready(say)
        report.append(f"| Kueue installed → controller and webhooks ready | {took:.1f} s |")
        point_chart_at_kueue(True)
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        cleanup()


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    # A fresh start: a local tier left by an earlier run on this host would be
    # restored, and the shared step clock would then wait for its step.
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    apply(queues_manifest())
    apply(policy_manifest(allowed_root, s3.port))
    epoch = time.time()
    apply(jobset_manifest(epoch))
    wait_for("the JobSet's Workload admitted", lambda: condition(workload(), "Admitted"), 120)
    pods = wait_for(f"{WRITERS} JobSet pods running", lambda: (
        p := jobset.running_pods(SELECT)) and len(p) == WRITERS and p, 240, every=1)
    old = {w: p["metadata"]["name"] for w, p in pods.items()}
    check(sorted(old) == list(range(WRITERS)), f"writers {sorted(old)}: {old}")
    for name in old.values():
        logs.follow(name)
    began = {w: wait_for(f"{name} started", lambda name=name: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None), 120)
        for w, name in old.items()}
    check(all(e["event"] == "fresh" for e in began.values()),
          f"every writer starts fresh: {[e['event'] for e in began.values()]}")
    wait_for("a step complete on S3 for every writer",
             lambda: jobset.complete_steps(POLICY), 180, every=1)
    kueue_checks.check_recency(logs, old, EVERY, check)
    kueue_checks.check_conflicts(PODS_READY_TIMEOUT, UNCOUNTED, check)

    wait_for("between two scheduled checkpoints", lambda: mid_interval(epoch), 3 * EVERY * STEP_S,
             every=0.1)
    created = time.time()
    apply(high_manifest())
    say(f"  {HIGH} (high priority) created")
    durable, gone = preemption(s3, logs, old, created, check)
    emergency = {w: emergency_save(logs, name) for w, name in old.items()}
    sigterm = min(e["at"] for e in sigterms(logs, old).values())
    evicted = condition(workload(), "Evicted") or {}
    check(evicted.get("reason") == "Preempted",
          f"the Workload was evicted by Kueue: {evicted.get('reason')}: "
          f"{evicted.get('message')}")
    # The agent, a native sidecar, holds the pod until its drain is done: the
    # steps are committed before the pods go, and always within the grace.
    check(max(durable.values()) - sigterm <= GRACE, "every emergency step committed on S3 "
          f"{max(durable.values()) - sigterm:.1f} s after SIGTERM, within the {GRACE} s grace "
          f"(the last pod gone {gone - sigterm:.1f} s after it)")
    report.append(f"| Kueue preemption: high Job created → first SIGTERM | "
                  f"{sigterm - created:.1f} s |")
    report.append(f"| Kueue preemption: SIGTERM → every emergency step committed on S3 | "
                  f"{max(durable.values()) - sigterm:.1f} s (pods gone "
                  f"{gone - sigterm:.1f} s; grace {GRACE} s) |")

    wait_for(f"{HIGH} complete", lambda: any(
        c["type"] == "Complete" and c["status"] == "True" for c in (
            get("job", "-n", NS, HIGH).get("status") or {}).get("conditions") or []), 180)
    kubectl("delete", "job", "-n", NS, HIGH, "--wait=true", "--timeout=60s", timeout=70)
    admitted = wait_for("the JobSet readmitted", lambda: condition(workload(), "Admitted"), 180)
    # Kueue readmits as soon as the high Job's quota is free, maybe before the
    # delete above returned: its condition says when (whole seconds).
    readmitted = datetime.fromisoformat(
        admitted["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    say(f"  readmitted ({admitted['lastTransitionTime']})")
    new = wait_for(f"{WRITERS} new JobSet pods running", lambda: (
        p := jobset.running_pods(SELECT)) and len(p) == WRITERS
        and not set(old.values()) & {q["metadata"]["name"] for q in p.values()} and p,
        240, every=1)
    new_names = {w: p["metadata"]["name"] for w, p in new.items()}
    for name in new_names.values():
        logs.follow(name)
    loaded = {w: wait_for(f"{name} restored", lambda name=name: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None), 180)
        for w, name in new_names.items()}
    expected = restorable(logs, old, emergency, say)
    lost = {}
    for w, load in sorted(loaded.items()):
        saved = expected[w]
        check(load["event"] == "load" and load["step"] == saved["step"]
              and load["hash"] == saved["hash"],
              f"writer {w}: restored step {load.get('step')} ({load.get('tier')} tier), "
              f"{saved['why']} {saved['step']}, hash equal to what it saved")
        lost[w] = sigterms(logs, old)[w]["step"] - load["step"]
    # Each rank's own emergency step: nothing lost. Ranks' emergency steps
    # that differ: the newest step all saved, less than one interval back.
    same = all(e["why"] == "its emergency step" for e in expected.values())
    check(set(lost.values()) == {0} if same else all(0 < n <= EVERY + 1 for n in lost.values()),
          f"steps lost per writer beyond the interrupted step: {lost}")
    training = max(next(e["at"] for e in logs.trainer(name) if e["event"] == "resume")
                   for name in new_names.values())
    report.append(f"| Kueue: SIGTERM → readmitted (the Workload's condition, whole seconds) | "
                  f"{readmitted - sigterm:.1f} s |")
    report.append(f"| Kueue: readmitted → every rank training again (restored step "
                  f"{loaded[0]['step']}, {loaded[0]['tier']} tier) | "
                  f"{training - readmitted:.1f} s (SIGTERM → training "
                  f"{training - sigterm:.1f} s) |")
    report.append(f"| Kueue preemption: steps lost beyond the interrupted step | "
                  f"{max(lost.values())} |")
    kueue_checks.check_goodput(logs, old, new_names, loaded, sigterms(logs, old), report,
                               say, check)


def sigterms(logs: Logs, old: dict[int, str]) -> dict[int, dict[str, Any]]:
    out = {}
    for w, name in old.items():
        found = next((e for e in logs.trainer(name) if e["event"] == "sigterm"), None)
        if found:
            out[w] = found
    return out


def restorable(logs: Logs, old: dict[int, str], emergency: dict[int, dict[str, Any] | None],
               say: Say) -> dict[int, dict[str, Any]]:
    """Each writer's save restore must bring back: its emergency step when
    every writer's is the same one (steps lost: 0); when two SIGTERMs fell
    either side of a step boundary, the ranks' emergency steps differ and
    restore never mixes two steps, so the newest step every writer saved."""
    if len({(e or {}).get("step") for e in emergency.values()}) == 1:
        return {w: {**e, "why": "its emergency step"} for w, e in emergency.items() if e}
    saves = {w: {e["step"]: e for e in logs.trainer(name) if e["event"] == "save"}
             for w, name in old.items()}
    newest = max(set.intersection(*(set(s) for s in saves.values())))
    steps = {w: (e or {}).get("step") for w, e in emergency.items()}
    say(f"  the emergency steps differ ({steps}: SIGTERMs either side of a step boundary): "
        f"step {newest} is the newest every writer saved")
    return {w: {**s[newest], "why": "the newest step every writer saved,"}
            for w, s in saves.items()}


def emergency_save(logs: Logs, name: str) -> dict[str, Any] | None:
    return next((e for e in logs.trainer(name)
                 if e["event"] == "save" and e["reason"] == "sigterm"), None)


def preemption(s3: Any, logs: Logs, old: dict[int, str], created: float,
               check: Check) -> tuple[dict[int, float], float]:
    """Watches the preempted pods until they are gone: when each writer's
    emergency step was first seen committed on S3, and when the last pod was
    gone."""
    durable: dict[int, float] = {}
    gone: float | None = None
    deadline = time.monotonic() + GRACE + 90
    while time.monotonic() < deadline and (gone is None or len(durable) < len(old)):
        for w, name in old.items():
            saved = emergency_save(logs, name)
            if w not in durable and saved and f"{w:05d}.json" in jobset.committed_writers(
                    s3, saved["step"], policy=POLICY, prefix=PREFIX):
                durable[w] = time.time()
        if gone is None:
            names = {p["metadata"]["name"] for p in get("pods", "-n", NS, "-l", SELECT)["items"]}
            if not names & set(old.values()):
                gone = time.time()
        time.sleep(0.2)
    if gone is None:
        raise Failed(f"the preempted pods {sorted(old.values())} still there "
                     f"{time.time() - created:.0f} s after {HIGH}")
    check(len(durable) == len(old), f"every writer's emergency step committed on S3: "
          f"{sorted(durable)} of {sorted(old)}")
    return durable, gone


def cleanup() -> None:
    """Best effort (after a failure too): the workloads, queues and Kueue go."""
    for kind, name in (("jobset", NAME), ("job", HIGH)):
        kubectl("delete", kind, "-n", NS, name, "--ignore-not-found", "--wait=true",
                "--timeout=90s", timeout=100, check=False)
    try:
        wait_for("Kueue step pods gone", lambda: not get(
            "pods", "-n", NS, "-l", SELECT)["items"], 120)
    except Failed as err:  # after a failure: that one is the one to report
        print(f"  cleanup: {err}", flush=True)
    kubectl("delete", POLICIES, "-n", NS, POLICY, "--ignore-not-found", "--wait=true",
            timeout=60, check=False)
    kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=queues_manifest(),
            timeout=90, check=False)
    point_chart_at_kueue(False)
    helm("uninstall", KQ_RELEASE, "-n", KQ_NS, "--wait", timeout=120, check=False)
