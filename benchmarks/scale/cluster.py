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

from benchmarks.scale import latency
from support import apiserver
from support.conversion_server import converting_crds

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
def running(workdir: Path, cluster_cap: str | None,
            webhook_process: bool = True) -> Iterator[Parts]:
    """apiserver + CRDs + operator for one size; everything stopped after."""
    # The policy CRD converting through an admission process of its own: the
    # harness writes v1alpha1, v1beta1 is stored (and the operator's own
    # process, one of the sizes, cannot convert).
    crds = [ROOT / "crds" / f"{crd}.yaml"
            for crd in ("checkpointpolicies", "checkpoints", "checkpointshares")]
    with apiserver.running(workdir / "cluster") as cluster, converting_crds(cluster, crds):
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        (workdir / "operator").mkdir(exist_ok=True)
        env = {"CKPTDRAIN_CLUSTER_BANDWIDTH": cluster_cap} if cluster_cap else {}
        env["CKPTDRAIN_WEBHOOK_PROCESS"] = "true" if webhook_process else "false"
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


def apiserver_metrics(cluster: apiserver.Cluster) -> str:
    """The apiserver's /metrics, as text."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = urllib.request.Request(cluster.server + "/metrics",
                                     headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return str(response.read().decode())


def latencies(parts: Parts, settle_s: float = 3.0) -> dict[str, dict[float, float]]:
    """The admission latency histograms of the apiserver and the operator
    (latency.py), once the operator's count of admissions has stopped
    changing (the admission process reports each one a moment after
    answering it), or after `settle_s`."""
    deadline = time.monotonic() + settle_s
    last = None
    while True:
        now = latency.snapshot(apiserver_metrics(parts.cluster), parts.operator.metrics())
        total = max(now["ckptdrain_webhook"].values(), default=0.0)
        if total == last or time.monotonic() > deadline:
            return now
        last = total
        time.sleep(0.5)


def request_counts(cluster: apiserver.Cluster) -> Counter[tuple[str, str, str]]:
    """apiserver_request_total of write verbs, by (verb, resource, subresource),
    without the apiserver's own (APISERVER_OWN)."""
    text = apiserver_metrics(cluster)
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
    #: Each process's own resident bytes: the operator first, then its children.
    rss_by_process: tuple[int, ...] = ()


def _family(pid: int) -> list[int]:
    """`pid` and its children: the operator and its admission process."""
    children: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:  # ppid
            children.append(int(stat.parent.name))
    return [pid, *sorted(children)]


def _one(pid: int) -> ProcSample:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    status = Path(f"/proc/{pid}/status").read_text()

    def kib(key: str) -> int:
        line = next(x for x in status.splitlines() if x.startswith(key))
        return int(line.split()[1]) * 1024

    return ProcSample(cpu, kib("VmRSS:"), kib("VmHWM:"))


def sample(pid: int) -> ProcSample:
    """CPU seconds (user + system) and resident memory of the operator with
    its children (the admission process): what its container uses. The peak
    is the sum of each process's own peak, an upper bound of theirs together."""
    parts = []
    for member in _family(pid):
        try:
            parts.append(_one(member))
        except (OSError, StopIteration):
            if member == pid:
                raise
    return ProcSample(sum(p.cpu_s for p in parts), sum(p.rss_bytes for p in parts),
                      sum(p.peak_rss_bytes for p in parts),
                      tuple(p.rss_bytes for p in parts))


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
