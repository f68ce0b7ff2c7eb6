"""The DCP step under torchrun: 2 pods × 2 processes, as root, then as uid 1000
(full run, torch trainer).

A CheckpointPolicy `dcp-procs` of 2 writers selects an indexed Job of 2 pods;
each pod runs `torchrun --nnodes=2 --nproc_per_node=2` of train_dcp.py (gloo
on the CPU; the pods meet through pod 0's name under a headless Service), so
the job is 4 ranks and each pod is one writer of 2 of them.

D2. As root (the NGC images' default): all 4 ranks save step SAVE_AT with
    `ckptdrain.dcp.async_save`, one state hash; both writers' manifests of
    it are committed in the store; each pod's published step holds its own
    two ranks' files (`__<rank>_*.distcp`), writer 0's `.metadata` too.
D3. The Job is deleted and one of uid 1000 comes back: all 4 ranks load
    step SAVE_AT with `ckptdrain.dcp.load`, with the hash the root ranks
    saved (what root wrote, uid 1000 reads), then save step RESAVE_AT, which
    both writers commit.

    run(s3, allowed_root, torch_site, report, say, check)   after the DCP step
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dcp
import yaml
from kube import POLICIES, Fatal, apply, get, kubectl, logs, wait_for
from views import BUCKET, NS

NAME = "dcp-procs"
SAVE_AT, RESAVE_AT, WRITERS, PROCESSES, PORT = 30, 60, 2, 2, 29500
#: Run in the trainer container: the pod's published steps and their files.
LOOK = ("import json, os\n"
        "w = '/ckptdrain/work'\n"
        "print(json.dumps({n: sorted(os.listdir(os.path.join(w, n))) for n in os.listdir(w)"
        " if n.startswith('step-') and n[5:].isdigit()}))\n")

Say = Callable[[str], None]
Check = Callable[[object, str], None]


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(dcp.policy_manifest(allowed_root, s3_port, WRITERS))
    doc["metadata"]["name"] = NAME
    doc["spec"]["selector"] = {"matchLabels": {"app": NAME}}
    doc["spec"]["storage"]["uri"] = f"s3://{BUCKET}/{NAME}"
    return json.dumps(doc)


def service_manifest() -> str:
    """Pods of an indexed Job with this subdomain get DNS names
    `<job>-<index>.<service>`: torchrun's rendezvous address (pod 0)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"app": NAME},
                 "publishNotReadyAddresses": True,
                 "ports": [{"name": "rendezvous", "port": PORT}]}})


def job_manifest(uid: int, save_at: int, s3_port: int, torch_site: str) -> str:
    name = f"{NAME}-uid{uid}"
    job = json.loads(dcp.job_manifest(name, WRITERS, s3_port, torch_site, dcp.HERE))
    job["metadata"]["name"] = name
    pod = job["spec"]["template"]
    pod["metadata"]["labels"] = {"app": NAME, "ckptdrain.io/inject": "true"}
    pod["spec"]["subdomain"] = NAME
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if v["name"] != "rdv"]
    (container,) = pod["spec"]["containers"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "rdv"]
    env = [e for e in container["env"]
           if e["name"] not in ("TRAIN_SAVE_AT", "TRAIN_RDV", "CKPTDRAIN_STORE_URI")]
    container["env"] = [
        *env, {"name": "TRAIN_SAVE_AT", "value": str(save_at)},
        # Where this policy's agents drain (the policy's URI, then <namespace>/<policy>).
        {"name": "CKPTDRAIN_STORE_URI", "value": f"s3://{BUCKET}/{NAME}/{NS}/{NAME}"},
        # torchrun itself imports torch: the node's, read-only (Dockerfile).
        {"name": "PYTHONPATH", "value": "/opt/torch"}]
    master = f"{name}-0.{NAME}.{NS}.svc.cluster.local"
    container["command"] = ["sh", "-c", (
        f"exec python3 -m torch.distributed.run --nnodes={WRITERS} "
        f"--nproc_per_node={PROCESSES} --node_rank=$JOB_COMPLETION_INDEX "
        f"--master_addr={master} --master_port={PORT} /opt/trainer/train_dcp.py")]
    container["securityContext"] = {"runAsUser": uid, "runAsNonRoot": uid != 0,
                                    "allowPrivilegeEscalation": False}
    # 4 torch processes on two shared cores.
    container["resources"] = {"requests": {"cpu": "100m", "memory": "512Mi"},
                              "limits": {"memory": "3Gi"}}
    return yaml.safe_dump(job)


def _pods(job: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in get(
        "pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}")["items"]
        if not p["metadata"].get("deletionTimestamp"))


def _ranks(job: str, kind: str) -> dict[int, dict[str, Any]] | None:
    """rank → its `kind` event, once all WRITERS × PROCESSES ranks printed one."""
    if dcp._failed(job):
        raise Fatal(f"job {job} failed before every rank printed {kind!r}:\n"
                    + dcp._diagnosis(job))
    found: dict[int, dict[str, Any]] = {}
    for pod in _pods(job):
        for e in logs(NS, pod, "trainer"):
            if e.get("event") == kind and isinstance(e.get("rank"), int):
                found[e["rank"]] = {**e, "pod": pod}
    return found if len(found) == WRITERS * PROCESSES else None


def _published(pod: str) -> dict[str, list[str]]:
    out = kubectl("exec", "-n", NS, pod, "-c", "trainer", "--", "python3", "-c", LOOK,
                  timeout=30).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _committed(s3: Any, step: int) -> int:
    listed = s3.client().list_objects_v2(
        Bucket=BUCKET, Prefix=f"{NAME}/{NS}/{NAME}/manifests/{step:020d}/")
    return len(listed.get("Contents", []))


def run(s3: Any, allowed_root: str, torch_site: str, report: list[str],
        say: Say, check: Check) -> None:
    say(f"DCP2. {WRITERS} pods × {PROCESSES} processes under torchrun, as root then uid 1000")
    try:
        _run(s3, allowed_root, torch_site, report, say, check)
    finally:
        for uid in (0, 1000):
            kubectl("delete", "job", "-n", NS, f"{NAME}-uid{uid}", "--ignore-not-found",
                    "--wait=true", "--timeout=90s", timeout=100, check=False)
        kubectl("delete", "service", "-n", NS, NAME, "--ignore-not-found", check=False)
        kubectl("delete", POLICIES, "-n", NS, NAME, "--ignore-not-found",
                "--wait=true", timeout=60, check=False)


def _run(s3: Any, allowed_root: str, torch_site: str, report: list[str],
         say: Say, check: Check) -> None:
    shutil.rmtree(Path(allowed_root) / NS / NAME, ignore_errors=True)  # as dcp.py says
    apply(policy_manifest(allowed_root, s3.port))
    apply(service_manifest())
    began = time.monotonic()
    apply(job_manifest(0, SAVE_AT, s3.port, torch_site))
    saves = wait_for("all 4 ranks (root) to save", lambda: _ranks(f"{NAME}-uid0", "save"),
                     600, every=3)
    hashes = {e["hash"] for e in saves.values()}
    starts = _ranks(f"{NAME}-uid0", "start") or {}
    check({e["step"] for e in saves.values()} == {SAVE_AT} and len(hashes) == 1
          and {e.get("uid") for e in starts.values()} == {0},
          f"4 root ranks saved step {SAVE_AT} with one state hash ({sorted(hashes)})")
    wait_for(f"step {SAVE_AT} committed by both writers",
             lambda: _committed(s3, SAVE_AT) == WRITERS, 300, every=2)
    for pod in _pods(f"{NAME}-uid0"):
        writer = next(e["writer"] for e in starts.values() if e["pod"] == pod)
        files = _published(pod).get(f"step-{SAVE_AT}", [])
        ranks = {int(f[2:].split("_")[0]) for f in files if f.endswith(".distcp")}
        mine = {r for r, e in starts.items() if e["pod"] == pod}
        check(ranks == mine and ((".metadata" in files) == (str(writer) == "0")),
              f"{pod} (writer {writer}): step {SAVE_AT} holds ranks {sorted(ranks)}' files "
              f"(its processes: {sorted(mine)}){', and .metadata' if '.metadata' in files else ''}")
    saved = time.monotonic() - began
    kubectl("delete", "job", "-n", NS, f"{NAME}-uid0", "--wait=true", "--timeout=90s",
            timeout=100)
    wait_for("the root pods gone", lambda: not _pods(f"{NAME}-uid0"), 120, every=2)

    resumed = time.monotonic()
    apply(job_manifest(1000, RESAVE_AT, s3.port, torch_site))
    loads = wait_for("all 4 ranks (uid 1000) to load", lambda: _ranks(
        f"{NAME}-uid1000", "load"), 600, every=3)
    check({e["step"] for e in loads.values()} == {SAVE_AT}
          and {e["hash"] for e in loads.values()} == hashes,
          f"4 ranks as uid 1000 loaded step {SAVE_AT} with the hash the root ranks saved")
    again = wait_for("all 4 ranks (uid 1000) to save", lambda: _ranks(
        f"{NAME}-uid1000", "save"), 600, every=3)
    check({e["step"] for e in again.values()} == {RESAVE_AT},
          f"4 ranks as uid 1000 saved step {RESAVE_AT}")
    wait_for(f"step {RESAVE_AT} committed by both writers",
             lambda: _committed(s3, RESAVE_AT) == WRITERS, 300, every=2)
    report.append(f"| DCP under torchrun, 2 pods × 2 processes as root: step {SAVE_AT} "
                  f"committed | {saved:.1f} s |")
    report.append(f"| DCP under torchrun as uid 1000: loaded root's step {SAVE_AT}, saved "
                  f"{RESAVE_AT}, committed | {time.monotonic() - resumed:.1f} s |")
