"""The end-to-end scenario of issue 6, as a user lives it, on a running cluster.

    python e2e/scenario/scenario.py --report FILE ...   (e2e/run.sh sets everything up)
    python e2e/scenario/scenario.py --short ...         (e2e/run.sh --short)

Each step asserts what a user would check with kubectl, and the run ends with
a short report of measured timings. Needs KUBECONFIG, kubectl and helm on
PATH (or KUBECTL/HELM), root (the local tier is a directory on this node),
and the images ckptdrain:dev and ckptdrain-trainer:dev in the cluster.

`--short` (CI's scenario) runs the demo's simulated trainer from the project
image (no torch, no trainer image) and leaves out what the full run measures
at length: it waits for one complete checkpoint instead of three, does not
wait for training to go on after the first restore, and skips the corrupted
local copy (7b). Everything else is the same step, asserted the same way.

After the main steps, the peer tier step (e2e/scenario/peer.py, in both
runs): two writers on the cluster's two nodes, one node lost (its local tier
wiped, its pod deleted), and the replacement restores the newest local step
from its partner, not the older global one.

Then the restore agreement step (e2e/scenario/agreement.py, in both runs):
two writers on the two nodes with the peer tier off. Both pods deleted with
their nodes intact, both ranks restore the same local step, newer than the
newest global one, and status.goodput counts only the steps since it;
writer 0's node lost (its local tier wiped) and both pods deleted, both
restore the newest global step; a trainer restarted inside its pod
(restartPolicy OnFailure) resumes from the newest step both writers saved,
not from the one restored when its pod started; 2 writers and 2 reader
replicas deleted at once all restore one step, each reader its shard.

Then the pods people run (e2e/scenario/processes.py, in both runs): two
pods of two processes each (ckptdrain.demo.processes, as torchrun
`--nproc_per_node=2`), the trainers as root and then as uid 1000: requests
reach them, every step holds both processes' files, and after each gang
deletion all four processes load one step, the uid 1000 trainers first
what the root trainers saved.

More steps run before the uninstall when asked: `--jobset-chart` the
JobSet step (e2e/scenario/jobset.py: 4 writers of one JobSet on the real
JobSet controller), `--lws-chart` the LeaderWorkerSet step
(e2e/scenario/lws.py: 4 writers of one LeaderWorkerSet on the real LWS
controller), `--kueue-chart` the Kueue step (e2e/scenario/kueue.py: a
queued JobSet preempted by the real Kueue, readmitted with no step lost;
`--only kueue` runs it alone, with the JobSet controller it needs),
`--chaos` the chaos step (e2e/scenario/chaos.py:
operator pods killed under a burst of opted-in pods, the sweep, admission
latency through a rolling restart).

`--only csi` (full run only, E2E_ONLY=csi) runs the CSI node tier step
alone (e2e/scenario/csi.py): the driver on the real kubelet, a writer of
a `restricted` namespace checkpointing and restoring through it.

Last, in both runs, the quickstart (e2e/scenario/quickstart.py): the blocks of
docs/quickstart.md run as written on the same cluster, and what its "Check
that it works" promises, checked.
"""

from __future__ import annotations

import argparse
import shutil
import string
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agreement
import chaos
import corruption
import csi
import dcp
import dcp_procs
import goodput_check
import jobset
import kueue
import lws
import move
import peer
import platform_class
import processes
import quickstart
from kube import POLICIES, POLICIES_V1BETA1, Failed, apply, get, helm, kubectl, run, wait_for
from s3server import seaweedfs
from trainers import TRAINERS, Logs, Trainer
from views import (
    BUCKET,
    CHECKPOINT_BYTES,
    CLASS,
    EVERY,
    GRACE,
    JOB,
    NS,
    OP_NS,
    POLICY,
    RELEASE,
    S3_NS,
    STEP_S,
    WRITERS,
    complete_steps,
    pod_of,
    policy_status,
    ranks_in,
    records,
    wait_mid_interval,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

T0 = time.monotonic()
REPORT: list[str] = []
#: Writer 0's state hash of every step it saved, across its pods, oldest pod first
#: (a later pod re-saving a step overwrites it everywhere, and here too).
HISTORY: dict[int, str] = {}


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {text}", flush=True)


def check(ok: object, what: str) -> None:
    if not ok:
        raise Failed(what)
    say(f"  ok: {what}")


def render(name: str, **values: object) -> str:
    return string.Template((HERE / name).read_text()).substitute(
        {k: str(v) for k, v in values.items()})


def saves(logs: Logs, pod: str) -> dict[int, str]:
    return {e["step"]: e["hash"] for e in logs.trainer(pod) if e["event"] == "save"}


# -- the steps ---------------------------------------------------------------------
def step1_install(image_repo: str, allowed_root: str) -> None:
    say("1. helm install the chart; operator ready; webhooks over TLS")
    # The training namespace first: the chart puts the agent's ServiceAccount there.
    apply(render("namespace.yaml", NAMESPACE=NS))
    began = time.monotonic()
    helm("install", RELEASE, str(REPO / "charts/ckptdrain"), "-n", OP_NS, "--create-namespace",
         "--set", f"image.repository={image_repo}", "--set", "image.tag=dev",
         "--set", "image.pullPolicy=Never", "--set", f"agent.namespaces={{{NS}}}",
         "--set", f"localTier.allowedRoot={allowed_root}",
         # A cluster cap that never binds: the namespace's cluster scale is
         # published (factor 1) and the agents run the scale's whole protocol
         # (step 4 checks it) without their drain rates moving.
         "--set", "bandwidth.clusterCap=1PB/s",
         # The peer step's policy: the operator makes its Secrets and ConfigMap.
         "--set", "operator.peerTier=true", "--wait", "--timeout", "180s",
         timeout=200)
    kubectl("-n", OP_NS, "rollout", "status", "deploy", "--timeout=120s", timeout=130)
    ready = time.monotonic() - began
    check(ready < 180, f"operator Ready {ready:.1f}s after helm install")
    REPORT.append(f"| helm install → operator Ready | {ready:.1f} s |")
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        def served(kind: str = kind) -> bool:
            hooks = [h for item in get(kind, "-l", f"app.kubernetes.io/instance={RELEASE}")
                     ["items"] for h in item["webhooks"]]
            return bool(hooks) and all(h["clientConfig"].get("caBundle")
                                       and h["clientConfig"].get("service") for h in hooks)
        # Helm may create the configurations after the operator started: it
        # sets their caBundle within about a second (operator/tls/webhook_certs.py).
        try:
            wait_for(f"{kind} caBundle", served, 10)
            ok = True
        except Failed:
            ok = False
        check(ok, f"{kind}: served by a Service, with a caBundle")


def step2_s3(s3: Any) -> None:
    say("2. S3 server reachable from pods, bucket, credentials Secret")
    run(str(REPO / "e2e/cluster/host-service.sh"), S3_NS, "s3", str(s3.port))
    kubectl("-n", NS, "create", "secret", "generic", "s3-credentials",
            f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
            f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}")
    check(s3.client().head_bucket(Bucket=s3.bucket), f"bucket {s3.bucket} exists")
    # From a pod, by Service name, as the agents will reach it.
    probe = ("import urllib.request,urllib.error\ntry: print('http', urllib.request.urlopen("
             f"'http://s3.{S3_NS}.svc.cluster.local:{s3.port}/', timeout=5).status)\n"
             "except urllib.error.HTTPError as e: print('http', e.code)")
    # Logs read once it has finished: `kubectl run -i` may attach after a quick
    # container exited and print nothing.
    kubectl("-n", NS, "run", "s3-probe", "--restart=Never",
            "--image=docker.io/library/ckptdrain:dev", "--image-pull-policy=Never",
            "--command", "--", "python3", "-c", probe)
    wait_for("the S3 probe pod to finish", lambda: get("pod", "-n", NS, "s3-probe")[
        "status"].get("phase") in ("Succeeded", "Failed"), 90)
    out = kubectl("-n", NS, "logs", "s3-probe").stdout
    kubectl("-n", NS, "delete", "pod", "s3-probe", "--wait=false")
    check("http" in out, f"a pod reaches the S3 Service by name ({out.strip()})")


def step3_apply(s3: Any, allowed_root: str, trainer: Trainer, torch_site: str) -> float:
    say("3. apply the CheckpointPolicy and the training Job")
    # The validating webhook refuses what the schema cannot catch (over TLS).
    bad = render("policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES="50M", ALLOWED_ROOT="/etc",
                 BUCKET=BUCKET, S3_NAMESPACE=S3_NS, S3_PORT=s3.port)
    refused = kubectl("apply", "--dry-run=server", "-f", "-", input=bad, check=False)
    check(refused.returncode != 0 and "webhook" in refused.stderr,
          f"validating webhook refuses a local tier outside the allowed root: "
          f"{refused.stderr.strip()[-160:]}")
    apply(render("policy.yaml", NAMESPACE=NS, CHECKPOINT_BYTES="50M",
                 ALLOWED_ROOT=allowed_root, BUCKET=BUCKET, S3_NAMESPACE=S3_NS, S3_PORT=s3.port))
    wait_for("policy status", lambda: policy_status().get("requiredBandwidth"), 60)
    # Read as users read it, v1beta1 through the conversion webhook: the
    # policy named no class, admission wrote in the default one.
    bound = get(POLICIES_V1BETA1, "-n", NS, POLICY)
    resolved = wait_for("the policy's ClassResolved condition", lambda: next(
        (c for c in (get(POLICIES_V1BETA1, "-n", NS, POLICY).get("status") or {})
         .get("conditions", []) if c["type"] == "ClassResolved"), None), 60, 1)
    check(bound["apiVersion"] == "ckptdrain.io/v1beta1"
          and bound["spec"].get("checkpointClassName") == CLASS
          and resolved["status"] == "True",
          f"policy {POLICY} (read at {bound['apiVersion']}) bound to the default class "
          f"{bound['spec'].get('checkpointClassName')}: ClassResolved {resolved['status']} "
          f"({resolved.get('reason')})")
    epoch = time.time()
    apply(trainer.job(render("job.yaml", NAMESPACE=NS, GRACE=GRACE, EPOCH=f"{epoch:.3f}",
                             TORCH_SITE=torch_site),
                      EVERY, STEP_S, epoch, CHECKPOINT_BYTES // WRITERS))
    return epoch


def step4_drain(logs: Logs, local_root: Path, complete: int) -> dict[int, str]:
    say("4. checkpoints land on the local tier and drain to S3 at the allocated share")
    began = time.monotonic()
    pods = {}
    for i in (0, 1):
        pod = wait_for(f"trainer {i} running", lambda i=i: pod_of(i), 240)
        pods[i] = pod["metadata"]["name"]
        logs.follow(pods[i])
        init = [c["name"] for c in pod["spec"]["initContainers"]]
        check(init[:3] == ["ckptdrain-prepare", "ckptdrain-restore", "ckptdrain-agent"],
              f"{pods[i]}: injected {init}")
    say(f"  pods running {time.monotonic() - began:.1f}s after the Job")
    first = wait_for("a checkpoint complete on S3 (both writers)",
                     lambda: complete_steps(), 180, every=1)
    say(f"  first global checkpoint: step {first[0]} "
        f"({time.monotonic() - began:.1f}s after the Job)")
    wait_for(f"{complete} complete global checkpoint(s)",
             lambda: len(complete_steps()) >= complete, 120, 1)
    print(kubectl("get", "checkpoints", "-n", NS).stdout, flush=True)
    step = complete_steps()[-1]
    for i in (0, 1):
        manifest = local_root / f"writer-{i}" / f"step-{step}" / "manifest.json"
        check(manifest.is_file(), f"writer {i}: step {step} on the local tier ({manifest})")
    status = wait_for("policy status with both drainers and a recovery point",
                      lambda: (s := policy_status()).get("drainers") == 2
                      and s.get("lastGlobalStep") is not None and s, 60, 1)
    check(status.get("recoveryPointTime") and status.get("lastLocalStep") is not None,
          f"policy status: required {status['requiredBandwidth']}, drainers "
          f"{status['drainers']}, last local step {status['lastLocalStep']}, last global "
          f"step {status['lastGlobalStep']}, recovery point {status['recoveryPointTime']}")
    # Unversioned on purpose: what a user sees, v1beta1 (the preferred
    # version), made by the operator's conversion webhook (the CRD's caBundle
    # set by it too).
    print(kubectl("get", "checkpointpolicy", "-n", NS).stdout, flush=True)
    # The cluster scale: published in the namespace, and the policy's channel
    # leaves shrinks to it once both agents said (in their own reports, under
    # their RBAC) that they read it.
    scale = wait_for("the namespace's cluster scale", lambda: get(
        "checkpointshares", "-n", NS, "--field-selector",
        "metadata.name=cluster-scale.ckptdrain.io")["items"], 60, 1)
    check(scale[0]["spec"]["clusterScale"]["factor"] == 1,
          f"cluster scale published: {scale[0]['spec']['clusterScale']}")
    channel = wait_for("the channel with the policy's claim", lambda: next(
        (c for c in get("checkpointshares", "-n", NS, "--field-selector",
                        f"metadata.name={POLICY}")["items"]
         if c["spec"].get("wantedBytes")), None), 60, 1)
    check(channel["spec"]["wantedBytes"] >= channel["spec"]["budgetBytes"],
          f"share channel: budget {channel['spec']['budgetBytes']} B/s, claim "
          f"{channel['spec']['wantedBytes']} B/s (weight × cluster cap), shrinks left "
          "to the scale")
    REPORT.append(f"| required bandwidth (policy status) | {status['requiredBandwidth']} "
                  f"for {status.get('checkpointSize')} every 10 s at 50% overlap |")
    for i in (0, 1):
        pod = get("pod", "-n", NS, pods[i])
        now = int(pod["metadata"]["annotations"]["ckptdrain.io/bandwidth"])
        drained = [e for e in logs.agent(pods[i]) if e["state"] == "Global" and e.get("seconds")]
        check(drained, f"writer {i}: agent reported drains to the global tier")
        # Shares follow the policy's drainers (its share channel), so a drain is
        # held to the largest share its agent had while it ran, not to the one
        # of this moment.
        runs = [(e["bytes"] / e["seconds"],
                 logs.share_during(pods[i], e["at"] - e["seconds"], e["at"]) or now)
                for e in drained]
        rate, share = sorted(runs, key=lambda run: run[0] / run[1])[len(runs) // 2]
        check(rate <= share * 1.15, f"writer {i}: median drain {rate / 1e6:.2f} MB/s within "
              f"its share {share / 1e6:.2f} MB/s (+15%) while it ran (now {now / 1e6:.2f})")
        REPORT.append(f"| drain rate, writer {i} (median of {len(drained)}) | "
                      f"{rate / 1e6:.2f} MB/s against an allocated share of "
                      f"{share / 1e6:.2f} MB/s ({100 * rate / share:.0f}%) |")
    return {i: pods[i] for i in pods}  # type: ignore[misc]


def emergency(logs: Logs, old: str, deleted_at: float) -> int:
    save = wait_for(f"{old}: emergency checkpoint", lambda: next(
        (e for e in logs.trainer(old) if e["event"] == "save" and e["reason"] == "sigterm"),
        None), GRACE)
    def state(name: str) -> dict[str, Any] | None:
        return next((e for e in logs.agent(old) if e["step"] == save["step"]
                     and e["state"] == name), None)

    # The agent is a native sidecar: it is stopped after the trainer, so it usually
    # captures the emergency checkpoint in its normal loop, then flushes on its SIGTERM.
    local = wait_for(f"{old}: emergency step captured", lambda: state("Local"), GRACE)
    check(local, f"{old}: emergency step {save['step']} captured durably on the local tier "
          f"{local['at'] - deleted_at:.2f}s after the delete")
    glob = wait_for(f"{old}: emergency step drained", lambda: state("Global"),
                    max(1.0, deleted_at + GRACE + 5 - time.time()))
    check(glob["at"] - deleted_at < GRACE, f"{old}: emergency step {save['step']} on S3 "
          f"{glob['at'] - deleted_at:.2f}s after the delete (grace period {GRACE}s)")
    return int(save["step"])


def step5_6(logs: Logs, pods: dict[int, str], epoch: float, goes_on: bool) -> dict[int, str]:
    say("5. delete one trainer pod: emergency checkpoint durable and drained in the grace period")
    old = pods[0]
    before = saves(logs, old)
    complete = complete_steps()
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    say(f"  deleted {old}")
    step = emergency(logs, old, deleted)
    events: dict[str, Any] = {e["state"]: e for e in logs.agent(old) if e["step"] == step}
    local, glob = events["Local"], events["Global"]
    REPORT.append(f"| SIGTERM → emergency checkpoint durable on the local tier | "
                  f"{local['at'] - deleted:.2f} s (capture {local.get('seconds') or 0:.2f} s) |")
    REPORT.append(f"| SIGTERM → emergency checkpoint on S3 | {glob['at'] - deleted:.2f} s "
                  f"(drain {glob.get('seconds') or 0:.2f} s; grace period {GRACE} s) |")
    # The deleted pod's last word (its Global, written as it stopped) is
    # folded into the record although the pod is gone.
    record = wait_for(f"writer 0 Global in the record of step {step}",
                      lambda: (r := records().get(step)) and 0 in ranks_in(
                          ((r.get("status") or {}).get("ranks") or {}).get("Global")) and r,
                      30)
    status = record.get("status") or {}
    check(0 in ranks_in((status.get("ranks") or {}).get("Global")),
          f"record {record['metadata']['name']}: writer 0 Global though its pod is gone "
          f"(record {status.get('state')}, {status.get('writersReady')} writers)")
    before.update(saves(logs, old))
    HISTORY.update(before)

    say("6. the Job recreates the pod: restore from the local tier, resume from that step")
    new = wait_for("a new pod for index 0",
                   lambda: (p := pod_of(0)) and p["metadata"]["name"] != old and p,
                   180)["metadata"]["name"]
    logs.follow(new)
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    complete = [s for s in complete_steps() if s in before]
    expected = max(complete) if complete else None
    other = saves(logs, pods[1])
    check(load["event"] == "load" and load["tier"] == "local",
          f"{new}: restored from the {load.get('tier')} tier ({load.get('source')})")
    # Writer 1 trains on and its agent reports what it holds, so the ranks
    # agree at once on the newest step both hold: at least the newest global
    # one, never the emergency step only writer 0 saved.
    check(expected is not None and load["step"] >= expected and load["step"] in other
          and load["step"] != step, f"{new}: restored step {load['step']}, a step both writers "
          f"saved, at least the newest complete global step ({expected}; the emergency step "
          f"{step} has one writer)")
    check(load["hash"] == before[load["step"]], f"model+optimizer state hash at load equals "
          f"the hash at save ({load['hash'][:16]}…)")
    resume = wait_for("resume", lambda: next(
        (e for e in logs.trainer(new) if e["event"] == "resume"), None), 30)
    check(resume["step"] == load["step"] + 1, f"trainer resumes at step {resume['step']}")
    annotation = wait_for("restored-from annotation", lambda: get("pod", "-n", NS, new)[
        "metadata"].get("annotations", {}).get("ckptdrain.io/restored-from"), 30)
    check(f"step={load['step']}" in annotation and "local" in annotation,
          f"pod annotation ckptdrain.io/restored-from: {annotation}")
    restores = wait_for("policy status.restores", lambda: [
        r for r in policy_status().get("restores") or [] if r.get("pod") == new], 60, 1)
    check(restores, f"policy status records the restore: {restores[0]}")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore from the local tier ({load['bytes'] / 1e6:.1f} MB) | "
                  f"{load['restore_seconds']:.2f} s in the init container; pod deleted → "
                  f"trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new
    if not goes_on:
        return pods
    # Training goes on: the resumed writer catches up and checkpoints complete again.
    newer = wait_for("a checkpoint completed after the restore", lambda: [
        s for s in complete_steps() if s > load["step"] + EVERY], 120, 1)
    check(newer, f"step {newer[0]} complete for both writers after the restore")
    return pods


def _wipe_after_flush(mine: Path, flushed: int) -> None:
    """Between a wipe and the SIGTERM the agent may capture the trainer's
    newest save again (its schedule finds it missing from the local tier).
    Its flush is done once `emergency` returns, so nothing more comes: leave
    only the emergency step, which no other writer has, before the
    replacement restores."""
    again = [e for e in mine.iterdir() if e.name.startswith("step-")
             and e.name != f"step-{flushed}"]
    for entry in again:
        shutil.rmtree(entry, ignore_errors=True)
    if again:
        say(f"  wiped again what was captured after the wipe: {sorted(e.name for e in again)}")


def step7a(logs: Logs, pods: dict[int, str], epoch: float, local_root: Path) -> None:
    say("7a. wipe the local tier and delete again: restore comes from S3")
    old = pods[0]
    mine = local_root / "writer-0"
    wait_mid_interval(epoch)
    before = dict(HISTORY)
    for entry in mine.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    say(f"  wiped {mine}")
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    _wipe_after_flush(mine, emergency(logs, old, deleted))
    new, load = _reload(logs, 0, old)
    before |= saves(logs, old)
    HISTORY.update(saves(logs, old))
    check(load["event"] == "load" and load["tier"] == "global",
          f"{new}: restored from the {load.get('tier')} tier ({load.get('source')})")
    # Newest complete, by restore's rule: a newer step both records call Global
    # is passed by when its writers saved it in different runs (writer 1 never
    # restarted, so its saves after step 6 keep the first run's timeline,
    # restore/agreement.py); restore names each step it passed by.
    passed = {e.get("step") for e in load.get("skipped") or []}
    newer = sorted(s for s in complete_steps() if s in before and s > load["step"])
    check(load["hash"] == before[load["step"]] and all(s in passed for s in newer),
          f"step {load['step']} (newest complete; newer complete steps {newer} passed by: "
          f"{[e.get('reason') for e in load.get('skipped') or [] if e.get('step') in newer]}), "
          f"state hash equal at save and load")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore from S3 after a wiped local tier ({load['bytes'] / 1e6:.1f} MB) | "
                  f"{load['restore_seconds']:.2f} s in the init container; pod deleted → "
                  f"trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new


def step7b(logs: Logs, pods: dict[int, str], epoch: float, local_root: Path) -> None:
    say("7b. corrupt the local copy and delete again: restore detects it and falls back")
    # Writer 1 never restarted, so no step newer than 7a's is restorable (its
    # writers saved it in different runs) and restore would never look at a
    # local copy. Both pods restart together first: one decision puts both
    # writers on one timeline, and their next steps are restorable again.
    # First 7a's restored step leaves writer 0's local tier (newer captures
    # push it out): its copy there was captured again at that restore, with
    # that time and not its save's, and would skew goodput's lost seconds.
    olds = dict(pods)
    restored = next(e for e in logs.trainer(olds[0]) if e["event"] == "load")["step"]
    wait_for(f"step {restored} gone from writer 0's local tier", lambda: not (
        local_root / "writer-0" / f"step-{restored}").exists(), 120, every=0.5)
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, olds[0], olds[1], "--wait=false")
    say(f"  deleted {olds[0]} and {olds[1]} at once")
    for i in (0, 1):
        emergency(logs, olds[i], deleted)
    HISTORY.update(saves(logs, olds[0]))
    history = {0: HISTORY, 1: saves(logs, olds[1])}
    loads: dict[int, dict[str, Any]] = {}
    for i in (0, 1):
        pods[i], loads[i] = _reload(logs, i, olds[i])
    steps = {i: e.get("step") for i, e in loads.items()}
    check(all(e["event"] == "load" for e in loads.values()) and steps[0] == steps[1],
          f"both writers restored the same step: {steps} "
          f"(tiers {[e.get('tier') for e in loads.values()]})")
    for i in (0, 1):
        check(loads[i]["hash"] == history[i].get(steps[i]),
              f"writer {i} ({pods[i]}): state hash equal to its save of step {steps[i]}")
    said = {i: wait_for(f"{pods[i]}: the agreement in its restore's log",
                        lambda i=i: agreement.agreement_of(logs, pods[i]), 30) for i in (0, 1)}
    check({a["round"] for a in said.values()} == {said[0]["round"]}
          and all(a["why"] == "agreed" for a in said.values()),
          f"one decision for both: round {said[0]['round']}, {said[0]['why']}")
    for i in (0, 1):
        goodput_check.interruption(logs, olds[i], pods[i], writer_pods(logs, i), loads[i],
                                   REPORT, check)
    # A step both current pods saved and drained (step numbers come back
    # after a restore: the records may hold an older run's step of that
    # number), taken while the next save is still ahead.
    target = wait_for("a step both restarted writers saved and drained, mid-interval",
                      lambda: corruption.settled(logs, pods.values(), epoch, steps[0]),
                      420, every=0.5)
    lines = {i: corruption.timeline(local_root, i, target) for i in (0, 1)}
    check(lines[0] and lines[0] == lines[1],
          f"step {target}: both writers' local copies in one run (timeline {lines[0]})")
    old = pods[0]
    mine = local_root / "writer-0"
    corrupted = corruption.flip_one_byte(mine)
    say(f"  flipped one byte in {corrupted}")
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    emergency(logs, old, deleted)
    new, load = _reload(logs, 0, old)
    mine_saved = saves(logs, old)
    HISTORY.update(mine_saved)
    # The newest step complete for both writers in this run: the one restore picks.
    expected = max(corruption.drained(logs, [old, pods[1]]), default=None)
    skipped = [s for s in load.get("skipped") or [] if s.get("tier") == "local"
               and s.get("step") == expected and "crc32c" in str(s.get("reason"))]
    check(skipped and expected is not None and expected >= target,
          f"restore skipped the corrupt local copy of step {expected}: {skipped}")
    check(load["tier"] == "global" and load["step"] == expected,
          f"{new}: fell back to step {load['step']} on the {load['tier']} tier")
    check(load["hash"] == mine_saved[expected],
          f"state hash equal to {old}'s save of step {expected}")
    goodput_check.interruption(logs, old, new, writer_pods(logs, 0), load, REPORT, check)
    REPORT.append(f"| restore falling back to S3 from a corrupt local copy | "
                  f"{load['restore_seconds']:.2f} s in the init container (verification "
                  f"included); pod deleted → trainer loaded {load['at'] - deleted:.1f} s |")
    pods[0] = new


def writer_pods(logs: Logs, index: int) -> list[str]:
    """Every trainer pod the Job ran for `index`, as followed so far."""
    return sorted({pod for pod, container in logs.following
                   if container == "trainer" and pod.startswith(f"{JOB}-{index}-")})


def _reload(logs: Logs, index: int, old: str) -> tuple[str, dict[str, Any]]:
    # The Job controller's replacement slows with each interruption (docs/e2e.md,
    # "Slow pod replacement"): 7b's last one comes after four.
    new = wait_for(f"a new pod for index {index}",
                   lambda: (p := pod_of(index)) and p["metadata"]["name"] != old and p,
                   300)["metadata"]["name"]
    logs.follow(new)
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    return new, load


def step8_uninstall() -> None:
    say("8. uninstall cleanly")
    began = time.monotonic()
    kubectl("delete", "job", "-n", NS, JOB, "--ignore-not-found", "--wait=true", "--timeout=90s",
            timeout=100)  # absent when --only ran other steps
    wait_for("trainer pods gone", lambda: not get("pods", "-n", NS, "-l", "app=mlp")["items"],
             90)
    kubectl("delete", POLICIES, "-n", NS, POLICY, "--ignore-not-found", "--wait=true",
            timeout=60)
    wait_for("records garbage-collected with their policy",
             lambda: not get("checkpoints", "-n", NS)["items"], 60)
    # Cluster-scoped, the platform's: neither the namespaces nor the release hold it.
    platform_class.remove()
    helm("uninstall", RELEASE, "-n", OP_NS, "--wait", "--timeout", "90s", timeout=100)
    left = [kind for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                              "clusterroles")
            if get(kind, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]]
    check(not left, "helm uninstall left no webhook configurations or cluster roles")
    wait_for("operator pod gone", lambda: not get("pods", "-n", OP_NS)["items"], 60)
    # All three at once: the namespace controller empties them in parallel.
    kubectl("delete", "namespace", NS, S3_NS, OP_NS, "--wait=true", "--timeout=90s",
            timeout=100)
    REPORT.append(f"| cleanup (Job, policy, helm uninstall, namespaces) | "
                  f"{time.monotonic() - began:.1f} s |")


def leftovers() -> None:
    """What an interrupted earlier run (KEEP=1) left in a cluster that stayed up."""
    if helm("status", RELEASE, "-n", OP_NS, check=False).returncode == 0:
        say("removing a previous run's release and namespaces")
        # Policies first, while the operator converts: a namespace emptied
        # after it is gone keeps Terminating (its controller lists each kind
        # at the newest version, which only the conversion webhook makes).
        kubectl("delete", POLICIES, "-n", NS, "--all", "--ignore-not-found", "--wait=true",
                "--timeout=60s", check=False, timeout=70)
        helm("uninstall", RELEASE, "-n", OP_NS, "--wait", check=False, timeout=120)
    platform_class.remove()
    kubectl("delete", "namespace", NS, S3_NS, OP_NS, "--ignore-not-found", "--wait=true",
            "--timeout=120s", timeout=130)


def main_steps(s3: Any, args: argparse.Namespace, trainer: Trainer, logs: Logs,
               local_root: Path) -> None:
    """Steps 3-7: the training Job, its drains, SIGTERM, restores."""
    epoch = step3_apply(s3, args.allowed_root, trainer, args.torch_site or "/nonexistent")
    pods = step4_drain(logs, local_root, complete=1 if args.short else 3)
    pods = step5_6(logs, pods, epoch, goes_on=not args.short)
    step7a(logs, pods, epoch, local_root)
    if not args.short:
        step7b(logs, pods, epoch, local_root)
    # Each deleted pod is one interruption: 5/6 and 7a, and 7b's three (both
    # writers at once, then writer 0).
    goodput_check.cli(REPORT, check, say, interruptions=2 if args.short else 5)


def keep_operator_logs(path: Path) -> None:
    """The operator's own log beside the pods' (the agents' view alone often
    cannot say why the operator did not act)."""
    out = kubectl("logs", "-n", OP_NS, "-l", "app.kubernetes.io/component=operator",
                  "--all-containers", "--prefix", "--tail=-1", "--max-log-requests=8",
                  check=False, timeout=60)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.stdout + out.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--node-ip", default="10.244.0.1")
    parser.add_argument("--allowed-root", required=True)
    parser.add_argument("--torch-site", help="an installed torch for train.py (not --short)")
    parser.add_argument("--short", action="store_true",
                        help="CI's scenario: the simulated trainer, fewer waits, no 7b")
    parser.add_argument("--image-repo", default="docker.io/library/ckptdrain")
    parser.add_argument("--jobset-chart", help="JobSet's Helm chart: run the JobSet step "
                        "(e2e/scenario/jobset.py) on the real JobSet controller")
    parser.add_argument("--jobset-image", default="localhost/ckptdrain/jobset:v0.9.1")
    parser.add_argument("--lws-chart", help="LeaderWorkerSet's Helm chart: run the LWS step "
                        "(e2e/scenario/lws.py) on the real LWS controller")
    parser.add_argument("--lws-image", default="localhost/ckptdrain/lws:v0.7.0")
    parser.add_argument("--kueue-chart", help="Kueue's Helm chart: run the Kueue preemption "
                        "step (e2e/scenario/kueue.py; needs --jobset-chart)")
    parser.add_argument("--kueue-image", default="localhost/ckptdrain/kueue:v0.13.5")
    parser.add_argument("--chaos", action="store_true",
                        help="run the chaos step (e2e/scenario/chaos.py) before uninstalling")
    parser.add_argument("--dcp", action="store_true",
                        help="run the DCP resharding step (e2e/scenario/dcp.py; not --short)")
    parser.add_argument("--only", choices=("dcp", "peer", "agreement", "processes", "move",
                                            "jobset", "kueue", "csi"),
                        help="install, S3, that step alone, uninstall (skips steps 3-7 and "
                        "the other optional steps)")
    args = parser.parse_args()
    if args.short and args.only == "csi":
        parser.error("--only csi: expected the full run (the CSI step is not part of CI's)")
    if not args.short and not args.torch_site and args.only not in ("kueue", "csi"):
        parser.error("--torch-site: expected the directory holding torch (or --short)")
    if (args.dcp or args.only == "dcp") and args.short:
        parser.error("--dcp/--only dcp: expected the full run (the torch trainer image)")
    jobset_step = True
    if args.only == "kueue" and not args.kueue_chart:
        parser.error("--only kueue: expected --kueue-chart (the full run builds Kueue)")
    if args.kueue_chart and not args.jobset_chart:
        parser.error("--kueue-chart: expected --jobset-chart too (Kueue queues a JobSet)")
    if args.only:
        args.lws_chart = None
        # Kueue's step queues a JobSet: its controller stays, its own step
        # goes (it runs only alone or in the whole run).
        jobset_step = args.only == "jobset"
        if args.only not in ("jobset", "kueue"):
            args.jobset_chart = None
        if args.only != "kueue":
            args.kueue_chart = None
        args.chaos, args.dcp = False, args.only == "dcp"
    trainer = TRAINERS["sim" if args.short else "torch"]
    logs = Logs(args.workdir / "logs", NS, trainer)
    local_root = Path(args.allowed_root) / NS / POLICY
    shutil.rmtree(local_root, ignore_errors=True)
    ok = False
    try:
        leftovers()
        if args.jobset_chart:
            # Installed first, awaited later: its certificates settle meanwhile.
            jobset.install_controller(args.jobset_chart, args.jobset_image)
        if args.lws_chart:
            lws.install_controller(args.lws_chart, args.lws_image)
        step1_install(args.image_repo, args.allowed_root)
        with seaweedfs(args.node_ip, args.workdir / "s3", BUCKET) as s3:
            step2_s3(s3)
            platform_class.install(s3, args.allowed_root, say, check)
            if not args.only:
                main_steps(s3, args, trainer, logs, local_root)
            if args.only in (None, "peer"):
                peer.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "agreement"):
                agreement.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "processes"):
                processes.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only in (None, "move"):
                move.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.only == "csi":
                csi.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.jobset_chart and jobset_step:
                jobset.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.lws_chart:
                lws.run(s3, args.allowed_root, args.workdir, REPORT, say, check)
            if args.kueue_chart:
                kueue.run(s3, args.kueue_chart, args.kueue_image, args.allowed_root,
                          args.workdir, REPORT, say, check)
            if args.dcp:
                dcp.run(s3, args.allowed_root, args.torch_site, args.workdir, REPORT, say, check)
                dcp_procs.run(s3, args.allowed_root, args.torch_site, REPORT, say, check)
            if args.chaos:
                chaos.run(s3, args.allowed_root, REPORT, say, check)
            step8_uninstall()
        if not args.only:
            quickstart.run(REPORT, say, check)
            if s3.restarts:
                REPORT.append(f"| S3 server restarts (stopped from outside) | "
                              f"{len(s3.restarts)} |")
        ok = True
    except Failed as err:
        say(f"FAILED: {err}")
        for line in kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp",
                            check=False).stdout.splitlines()[-25:]:
            print("  event:", line)
        keep_operator_logs(logs.dir / "operator.log")
    finally:
        logs.stop()
        total = time.monotonic() - T0
        REPORT.append(f"| scenario steps 1–8 | {total:.0f} s |")
        table = "| what | measured |\n| --- | --- |\n" + "\n".join(REPORT) + "\n"
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(table)
        print("\n" + table, flush=True)
        say(f"logs of every pod in {logs.dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
