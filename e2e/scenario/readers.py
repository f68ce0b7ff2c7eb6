"""The reader step (A4, after the restore agreement): data-parallel replicas
that only read restore the step the writers restore, each its shard as its
writer saved it.

A CheckpointPolicy `agree-readers` (`writers: 2`, `readers: Replicas`, 4 MB,
`overlap: 10%`, so a 2 MB shard drains in about a second) selects an
indexed Job of 4 pods of the simulated trainer, on either node: pods 0 and
1 write shards 0 and 1, pods 2 and 3 read shards 0 and 1 (rank mod
writers; a whole number of replicas, so admission warns of nothing).
Admission makes pods 2 and 3 readers: label `ckptdrain.io/reader: <shard>`
(no `ckptdrain.io/writer`), `CKPTDRAIN_ROLE=reader` and
`CKPTDRAIN_WRITER_ID=<shard>` in the trainer, the restore init container
and no agent. Their trainers (`Client().role == "reader"`) never save.

Once both writers' newest step is complete in the store, between two
checkpoints, all 4 pods are deleted at once (a gang restart). Every
replacement loads that step: the writers as the ranks agreed (with readers
beside them only steps in the store count), each reader its shard with the
state hash its writer saved, its restore following the writers' decision
(`; ranks followed it in round N`, the same round and step as the writers).

The trainers run without an emergency checkpoint (`--no-emergency`), so the
step the pods restore is known before the restart.

    run(s3, allowed_root, workdir, report, say, check)   after agreement.run
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jobset
import yaml
from kube import apply, get, kubectl, wait_for
from peer import NODE_B_TAINT, START_MARGIN_S
from trainers import TRAINERS, Logs
from views import GRACE, NS, mid_interval, remove

NAME = POLICY = PREFIX = "agree-readers"
WRITERS, PODS, CHECKPOINT_BYTES = 2, 4, 4_000_000
SELECT = f"app={NAME}"
INDEX = "batch.kubernetes.io/job-completion-index"
WRITER, READER = "ckptdrain.io/writer", "ckptdrain.io/reader"
AGENT, RESTORE = "ckptdrain-agent", "ckptdrain-restore"
RESTORE_RESULT = "ckptdrain.io/restore-result"
#: Restore's last line when it placed a step (restore/result.py summary_line).
PLACED = re.compile(r"^ckptdrain restore: step (\d+) from the (\w+) tier, .* -> \S+$")

Say = Callable[[str], None]
Check = Callable[[object, str], None]
Pods = dict[int, dict[str, Any]]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"] |= {"writers": WRITERS, "readers": "Replicas", "overlap": "10%"}
    doc["spec"]["model"]["checkpointBytes"] = f"{CHECKPOINT_BYTES // 1_000_000}M"
    return json.dumps(doc)


def job_manifest(epoch: float) -> str:
    """job.yaml by the simulated trainer as an indexed Job of PODS pods, on
    either node, each saving its share of CHECKPOINT_BYTES as a writer."""
    job = jobset.sim_job(epoch, app=NAME)
    job["metadata"]["name"] = NAME
    job["spec"] |= {"completions": PODS, "parallelism": PODS}
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    command[command.index("--size") + 1] = str(CHECKPOINT_BYTES // WRITERS)
    command.append("--no-emergency")
    pod["tolerations"] = [{"key": NODE_B_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    return yaml.safe_dump(job)


def running(old: Iterable[str]) -> Pods | None:
    """All PODS pods whose trainer runs, by completion index, when none is in `old`."""
    pods, old = {}, set(old)
    for pod in get("pods", "-n", NS, "-l", SELECT)["items"]:
        statuses = {c["name"]: c for c in pod["status"].get("containerStatuses") or []}
        if pod["metadata"].get("deletionTimestamp") or "running" not in (
                statuses.get("trainer", {}).get("state") or {}):
            continue
        pods[int(pod["metadata"]["labels"][INDEX])] = pod
    if sorted(pods) == list(range(PODS)) and not old & {
            p["metadata"]["name"] for p in pods.values()}:
        return pods
    return None


def names_of(pods: Pods) -> dict[int, str]:
    return {i: p["metadata"]["name"] for i, p in pods.items()}


def saves(logs: Logs, pod: str) -> dict[int, str]:
    return {e["step"]: e["hash"] for e in logs.trainer(pod) if e["event"] == "save"}


def restore_result(pod: str) -> dict[str, Any] | None:
    text = (get("pod", "-n", NS, pod)["metadata"].get("annotations") or {}).get(RESTORE_RESULT)
    return json.loads(text) if text else None


def last_restore_line(logs: Logs, pod: str) -> str | None:
    """The last line of the pod's restore init container (None while it has none)."""
    path = logs.dir / f"{pod}.{RESTORE}.log"
    lines = [line for line in (path.read_text(errors="replace").splitlines()
                               if path.exists() else []) if line.strip()]
    return lines[-1] if lines else None


def check_roles(pods: Pods, check: Check) -> None:
    """Pods below WRITERS write their rank's shard; the others read rank mod WRITERS."""
    for index, pod in sorted(pods.items()):
        labels = pod["metadata"].get("labels") or {}
        spec = pod["spec"]
        names = [c["name"] for c in (spec.get("initContainers") or []) + spec["containers"]]
        (trainer,) = [c for c in spec["containers"] if c["name"] == "trainer"]
        env = {e["name"]: e.get("value") for e in trainer.get("env") or []}
        said = (f"labels {WRITER}={labels.get(WRITER)} {READER}={labels.get(READER)}, "
                f"CKPTDRAIN_ROLE={env.get('CKPTDRAIN_ROLE')}, CKPTDRAIN_WRITER_ID="
                f"{env.get('CKPTDRAIN_WRITER_ID')}, containers {names}")
        shard = str(index % WRITERS)
        if index < WRITERS:
            check(labels.get(WRITER) == shard and READER not in labels and AGENT in names
                  and env.get("CKPTDRAIN_ROLE") == "writer",
                  f"pod {index} ({pod['metadata']['name']}) writes shard {shard}: {said}")
        else:
            check(labels.get(READER) == shard and WRITER not in labels and AGENT not in names
                  and RESTORE in names and env.get("CKPTDRAIN_ROLE") == "reader"
                  and env.get("CKPTDRAIN_WRITER_ID") == shard,
                  f"pod {index} ({pod['metadata']['name']}) reads shard {shard}, restore "
                  f"and no agent: {said}")


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say(f"  A4. reader replicas: {WRITERS} writers and {PODS - WRITERS} readers "
        "(spec.readers: Replicas), all pods deleted at once")
    logs = Logs(workdir / "logs" / "readers", NS, TRAINERS["sim"])
    try:
        _run(s3, allowed_root, logs, report, say, check)
    finally:
        logs.stop()
        remove(POLICY, NAME)


def _run(s3: Any, allowed_root: str, logs: Logs, report: list[str],
         say: Say, check: Check) -> None:
    shutil.rmtree(Path(allowed_root) / NS / POLICY, ignore_errors=True)
    began = time.monotonic()
    apply(policy_manifest(allowed_root, s3.port))
    # Both writers start before the step clock does (peer.py says why).
    epoch = time.time() + START_MARGIN_S
    apply(job_manifest(epoch))
    pods = wait_for(f"{PODS} pods running", lambda: running(()), 240, every=1)
    old = names_of(pods)
    for name in old.values():
        logs.follow(name)
    check_roles(pods, check)

    def settled() -> tuple[int] | None:
        # Both writers' newest save complete in the store, and the next save
        # seconds away: nothing newer can complete while the pods go. The
        # store's manifests, not the Checkpoint records: the operator folds
        # those in a little later, and the window is a few seconds.
        if not mid_interval(epoch):
            return None
        newest = {max(saves(logs, old[w]), default=-1) for w in range(WRITERS)}
        step = newest.pop() if len(newest) == 1 else -1
        every = [f"{w:05d}.json" for w in range(WRITERS)]
        return (step,) if step >= 0 and jobset.committed_writers(
            s3, step, POLICY, PREFIX) == every else None
    (step,) = wait_for("both writers' newest step complete in the store", settled, 120)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, *old.values(), "--wait=false")
    say(f"  deleted {', '.join(old.values())}: step {step} is both writers' newest, complete")
    wait_for("the old pods gone", lambda: not set(old.values()) & {
        p["metadata"]["name"] for p in get("pods", "-n", NS, "-l", SELECT)["items"]},
        GRACE + 30, every=1)
    saved = {w: saves(logs, old[w]) for w in range(WRITERS)}
    pods = wait_for(f"{PODS} replacements running", lambda: running(old.values()), 180,
                    every=1)
    new = names_of(pods)
    for name in new.values():
        logs.follow(name)
    loaded = {i: wait_for(f"{name} restored", lambda name=name: next(
        (e for e in logs.trainer(name) if e["event"] in ("load", "fresh")), None), 120)
        for i, name in new.items()}
    steps = {i: e.get("step") for i, e in loaded.items()}
    tiers = {i: e.get("tier") for i, e in loaded.items()}
    check(all(e["event"] == "load" for e in loaded.values()) and set(steps.values()) == {step},
          f"all {PODS} pods loaded step {step}, the writers' newest before the restart: "
          f"{steps} (tiers {tiers})")
    for i, e in sorted(loaded.items()):
        shard, role = i % WRITERS, "writer" if i < WRITERS else "reader"
        check(e["hash"] == saved[shard].get(step) and e.get("role") == role,
              f"pod {i} ({new[i]}, its trainer's role {e.get('role')}): state hash equal to "
              f"what writer {shard} saved at step {step}")
    check_roles(pods, check)
    for i in range(WRITERS, PODS):
        placed = wait_for(f"{new[i]}: its restore's last line", lambda i=i: PLACED.match(
            last_restore_line(logs, new[i]) or ""), 30)
        result = restore_result(new[i]) or {}
        followed = result.get("agreement") or {}
        check(placed[1] == str(step) and "; ranks followed it in round" in placed[0]
              and result.get("outcome") == "restored" and followed.get("step") == step,
              f"reader {new[i]} restored step {result.get('step')}, the writers' decision "
              f"(round {followed.get('round')}): {placed[0]!r}")
    rounds = set()
    for i in range(WRITERS):
        agreed = (restore_result(new[i]) or {}).get("agreement") or {}
        rounds.add(agreed.get("round"))
        check(agreed.get("why") == "agreed" and agreed.get("step") == step,
              f"writer {i} ({new[i]}): the ranks agreed on step {agreed.get('step')} "
              f"({agreed.get('why')}: {agreed.get('detail')})")
    for i in range(WRITERS, PODS):
        rounds.add(((restore_result(new[i]) or {}).get("agreement") or {}).get("round"))
    check(len(rounds) == 1, f"writers and readers on one round: {rounds}")
    wrote = {n: sorted(saves(logs, n)) for i in range(WRITERS, PODS) for n in (old[i], new[i])}
    check(not any(wrote.values()), f"the readers' trainers saved nothing: {wrote}")
    read_from = "/".join(sorted({str(tiers[i]) for i in range(WRITERS, PODS)}))
    report.append(f"| readers: {WRITERS} writers + {PODS - WRITERS} readers deleted at once → "
                  f"all at step {step}, readers from the {read_from} tier | pods deleted → all "
                  f"trainers loaded {max(e['at'] for e in loaded.values()) - deleted:.1f} s; "
                  f"{time.monotonic() - began:.0f} s for the step |")
