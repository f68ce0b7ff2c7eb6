"""Admission served by its own process (operator/admission/process.py),
through a real apiserver: it answers while the operator's process is
frozen, it sees a policy created since it started, and the operator
starts it again when it dies."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_helpers import INJECT, get, pod, policy, wait_for
from operator_process import OperatorProcess

from ckptdrain.operator.admission import supervisor
from support.apiserver import Cluster

#: The module the supervisor runs as the admission process (`python -m ...`).
PROCESS_MODULE = supervisor.command(("", "", None))[2].encode()


def admission_pids(operator: OperatorProcess) -> list[int]:
    """The operator's admission process (its child running admission/process.py)."""
    found = []
    for pid in operator.children():
        try:
            if PROCESS_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)


def injected(cluster: Cluster, namespace: str, name: str) -> bool:
    stored = get(cluster, namespace, "pod", name)
    return "ckptdrain.io/injected" in (stored["metadata"].get("annotations") or {})


def test_admission_answers_while_the_operator_is_frozen(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("frozen", writers=2))
    # Its own watch has the policy (the operator's view is not asked).
    wait_for(lambda: create(cluster, namespace, pod("w-warm", {"app": "frozen", **INJECT},
                                                    index=0)).returncode == 0,
             what="a first pod admitted")
    assert injected(cluster, namespace, "w-warm")
    assert operator.proc is not None
    os.kill(operator.proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        made = create(cluster, namespace, pod("w-1", {"app": "frozen", **INJECT}, index=1))
        took = time.monotonic() - began
        assert made.returncode == 0, made.stderr
        assert injected(cluster, namespace, "w-1"), "admitted bare while the operator froze"
        stored = get(cluster, namespace, "pod", "w-1")
        assert stored["metadata"]["labels"]["ckptdrain.io/writer"] == "1"
        assert stored["metadata"]["labels"]["ckptdrain.io/writer-policy"] == "frozen"
        # A second claim on writer 1 is refused by the apiserver's word, not a view.
        again = create(cluster, namespace, pod("w-1b", {"app": "frozen", **INJECT}, index=1))
        assert again.returncode != 0 and "already holds" in again.stderr
        # A policy created now is found too (asked of the apiserver or watched).
        apply(policy("later", writers=1))
        made = create(cluster, namespace, pod("l-0", {"app": "later", **INJECT}))
        assert made.returncode == 0, made.stderr
        assert injected(cluster, namespace, "l-0")
        assert took < 10, f"one admission took {took:.1f}s with the operator frozen"
    finally:
        os.kill(operator.proc.pid, signal.SIGCONT)


def test_the_operator_starts_its_admission_process_again_when_it_dies(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("again", writers=1))
    first = wait_for(lambda: admission_pids(operator), what="the admission process")
    assert len(first) == 1
    os.kill(first[0], signal.SIGKILL)
    second = wait_for(lambda: [p for p in admission_pids(operator) if p not in first],
                      what="a new admission process")
    assert len(second) == 1

    def admitted() -> bool:
        name = f"a-{time.monotonic_ns()}"
        made = create(cluster, namespace, pod(name, {"app": "again", **INJECT}))
        return made.returncode == 0 and injected(cluster, namespace, name)

    wait_for(admitted, what="a pod injected by the new admission process")
    assert "the admission process exited" in operator.tail(200_000)
    # Its admissions reach the operator's metrics.
    wait_for(lambda: 'ckptdrain_webhook_seconds_count{outcome="ok",webhook="pod"}'
             in operator.metrics(), what="admission metrics")


def namespaced_pod_lists(cluster: Cluster) -> float:
    """The apiserver's count of LIST requests on pods in one namespace: what
    a rank's holder lookup costs it (Kopf's and the view's lists are
    cluster-wide)."""
    total = 0.0
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="pods"' in line \
                and 'verb="LIST"' in line and 'scope="namespace"' in line \
                and 'subresource=""' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_ranks_holder_is_known_from_the_process_own_watch_of_writer_pods(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    """The admission process keeps a watch of the writer pods: a rank nobody
    holds is admitted without asking the apiserver, a rank held is refused
    after a fresh read, a rank freed by a deletion is admitted again."""
    apply(policy("held", writers=3))
    wait_for(lambda: create(cluster, namespace, pod("h-0", {"app": "held", **INJECT},
                                                    index=0)).returncode == 0,
             what="a first pod admitted")
    # The view's first LIST may end after the process already answers (a
    # rank it cannot vouch for is read fresh): what follows needs the view.
    wait_for(lambda: "writer pods in view" in operator.tail(2_000_000),
             what="the admission process's view of the writer pods")
    before = namespaced_pod_lists(cluster)
    for index in (1, 2):
        made = create(cluster, namespace, pod(f"h-{index}", {"app": "held", **INJECT},
                                              index=index))
        assert made.returncode == 0, made.stderr
        assert injected(cluster, namespace, f"h-{index}")
    assert namespaced_pod_lists(cluster) == before, "the holders were asked of the apiserver"
    again = create(cluster, namespace, pod("h-0b", {"app": "held", **INJECT}, index=0))
    assert again.returncode != 0 and "h-0 already holds" in again.stderr, again.stderr
    assert namespaced_pod_lists(cluster) > before  # the refusal rests on a fresh read
    cluster.kubectl("delete", "-n", namespace, "pod", "h-0", "--wait=true", "--timeout=30s")
    made = create(cluster, namespace, pod("h-0c", {"app": "held", **INJECT}, index=0))
    assert made.returncode == 0, made.stderr
    assert get(cluster, namespace, "pod", "h-0c")["metadata"]["labels"][
        "ckptdrain.io/writer"] == "0"
