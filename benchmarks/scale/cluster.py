"""The real parts one size runs on: etcd + kube-apiserver (tests/support),
the CRDs, and the `ckptdrain` operator as a subprocess with its webhook
registered (tests/cluster/operator_process.py), plus the two instruments
read from outside: the apiserver's request counters and the operator's
/proc entry."""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from operator_process import OperatorProcess

from support import apiserver

ROOT = Path(__file__).resolve().parents[2]

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
#: What the apiserver writes for itself on a timer (its identity lease, the
#: `kubernetes` service's endpoints). No ckptdrain component writes these but
#: the agents' leases, which the harness counts on the client side instead.
APISERVER_OWN = frozenset({"leases", "endpoints", "endpointslices"})
_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


#: The allocator the chart's Deployment sets (charts/ckptdrain/templates/deployment.yaml).
DEPLOYED_MALLOC = "malloc"


@dataclass(frozen=True)
class Parts:
    cluster: apiserver.Cluster
    operator: OperatorProcess


@contextlib.contextmanager
def running(workdir: Path, cluster_cap: str | None) -> Iterator[Parts]:
    """apiserver + CRDs + operator for one size; everything stopped after."""
    with apiserver.running(workdir / "cluster") as cluster:
        for crd in ("checkpointpolicies", "checkpoints", "checkpointshares"):
            cluster.kubectl("apply", "-f", str(ROOT / "crds" / f"{crd}.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        (workdir / "operator").mkdir(exist_ok=True)
        env = {"CKPTDRAIN_CLUSTER_BANDWIDTH": cluster_cap} if cluster_cap else {}
        # As deployed: the watchdog's default period (not the tests' 1 s) and
        # no debug logging, whose cost is not the operator's.
        op = OperatorProcess(cluster, workdir / "operator", verbose=False,
                             CKPTDRAIN_WATCHDOG_PERIOD="30s", PYTHONMALLOC=DEPLOYED_MALLOC,
                             **env)
        op.start(timeout_s=120)
        try:
            yield Parts(cluster, op)
        finally:
            op.stop()


def request_counts(cluster: apiserver.Cluster) -> Counter[tuple[str, str, str]]:
    """apiserver_request_total of write verbs, by (verb, resource, subresource),
    without the apiserver's own (APISERVER_OWN)."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = urllib.request.Request(cluster.server + "/metrics",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        text = response.read().decode()
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") not in APISERVER_OWN:
            key = (labels["verb"], labels.get("resource", ""), labels.get("subresource", ""))
            counts[key] += int(float(match["value"]))
    return counts


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    rss_bytes: int
    peak_rss_bytes: int


def sample(pid: int) -> ProcSample:
    """CPU seconds (user + system) and resident memory of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    status = Path(f"/proc/{pid}/status").read_text()

    def kib(key: str) -> int:
        line = next(x for x in status.splitlines() if x.startswith(key))
        return int(line.split()[1]) * 1024

    return ProcSample(cpu, kib("VmRSS:"), kib("VmHWM:"))


#: How long a phase may take the operator to work off (its event backlog).
SETTLE_TIMEOUT_S = 300.0


def settle(pid: int, quiet_s: float = 2.0, timeout_s: float = SETTLE_TIMEOUT_S,
           busy_fraction: float = 0.05) -> float:
    """Wait until the operator has been idle (under `busy_fraction` of a core)
    for `quiet_s`, so what a phase caused is counted in that phase. Returns
    the seconds waited; gives up after `timeout_s` (the figures then say
    the phase did not settle)."""
    start = time.monotonic()
    last = sample(pid).cpu_s
    quiet_since = time.monotonic()
    while time.monotonic() - start < timeout_s:
        time.sleep(0.5)
        now = sample(pid).cpu_s
        if now - last > busy_fraction * 0.5:
            quiet_since = time.monotonic()
        last = now
        if time.monotonic() - quiet_since >= quiet_s:
            break
    return time.monotonic() - start
