"""What the scenario prints when a step fails, so that a failure read only from
the run's output (a CI log) says why: the nodes' conditions (disk or memory
pressure stops every pod from starting), the operator's pods and events (an
install that never became Ready), and the operator's last log lines."""

from __future__ import annotations

from collections.abc import Callable

from kube import Failed, get, kubectl
from views import NS, OP_NS


def _node_lines() -> list[str]:
    lines = []
    for node in get("nodes")["items"]:
        bad = [f"{c['type']}={c['status']} ({c.get('message', '')})"
               for c in node["status"].get("conditions", [])
               if (c["type"] == "Ready") != (c["status"] == "True")]
        taints = [t["key"] for t in node["spec"].get("taints", [])]
        lines.append(f"node {node['metadata']['name']}: "
                     f"{'; '.join(bad) or 'Ready, no pressure'}"
                     f"{'; taints ' + ', '.join(taints) if taints else ''}")
    return lines


def _tail(*args: str, keep: int) -> list[str]:
    out = kubectl(*args, check=False, timeout=60)
    return (out.stdout + out.stderr).splitlines()[-keep:]


def print_state(say: Callable[[str], None]) -> None:
    """Print the cluster's state as a user would gather it with kubectl; never
    raises (a cluster too broken to answer says so in one line)."""
    say("the cluster when the step failed:")
    try:
        for line in _node_lines():
            print("  ", line, flush=True)
    except (Failed, KeyError, ValueError) as err:
        print(f"   nodes unreadable: {err}", flush=True)
    for ns in (OP_NS, NS):
        for line in _tail("get", "pods", "-n", ns, "-o", "wide", keep=20):
            print(f"   pods {ns}:", line, flush=True)
    for line in _tail("get", "events", "-n", OP_NS, "--sort-by=.lastTimestamp", keep=25):
        print(f"   event {OP_NS}:", line, flush=True)
    for line in _tail("logs", "-n", OP_NS, "-l", "app.kubernetes.io/component=operator",
                      "--all-containers", "--prefix", "--tail=30", "--max-log-requests=8",
                      keep=30):
        print("   operator:", line, flush=True)
