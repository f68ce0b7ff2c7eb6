"""What the CSI step sees of node a: the driver's pods, kubelet's record of
the driver, the writer's pod and its target path (e2e/scenario/csi.py and
csi_restarts.py both look through these).

The e2e cluster's kubelet keeps its root dir in the cluster's state dir,
not /var/lib/kubelet, and node b, on the same host, has its own: one
`csiDriver.kubeletDir` fits one of them, so the DaemonSet is pinned to
node a (NODE).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobset
from kube import get, kubectl
from trainers import Logs
from views import NS, OP_NS

NAME = POLICY = PREFIX = "csi"
SELECT = f"app={NAME}"
NODE = "ckptdrain-e2e"
DRIVER = "node.ckptdrain.io"
DRIVER_PODS = "app.kubernetes.io/component=csi-node"
ENFORCE = "pod-security.kubernetes.io/enforce"
#: The driver's line each time kubelet registers it (csi/registration.py).
REGISTERED = "kubelet registered CSI driver"
#: Node a's kubelet health (e2e/cluster/lib.sh's KUBELET_HEALTHZ_PORT).
KUBELET_HEALTHZ = "http://127.0.0.1:10248/healthz"


def kubelet_dir() -> str:
    """Node a's kubelet root dir (e2e/cluster/lib.sh's $STATE/kubelet)."""
    cache = os.environ.get("CKPTDRAIN_CACHE", str(Path.home() / ".cache/ckptdrain"))
    return os.environ.get("CKPTDRAIN_CLUSTER_STATE", f"{cache}/cluster") + "/kubelet"


def driver_pods() -> list[dict[str, Any]]:
    return get("pods", "-n", OP_NS, "-l", DRIVER_PODS)["items"]


def node_id(node: str) -> str | None:
    """The node id kubelet recorded for the driver (its NodeGetInfo)."""
    drivers = get("csinode", node).get("spec", {}).get("drivers") or []
    return next((d.get("nodeID") for d in drivers if d.get("name") == DRIVER), None)


def registrations(pod: str) -> int:
    """How many times kubelet told this driver pod it is registered (its log)."""
    return kubectl("logs", "-n", OP_NS, pod, check=False).stdout.count(REGISTERED)


def registered_by(pod: str) -> bool:
    return registrations(pod) > 0


def driver_pod() -> dict[str, Any] | None:
    """The Ready driver pod on NODE."""
    for pod in driver_pods():
        if pod["spec"].get("nodeName") != NODE:
            continue
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        if not pod["metadata"].get("deletionTimestamp") and ready.get("Ready") == "True":
            return pod
    return None


def trainer_pod(old: str | None = None) -> dict[str, Any] | None:
    """The writer whose trainer runs, other than `old`."""
    pod = jobset.running_pods(SELECT).get(0)
    return pod if pod and pod["metadata"]["name"] != old else None


def target(pod: dict[str, Any]) -> Path:
    """Where kubelet mounts the pod's node tier (the driver's target path)."""
    return (Path(kubelet_dir()) / "pods" / pod["metadata"]["uid"]
            / "volumes/kubernetes.io~csi/ckptdrain-local/mount")


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point in this (the host's) mount namespace.
    Not os.path.ismount: a bind mount from the same filesystem keeps st_dev."""
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == str(path) for line in table)


def containers_started(pod: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
    """Each container's restart count and when its running instance started:
    both stay the same as long as nothing restarted it."""
    status = pod["status"]
    return {c["name"]: (c.get("restartCount", 0),
                        (c.get("state") or {}).get("running", {}).get("startedAt"))
            for c in (status.get("initContainerStatuses") or [])
            + (status.get("containerStatuses") or [])}


def keep_driver_logs(directory: Path, name: str = "csi-node.log") -> None:
    """The driver's log beside the pods' (what kubelet asked, what it answered)."""
    out = kubectl("logs", "-n", OP_NS, "-l", DRIVER_PODS, "--prefix", "--tail=-1",
                  check=False, timeout=60)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(out.stdout + out.stderr)


def saves(logs: Logs, pod: str) -> dict[int, str]:
    return {e["step"]: e["hash"] for e in logs.trainer(pod) if e["event"] == "save"}


def hostpath_refused(level: str, probe: str, pod_spec: dict[str, Any],
                     check: Callable[[bool, str], None], who: str) -> None:
    """Label NS to enforce Pod Security `level` and show that `pod_spec` with
    a hostPath added is refused there (a server-side dry run): what the
    driver's inline volume replaces is what the namespace forbids."""
    kubectl("label", "namespace", NS, f"{ENFORCE}={level}", "--overwrite")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": probe, "namespace": NS},
           "spec": pod_spec | {"volumes": [{"name": "h", "hostPath": {"path": "/tmp"}}]}}
    refused = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod),
                      check=False)
    check(refused.returncode != 0 and level in refused.stderr,
          f"{NS} enforces {level}: {who} with a hostPath is refused "
          f"({refused.stderr.strip()[-120:]})")
