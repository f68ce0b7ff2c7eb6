"""The CSI node tier on the real kubelets (E2E_ONLY=csi, full run only).

The chart, upgraded to `nodeTier.mode: csi`, runs the driver as a
DaemonSet; the step asserts that it registers with kubelet by itself
(the node's CSINode lists it, with no registrar sidecar). Then the
training namespace enforces Pod Security `restricted`, and one writer of
the simulated trainer (the project image) checkpoints through the
driver's inline volume: no hostPath, no root container. While it trains,
the driver's pod is deleted: its replacement registers again, the mount
stays and checkpoints go on. Then the writer's pod is deleted and its
replacement, on the same node, restores the newest step from the local
tier, with the state hash the first pod saved. Last, the Job and the policy
are deleted: the driver deletes the policy's node data within the grace
period (set short here) and two scan intervals. Then a root trainer
checkpoints and restores through the driver in the same namespace, now
enforcing `baseline` (csi_root.py).

The DaemonSet is pinned to node a (csi_node.py says why; the chart's
tolerations would otherwise put a second driver on node b, serving node
a's sockets from the same host), and the writer, which does not tolerate
node b's taint, lands there too.

    run(s3, allowed_root, workdir, report, say, check)
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import csi_root
import jobset
from csi_node import (
    DRIVER,
    NAME,
    NODE,
    POLICY,
    PREFIX,
    SELECT,
    driver_pod,
    driver_pods,
    hostpath_refused,
    keep_driver_logs,
    kubelet_dir,
    mounted,
    node_id,
    registered_by,
    saves,
    target,
    trainer_pod,
)
from csi_restarts import BucketWatch, restart_driver, restart_kubelet
from kube import POLICIES, apply, get, helm, kubectl, wait_for
from trainers import TRAINERS, Logs
from views import NS, OP_NS, RELEASE, remove, wait_mid_interval

#: Seconds between the Job's creation and its step clock's start.
START_MARGIN_S = 10.0
RESTRICTED = "pod-security.kubernetes.io/enforce"
#: The trainer's uid: not root, not the agent's 65532.
TRAINER_UID = 1000
#: The driver's reclaim grace and scan interval in this step: short, to be watched.
GRACE_S = 10
SCAN_S = 5

Say = Callable[[str], None]
Check = Callable[[object, str], None]
REPO = Path(__file__).resolve().parent.parent.parent


def restricted_job(epoch: float) -> dict[str, Any]:
    """One writer of the simulated trainer, written for Pod Security
    `restricted`: non-root, no privilege escalation, no capabilities,
    the runtime's seccomp profile. The webhook adds the rest."""
    job = jobset.sim_job(epoch, app=NAME)
    job["metadata"]["name"] = NAME
    job["spec"]["completions"] = job["spec"]["parallelism"] = 1
    pod = job["spec"]["template"]["spec"]
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": TRAINER_UID,
                              "runAsGroup": TRAINER_UID,
                              "seccompProfile": {"type": "RuntimeDefault"}}
    pod["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return job


def policy_manifest(allowed_root: str, s3_port: int) -> str:
    doc = json.loads(jobset.policy_manifest(allowed_root, s3_port, policy=POLICY, app=NAME,
                                            prefix=PREFIX))
    doc["spec"]["writers"] = 1
    return json.dumps(doc)


def set_mode(mode: str, root: str, wait: str = "180s") -> None:
    helm("upgrade", RELEASE, str(REPO / "charts/ckptdrain"), "-n", OP_NS, "--reuse-values",
         "--set", f"nodeTier.mode={mode}", "--set", f"csiDriver.kubeletDir={kubelet_dir()}",
         "--set", f"csiDriver.rootDir={root}",
         "--set", f"csiDriver.reclaim.gracePeriod={GRACE_S}s",
         "--set", f"csiDriver.scanInterval={SCAN_S}s",
         "--set-json", "csiDriver.nodeSelector=" + json.dumps({"kubernetes.io/hostname": NODE}),
         "--wait", "--timeout", wait, timeout=200)
    kubectl("-n", OP_NS, "rollout", "status", "deploy", "--timeout=120s", timeout=130)


def run(s3: Any, allowed_root: str, workdir: Path, report: list[str],
        say: Say, check: Check) -> None:
    say("C. the node tier through the CSI driver on the real kubelet")
    logs = Logs(workdir / "logs" / "csi", NS, TRAINERS["sim"])
    root = str(workdir / "csi-root")
    # From before the first step, so it sees every step reach the bucket.
    bucket = BucketWatch(s3, PREFIX, NS, POLICY)
    failed = True
    try:
        _run(s3, allowed_root, root, logs, bucket, report, say, check)
        say("  a root trainer, in a baseline namespace (csi_root.py)")
        csi_root.run(s3, allowed_root, logs, report, check)
        failed = False
    finally:
        try:
            clean_up(root, logs, bucket)
        except Exception as err:
            if not failed:
                raise
            # The step's own error, raised on from here, is the one to show.
            say(f"  the cleanup after the step's failure failed too: {err}")


def clean_up(root: str, logs: Logs, bucket: BucketWatch) -> None:
    """The step's pods, policy and driver data gone, the chart back in the
    scenario's hostPath mode."""
    bucket.stop()
    logs.stop()
    keep_driver_logs(logs.dir)
    remove(POLICY, NAME)
    remove(csi_root.POLICY, csi_root.NAME)
    # The driver unpublishes the pods' volumes: it goes only after them.
    wait_for("the step's pods gone", lambda: not get("pods", "-n", NS, "-l", SELECT)[
        "items"] and not get("pods", "-n", NS, "-l", csi_root.SELECT)["items"], 90, every=1)
    kubectl("label", "namespace", NS, f"{RESTRICTED}=privileged", "--overwrite",
            check=False)
    # Back to the scenario's hostPath fallback (release.py says why), so
    # later steps (and the uninstall) see hostPath.
    set_mode("hostPath", root)
    shutil.rmtree(root, ignore_errors=True)


def _run(s3: Any, allowed_root: str, root: str, logs: Logs, bucket: BucketWatch,
         report: list[str], say: Say, check: Check) -> None:
    began = time.monotonic()
    set_mode("csi", root)
    first_driver = wait_for("the driver's pod Ready", driver_pod, 120, every=1)
    nodes = [p["spec"].get("nodeName") for p in driver_pods()]
    check(nodes == [NODE], f"one driver pod, on {NODE}: {nodes}")
    listed = wait_for(f"CSINode {NODE} lists {DRIVER}", lambda: node_id(NODE), 60, every=1)
    up = time.monotonic() - began
    check(listed == NODE and registered_by(first_driver["metadata"]["name"]),
          f"CSINode {NODE} lists {DRIVER} with node id {listed}, {up:.1f}s after helm upgrade "
          f"(the driver registered itself, no registrar sidecar)")
    driver = get("csidriver", DRIVER)["spec"]
    check(driver.get("podInfoOnMount") and driver.get("volumeLifecycleModes") == ["Ephemeral"],
          f"CSIDriver {DRIVER}: {driver}")
    report.append(f"| csi: helm upgrade → driver registered with kubelet | {up:.1f} s |")
    # Its free-space report, written with the token kubelet mounted: the
    # chart's policy lets a driver write its own node's report alone.
    free = wait_for(f"{NODE}'s free-space report", lambda: [r for r in get(
        "csistoragecapacities", "-n", OP_NS, "-l", f"ckptdrain.io/csi-driver={DRIVER}")[
        "items"] if r["metadata"].get("annotations", {}).get("ckptdrain.io/node") == NODE],
        60, every=1)
    check(len(free) == 1 and bool(free[0].get("capacity")),
          f"the driver wrote {NODE}'s free-space report through the admission policy: "
          f"{free[0]['metadata']['name']} capacity {free[0].get('capacity')}")

    hostpath_refused("restricted", "csi-hostpath-probe",
                     restricted_job(time.time())["spec"]["template"]["spec"], check,
                     "the same pod")

    apply(policy_manifest(allowed_root, s3.port))
    uid = get(POLICIES, "-n", NS, POLICY)["metadata"]["uid"]
    data = Path(root) / NS / uid / "data"
    epoch = time.time() + START_MARGIN_S
    started = time.monotonic()
    apply(json.dumps(restricted_job(epoch)))
    pod = wait_for("the writer running", trainer_pod, 180, every=1)
    name = pod["metadata"]["name"]
    logs.follow(name)
    spec = pod["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "ckptdrain-local")
    check(volume.get("csi", {}).get("driver") == DRIVER
          and not any("hostPath" in v for v in spec["volumes"]),
          f"{name}: the node tier is the driver's inline volume, no hostPath ({volume})")
    inits = [c["name"] for c in spec.get("initContainers") or []]
    check("ckptdrain-prepare" not in inits, f"no root container: {inits}")
    check(spec["nodeName"] == NODE, f"{name} runs on {spec['nodeName']}, the driver's node")
    check(mounted(target(pod)), f"kubelet's target path is a mount: {target(pod)}")
    owner = json.loads((data.parent / "owner.json").read_text())
    check(owner.get("policyUid") == uid and owner.get("namespace") == NS,
          f"the driver made the policy's directory, keyed by its UID: {owner}")
    # kubelet handed the driver the pod's fsGroup (VOLUME_MOUNT_GROUP) and
    # changed no ownership itself: the driver's 65532:<group> 2770 stands.
    group = pod["spec"]["securityContext"].get("fsGroup")
    st = data.stat()
    check((st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (65532, group, "0o2770")
          and owner.get("group") == group,
          f"the data dir is 65532:{st.st_gid} {oct(st.st_mode & 0o7777)}, the group the pod's "
          f"fsGroup {group}")

    wait_for(f"{name} saves 2 checkpoints", lambda: len(saves(logs, name)) >= 2, 120,
             every=1)
    report.append(f"| csi: restricted writer created → 2 checkpoints saved | "
                  f"{time.monotonic() - started:.1f} s |")
    files = sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())
    check(files, f"the checkpoints are in the driver's data dir ({len(files)} files, "
                 f"e.g. {files[:2]})")
    work_on_node(pod, data, group, check)

    # The driver, then kubelet, restarted while the writer drains: nothing lost.
    restart_driver(logs, name, data, bucket, report, check)
    restart_kubelet(logs, name, bucket, report, say, check)

    # The writer's pod deleted: its replacement restores from the local tier.
    wait_mid_interval(epoch)
    deleted = time.time()
    kubectl("delete", "pod", "-n", NS, name, "--wait=false")
    wait_for(f"{name} gone", lambda: not any(p["metadata"]["name"] == name for p in get(
        "pods", "-n", NS, "-l", SELECT)["items"]), 90, every=1)
    check(not mounted(target(pod)),
          f"{name}'s volume unpublished: no mount left at its target path")
    new = wait_for("the writer's replacement running", lambda: trainer_pod(name), 180,
                   every=1)
    new_name = new["metadata"]["name"]
    logs.follow(new_name)
    load = wait_for(f"{new_name} restored", lambda: next(
        (e for e in logs.trainer(new_name) if e["event"] in ("load", "fresh")), None), 120)
    saved = saves(logs, name)
    check(load["event"] == "load" and load.get("tier") == "local",
          f"{new_name} (node {new['spec']['nodeName']}) restored step {load.get('step')} from "
          f"the {load.get('tier')} tier")
    check(load["step"] == max(saved) and load["hash"] == saved[load["step"]],
          f"the newest step {name} saved ({max(saved)}), with its state hash")
    report.append(f"| csi: writer deleted → restored step {load['step']} from the local tier "
                  f"through the driver | {load['restore_seconds']:.2f} s in the init container; "
                  f"pod deleted → trainer loaded {load['at'] - deleted:.1f} s |")

    # The policy deleted once its pods are gone: its node data goes within
    # the grace and two scans (the driver's publish records hold it before).
    remove(POLICY, NAME)
    gone_at = time.monotonic()
    wait_for("the step's pods gone", lambda: not get("pods", "-n", NS, "-l", SELECT)[
        "items"], 90, every=0.5)
    pods_gone = time.monotonic() - gone_at
    wait_for("the deleted policy's node data gone", lambda: not data.parent.exists(),
             GRACE_S + 2 * SCAN_S + 60, every=0.5)
    took = time.monotonic() - gone_at
    # Held while a pod mounts it: the bound counts from the later of the two.
    bound = max(GRACE_S + 2 * SCAN_S, pods_gone + SCAN_S) + 5
    check(took <= bound,
          f"the node data of deleted policy {POLICY} (uid {uid}) gone {took:.1f}s after the "
          f"policy and its Job were deleted (pods gone after {pods_gone:.1f}s; grace "
          f"{GRACE_S}s, scans every {SCAN_S}s; bound {bound:.1f}s)")
    report.append(f"| csi: policy deleted → its node data gone (grace {GRACE_S} s, scan "
                  f"{SCAN_S} s) | {took:.1f} s |")


def work_on_node(pod: dict[str, Any], data: Path, group: int, check: Check) -> None:
    """The trainer's work dir is its own dir in the driver's volume, made by
    restore (65532, the pod's group, 2775), not an emptyDir; capture linked
    the trainer's files into the local tier (the same inodes)."""
    spec, uid = pod["spec"], pod["metadata"]["uid"]
    mounts = spec["containers"][0].get("volumeMounts") or []
    check(not any(v["name"] == "ckptdrain-work" for v in spec["volumes"])
          and {"name": "ckptdrain-local", "mountPath": "/ckptdrain/work",
               "subPathExpr": "$(CKPTDRAIN_WORK_NAME)"} in mounts,
          f"the trainer mounts its work dir from the driver's volume, no emptyDir ({mounts})")
    work = data / f"work-0-{uid}"
    st = work.lstat()
    check((st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (65532, group, "0o2775"),
          f"{work.name} is 65532:{st.st_gid} {oct(st.st_mode & 0o7777)}: restore made it")
    # The agent captures a published step within moments, and keeps the
    # newest captured one in the work dir: seen within a few tries.
    linked = wait_for("a step of the work dir linked into the local tier",
                      lambda: _inodes(work, work) & _inodes(data, work), 60, every=1)
    check(linked, f"capture linked the trainer's files: {len(linked)} inodes of "
                  f"{work.name} are in the local tier too")


def _inodes(top: Path, work: Path) -> set[int]:
    """The inodes of the files under `top` (outside `work` unless it is `work`);
    a file pruned while listed is skipped."""
    found: set[int] = set()
    try:
        paths = list(top.rglob("*"))
    except OSError:  # a dir pruned while listed: the next try
        return found
    for path in paths:
        if top != work and work in path.parents:
            continue
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if st.st_mode & 0o170000 == 0o100000:
            found.add(st.st_ino)
    return found
