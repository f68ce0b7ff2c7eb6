"""A root trainer through the CSI driver, in a `baseline` namespace (the
CSI step's last part, e2e/scenario/csi.py).

Pod Security `restricted` refuses root by definition, and the NGC images
run their trainers as root: such a namespace can enforce `baseline` at
most, which still forbids hostPath volumes. With the driver as the node
tier no privileged namespace is needed for it either: one writer of the
simulated trainer running as uid 0, without an fsGroup of its own, gets
the webhook's group (65532, above the driver's minimum), checkpoints
through the driver's volume, and its replacement restores from it.

    run(s3, allowed_root, logs, report, check)   with the chart in csi mode
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jobset
from csi_node import DRIVER, NODE, hostpath_refused, saves
from kube import apply, get, kubectl, wait_for
from trainers import Logs
from views import NS, remove, wait_mid_interval

NAME = POLICY = PREFIX = "csi-root"
SELECT = f"app={NAME}"
#: The group the webhook gives a pod without one (admission/work_dir.py).
WEBHOOK_GROUP = 65532
START_MARGIN_S = 10.0
#: The trainer's view of itself: its uid and groups.
WHO = "import json, os; print(json.dumps({'uid': os.getuid(), 'groups': os.getgroups()}))"

Check = Callable[[object, str], None]


def root_job(epoch: float) -> dict[str, Any]:
    """One writer whose trainer runs as root, as an NGC image's does: no
    fsGroup, no runAsNonRoot; the image's own user (65532) overridden."""
    job = jobset.sim_job(epoch, app=NAME)
    job["metadata"]["name"] = NAME
    job["spec"]["completions"] = job["spec"]["parallelism"] = 1
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    return job


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = 1
    return json.dumps(doc)


def writer(old: str | None = None) -> dict[str, Any] | None:
    pod = jobset.running_pods(SELECT).get(0)
    return pod if pod and pod["metadata"]["name"] != old else None


def run(s3: Any, allowed_root: str, logs: Logs, report: list[str], check: Check) -> None:
    hostpath_refused("baseline", "csi-root-hostpath-probe",
                     root_job(time.time())["spec"]["template"]["spec"], check, "a root pod")

    apply(policy_manifest(allowed_root, s3.port))
    epoch = time.time() + START_MARGIN_S
    started = time.monotonic()
    apply(json.dumps(root_job(epoch)))
    pod = wait_for("the root writer running", writer, 180, every=1)
    name = pod["metadata"]["name"]
    logs.follow(name)
    spec = pod["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "ckptdrain-local")
    inits = [c["name"] for c in spec.get("initContainers") or []]
    check(volume.get("csi", {}).get("driver") == DRIVER and "ckptdrain-prepare" not in inits
          and not any("hostPath" in v for v in spec["volumes"]),
          f"{name}: the driver's inline volume, no hostPath, no root container of ours")
    group = (spec.get("securityContext") or {}).get("fsGroup")
    check(group == WEBHOOK_GROUP and spec["nodeName"] == NODE,
          f"{name} on {spec['nodeName']}: the webhook gave it fsGroup {group}")
    who = json.loads(kubectl("exec", "-n", NS, name, "-c", "trainer", "--", "python3", "-c",
                             WHO, timeout=30).stdout.strip().splitlines()[-1])
    check(who["uid"] == 0 and WEBHOOK_GROUP in who["groups"],
          f"the trainer runs as root, holding the data's group: {who}")
    wait_for(f"{name} saves 2 checkpoints", lambda: len(saves(logs, name)) >= 2, 120, every=1)
    report.append(f"| csi: root writer (baseline namespace) created → 2 checkpoints saved | "
                  f"{time.monotonic() - started:.1f} s |")

    wait_mid_interval(epoch)
    kubectl("delete", "pod", "-n", NS, name, "--wait=false")
    new = wait_for("the root writer's replacement running", lambda: writer(name), 180, every=1)
    new_name = new["metadata"]["name"]
    logs.follow(new_name)
    load = wait_for(f"{new_name} restored", lambda: next(
        (e for e in logs.trainer(new_name) if e["event"] in ("load", "fresh")), None), 120)
    saved = saves(logs, name)
    check(load["event"] == "load" and load.get("tier") == "local"
          and load["step"] == max(saved) and load["hash"] == saved[load["step"]],
          f"{new_name} restored step {load.get('step')} from the {load.get('tier')} tier, the "
          f"newest the root trainer saved ({max(saved)}), with its state hash")
    report.append(f"| csi: root writer deleted → restored step {load['step']} from the local "
                  f"tier | {load['restore_seconds']:.2f} s in the init container |")
    remove(POLICY, NAME)
    wait_for("the root writer's pods gone", lambda: not get("pods", "-n", NS, "-l", SELECT)[
        "items"], 90, every=1)
