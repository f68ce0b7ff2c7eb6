"""The operator's release: helm install (step 1), uninstall and cleanup
(step 8), what an interrupted earlier run left behind, and the operator's
own log kept when a step fails."""

from __future__ import annotations

import time
from pathlib import Path

import platform_class
from kube import POLICIES, Failed, apply, get, helm, kubectl, wait_for
from narration import REPORT, check, say
from views import JOB, NS, OP_NS, POLICY, RELEASE, S3_NS, render

REPO = Path(__file__).resolve().parent.parent.parent


def step1_install(image_repo: str, allowed_root: str) -> None:
    say("1. helm install the chart; operator ready; webhooks over TLS")
    # The training namespace first: the chart puts the agent's ServiceAccount there.
    apply(render("namespace.yaml", NAMESPACE=NS))
    began = time.monotonic()
    helm("install", RELEASE, str(REPO / "charts/ckptdrain"), "-n", OP_NS, "--create-namespace",
         "--set", f"image.repository={image_repo}", "--set", "image.tag=dev",
         "--set", "image.pullPolicy=Never", "--set", f"agent.namespaces={{{NS}}}",
         "--set", f"localTier.allowedRoot={allowed_root}",
         # The hostPath fallback, named: the chart's default is the CSI
         # driver, but one csiDriver.kubeletDir cannot serve this cluster's
         # two kubelets (each keeps its root dir in its own state dir on the
         # one host), and the peer, agreement, processes and JobSet steps
         # need both nodes. The CSI step (E2E_ONLY=csi) upgrades to csi on
         # node a alone (csi_node.py).
         "--set", "nodeTier.mode=hostPath",
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


def keep_operator_logs(path: Path) -> None:
    """The operator's own log beside the pods' (the agents' view alone often
    cannot say why the operator did not act)."""
    out = kubectl("logs", "-n", OP_NS, "-l", "app.kubernetes.io/component=operator",
                  "--all-containers", "--prefix", "--tail=-1", "--max-log-requests=8",
                  check=False, timeout=60)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.stdout + out.stderr)

