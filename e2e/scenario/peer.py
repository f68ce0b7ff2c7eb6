"""The peer tier step: a node lost, and the job comes back at its newest
local step from the partner, not at the older global one.

Two writers of one policy with `spec.peerTier.enabled` run on the cluster's
two nodes (e2e/cluster/node.sh: node b is tainted; these pods tolerate it,
and pod anti-affinity puts one writer on each), in two zones. The policy
drains one local checkpoint per three intervals (`globalEvery: 3`), so the global
tier lags the local one by up to two local intervals. The step waits until
writer 0's partner (writer 1's peer sidecar, on the other node) holds a step
newer than the newest complete global one, and the policy status shows it
as the recovery point on node loss. Then writer 0's node "is lost": its
local tier area is wiped and its pod deleted. Its replacement restores from
the partner: the newest step both writers can get, newer than the global
tier's, with the state hash writer 0 saved.

    run(s3, allowed_root, workdir, report, say, check)   after the main steps
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobset
import yaml
from kube import POLICIES, apply, get, kubectl, wait_for
from trainers import TRAINERS, Logs, _json_lines
from views import GRACE, NS, OP_NS, remove, wait_mid_interval

#: Seconds between the peer Job's creation and its step clock's start.
START_MARGIN_S = 20.0
NAME = POLICY = PREFIX = "peer"
WRITERS, CHECKPOINT_BYTES, GLOBAL_EVERY, LOCAL_KEEP = 2, 20_000_000, 3, 10
NODE_B, NODE_B_TAINT = "ckptdrain-e2e-b", "ckptdrain.io/e2e-node-b"
SELECT = f"app={NAME}"
REPLICATED = re.compile(r"step (\d+) (?:replicated to|already held by) ")

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = WRITERS
    doc["spec"]["model"]["checkpointBytes"] = f"{CHECKPOINT_BYTES // 1_000_000}M"
    doc["spec"]["globalEvery"] = GLOBAL_EVERY
    # Writer 1 trains on while writer 0 is replaced (tens of seconds): it
    # must still hold the step writer 0 gets back from its partner.
    doc["spec"]["localTier"]["keep"] = LOCAL_KEEP
    doc["spec"]["peerTier"] = {"enabled": True, "keep": 2}
    return json.dumps(doc)


def job_manifest(epoch: float) -> str:
    """job.yaml by the simulated trainer: one writer on each node."""
    return yaml.safe_dump(two_node_job(epoch, NAME, NAME))


def two_node_job(epoch: float, name: str, app: str) -> dict[str, Any]:
    """job.yaml by the simulated trainer as the indexed Job `name` of WRITERS
    pods labelled app=<app>, one on each node (they tolerate node b's taint
    and repel each other), each writing its share of CHECKPOINT_BYTES."""
    job = jobset.sim_job(epoch, app=app)
    job["metadata"]["name"] = name
    pod = job["spec"]["template"]["spec"]
    # The job's own shard size (jobset.sim_job sized it for its 4 writers).
    command = pod["containers"][0]["command"]
    command[command.index("--size") + 1] = str(CHECKPOINT_BYTES // WRITERS)
    pod["tolerations"] = [{"key": NODE_B_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}},
         "topologyKey": "kubernetes.io/hostname"}]}}
    return job


def status() -> dict[str, Any]:
    return get(POLICIES, "-n", NS, POLICY).get("status") or {}


def complete_steps() -> list[int]:
    return jobset.complete_steps(POLICY)


def replicated(logs: Logs, pod: str) -> list[int]:
    """Steps the pod's agent logged as held by its partner, in order."""
    out = []
    for doc in _json_lines(logs.dir / f"{pod}.ckptdrain-agent.log"):
        match = REPLICATED.match(str(doc.get("msg", "")))
        if match:
            out.append(int(match[1]))
    return out


def wipe(directory: Path, *, running: bool = False) -> None:
    """Empty `directory`, as a lost node's disk. `running`: the pod's agent
    and peer server still write into it (a capture, a partner's copy), so a
    file may appear in a directory being removed; take what is there (the
    wipe after they exit must leave nothing)."""
    for _ in range(10):
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        left = sorted(p.name for p in directory.iterdir())
        if running or not left:
            return
        time.sleep(0.5)
    raise RuntimeError(f"could not empty {directory}: {left} keep coming back")


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("P. the peer tier on two nodes: a node lost, restore from the partner")
    logs = Logs(workdir / "logs" / "peer", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        remove(POLICY, NAME)


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    local_root = Path(allowed_root) / NS / POLICY
    shutil.rmtree(local_root, ignore_errors=True)
    apply(policy_manifest(allowed_root, s3.port))
    # The webhook adds the tier only to pods admitted once the Secrets are reported.
    peer = wait_for("the peer tier's Secrets in the policy status",
                    lambda: (p := status().get("peer") or {}).get("secret") and p, 60)
    secrets = [s["metadata"]["name"] for s in get("secrets", "-n", NS, "-l",
                                                   f"ckptdrain.io/policy={POLICY}")["items"]]
    uid = get(POLICIES, "-n", NS, POLICY)["metadata"]["uid"]
    # The chart's CA namespace: <release namespace>-peer-ca.
    kept = [s["metadata"]["name"] for s in get("secrets", "-n", f"{OP_NS}-peer-ca", "-l",
                                               f"ckptdrain.io/peer-ca-for={uid}")["items"]]
    check(secrets == [peer["secret"]] and kept == [f"ckptdrain-peer-ca-{uid}"],
          f"the operator made the policy's certificate Secret {secrets} and keeps its CA in "
          f"its CA namespace {kept}; the certificate ends {peer.get('certificateNotAfter')}")
    # The step clock starts once both pods can have started (the one on node b
    # waits for its partner's peer server): a trainer that starts late races
    # through the steps it missed, saving them at other times than its
    # partner did, so the writers' global steps (globalEvery) would agree only
    # from the first period after it caught up.
    epoch = time.time() + START_MARGIN_S
    began = time.monotonic()
    apply(job_manifest(epoch))
    pods = wait_for("2 writers running", lambda: (p := jobset.running_pods(SELECT))
                    and len(p) == WRITERS and p, 240, every=1)
    for pod in pods.values():
        logs.follow(pod["metadata"]["name"])
    nodes = {w: p["spec"]["nodeName"] for w, p in pods.items()}
    check(len(set(nodes.values())) == 2 and NODE_B in nodes.values(),
          f"one writer on each node: {nodes}")
    injected = [c["name"] for c in pods[0]["spec"]["initContainers"]]
    check("ckptdrain-peer" in injected and injected.index("ckptdrain-peer")
          < injected.index("ckptdrain-restore"),
          f"the peer sidecar runs before restore: {injected}")
    paired = wait_for("status.peer Paired", lambda: (p := status().get("peer") or {}).get(
        "reason") == "Paired" and p, 120, every=1)
    check(sorted((e["writer"], e.get("holder")) for e in paired["pairs"]) == [(0, 1), (1, 0)],
          f"each writer's holder is the other ({paired['message']})")

    # The partner holds a step of writer 0 newer than the newest global one.
    def ahead() -> tuple[int, int, int] | None:
        glob = max(complete_steps(), default=-1)
        held = [s for s in replicated(logs, pods[0]["metadata"]["name"]) if s > glob]
        point = status().get("recoveryPointOnNodeLoss")
        if glob >= 0 and held and isinstance(point, int) and point > glob:
            return max(held), glob, point
        return None
    held, glob, point = wait_for("writer 0's partner ahead of the global tier", ahead, 240,
                                 every=1)
    check(point > glob, f"status.recoveryPointOnNodeLoss {point} is newer than the newest "
                        f"global step {glob} (writer 0's partner holds step {held})")
    report.append(f"| peer tier: writer 0's step on its partner | {time.monotonic() - began:.1f}"
                  f" s after the Job; recovery point on node loss {point}, global {glob} |")

    # Node loss: writer 0's local tier gone with its node, its pod with it.
    old = pods[0]["metadata"]["name"]
    wait_mid_interval(epoch)
    mine = local_root / "writer-0"
    wipe(mine, running=True)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, old, "--wait=false")
    say(f"  wiped {mine} and deleted {old} (writer 0, node {nodes[0]})")
    # A lost node takes everything with it. The old agent still ran after
    # the first wipe (it captured the trainer's newest save again, and the
    # SIGTERM step): once it has exited, wipe again, before the Job's
    # replacement (created only when the old pod is gone) can restore.
    wait_for(f"{old}'s agent exited", lambda: any(
        "agent exiting" in str(doc.get("msg", "")) for doc in _json_lines(
            logs.dir / f"{old}.ckptdrain-agent.log")), GRACE + 30, every=0.5)
    wipe(mine)
    wait_for(f"{old} gone", lambda: not any(
        p["metadata"]["name"] == old for p in get("pods", "-n", NS, "-l", SELECT)["items"]),
        GRACE + 30, every=1)
    glob_at_loss = max(complete_steps(), default=-1)
    new_pod = wait_for("writer 0's replacement running", lambda: (
        p := jobset.running_pods(SELECT).get(0)) and p["metadata"]["name"] != old and p,
        180, every=1)
    new = new_pod["metadata"]["name"]
    logs.follow(new)
    load = wait_for(f"{new} restored", lambda: next(
        (e for e in logs.trainer(new) if e["event"] in ("load", "fresh")), None), 120)
    saved = {e["step"]: e["hash"] for e in logs.trainer(old) if e["event"] == "save"}
    check(load["event"] == "load" and load.get("tier") == "peer",
          f"{new} (node {new_pod['spec']['nodeName']}) restored from the "
          f"{load.get('tier')} tier: {load.get('source')}")
    check(load["step"] > glob_at_loss and load["step"] >= held,
          f"restored step {load['step']}: newer than the newest global step {glob_at_loss}, "
          f"at least the step the partner held before the loss ({held})")
    check(load["hash"] == saved.get(load["step"]),
          f"state hash equal to what writer 0 saved at step {load['step']}")
    others = {e["hash"] for e in logs.trainer(pods[1]["metadata"]["name"])
              if e["event"] == "save"}
    check(load["hash"] not in others, "not writer 1's shard")
    resumed = wait_for(f"{new} trains again", lambda: next(
        (e for e in logs.trainer(new) if e["event"] == "resume"), None), 60)
    check(resumed["step"] == load["step"] + 1, f"{new} resumes at step {resumed['step']}")
    report.append(f"| peer tier: node lost → restored step {load['step']} from the partner "
                  f"(global was {glob_at_loss}) | {load['restore_seconds']:.2f} s in the init "
                  f"container; pod deleted → trainer loaded {load['at'] - deleted:.1f} s |")
