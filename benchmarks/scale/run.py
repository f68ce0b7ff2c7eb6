"""One size, end to end, on fresh real parts: policies, pods through the
webhook, a job start, checkpoint rounds of hollow agents, then a new job
arriving under the cluster cap (the share change every writer must see).
Returns the figures as one JSON-ready dict (docs/scale.md explains each)."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_helpers import policy

from benchmarks.scale import admission, cluster, hollow, latency
from benchmarks.scale.admission import Writer
from benchmarks.scale.shares import ShareWatch
from ckptdrain.contract.api import CHECKPOINTS, GROUP, POLICIES, VERSION
from ckptdrain.node.lease import lease_seconds

NAMESPACE = "scale"
#: Each policy: the 405B example (5.67 TB every 15 min at 10%: 63 GB/s).
POLICY_BYTES, POLICY_RATE = 5.67e12, 63e9
SQUEEZE = "arriving"


@dataclass(frozen=True)
class Size:
    writers: int
    policies: int
    rounds: int = 3
    rate: float = 50.0
    probe_pods: int = 50
    tick_s: float = 0.5
    #: Pending-bytes periods per drain; None: as many 5 s periods as a real
    #: drain of one shard lasts at its share.
    ticks: int | None = None
    interval_s: float = 900.0
    threads: int = 32
    #: The operator's cluster cap as a fraction of what all policies want.
    cap_fraction: float = 0.8
    #: Admission in its own process (the default), or on the operator's loop.
    webhook_process: bool = True


def layout(size: Size) -> tuple[list[Writer], dict[str, int]]:
    """Writers spread evenly over the policies (the first ones take the rest)."""
    per = {f"p{i}": size.writers // size.policies + (i < size.writers % size.policies)
           for i in range(size.policies)}
    return [Writer(p, r) for p, n in per.items() for r in range(n)], per


def _writes(counts: Counter[tuple[str, str, str]]) -> dict[str, int]:
    return {f"{verb} {res}{'/' + sub if sub else ''}": n
            for (verb, res, sub), n in sorted(counts.items()) if n}


def _leases(agent_counts: Counter[str]) -> Counter[tuple[str, str, str]]:
    """The agents' lease writes (client side), as apiserver counter keys."""
    verbs = {"create": "POST", "replace": "PUT", "patch": "PATCH", "delete": "DELETE"}
    out: Counter[tuple[str, str, str]] = Counter()
    for key, n in agent_counts.items():
        if key.endswith(":leases"):
            out[(verbs[key.split("_", 1)[0]], "leases", "")] += n
    return out


def _wait_sized(custom: Any, names: set[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                     POLICIES)["items"]
        if names <= {i["metadata"]["name"] for i in items if (i.get("status") or {})
                     .get("allowedBandwidthBytes")}:
            return
        time.sleep(0.5)
    raise TimeoutError(f"policies not sized by the operator within {timeout_s}s")


def _largest(core: Any, custom: Any) -> dict[str, int]:
    """Bytes of the biggest object of each kind the run wrote (as JSON)."""
    api = core.api_client
    checkpoints = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                       CHECKPOINTS)["items"]
    pods = [api.sanitize_for_serialization(p) for p in core.list_namespaced_pod(NAMESPACE).items]
    policies = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POLICIES)["items"]

    def biggest(objs: list[dict[str, Any]]) -> int:
        return max((len(json.dumps(o, separators=(",", ":"))) for o in objs), default=0)

    shares = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                  "checkpointshares")["items"]
    return {"checkpoint": biggest(checkpoints), "pod": biggest(pods),
            "checkpointshare": biggest(shares),
            "pod_annotations": biggest([p["metadata"].get("annotations") or {} for p in pods]),
            "policy": biggest(policies), "checkpoints": len(checkpoints)}


def run(size: Size, workdir: Path, log: Any = print) -> dict[str, Any]:
    from kubernetes import client, config

    writers, per_policy = layout(size)
    cap = size.cap_fraction * POLICY_RATE * size.policies
    out: dict[str, Any] = {"writers": size.writers, "policies": size.policies,
                           "admission_in": "process" if size.webhook_process else "operator",
                           "pods_owned_by_jobs": True,
                           "rounds": size.rounds, "cluster_cap_bytes_s": cap}
    with cluster.running(workdir, str(int(cap)), size.webhook_process) as parts:
        pid = parts.operator.proc.pid  # type: ignore[union-attr]
        api = config.new_client_from_config(str(parts.cluster.kubeconfig))
        api.configuration.connection_pool_maxsize = size.threads + 8
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        log(f"[{size.writers}w/{size.policies}p] policies")
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda item: custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, POLICIES, policy(item[0], writers=item[1])),
                per_policy.items()))
        _wait_sized(custom, set(per_policy))
        batch = client.BatchV1Api(api)
        with ThreadPoolExecutor(max_workers=8) as pool:
            owners = dict(zip(per_policy, pool.map(
                lambda item: admission.create_job(batch, NAMESPACE, item[0], item[1]),
                per_policy.items()), strict=True))
        cluster.settle(pid)
        watch = ShareWatch(NAMESPACE, api, cap)
        watch.start()

        log(f"[{size.writers}w/{size.policies}p] {len(writers)} pods at {size.rate}/s")
        histograms = cluster.latencies(parts)
        latencies, errors = admission.create_at_rate(core, NAMESPACE, writers, size.rate,
                                                     owners=owners)
        out["admission_errors"] = errors[:10]
        out["admission_during_creation"] = admission.quantiles(latencies)
        out["admission_breakdown_during_creation"] = latency.breakdown(
            histograms, cluster.latencies(parts))
        out["admission_settle_s"] = round(cluster.settle(pid), 1)

        fleet = hollow.Fleet(writers, per_policy, NAMESPACE, api, size.threads,
                             lease_s=lease_seconds(size.interval_s))
        before = cluster.request_counts(parts.cluster)
        fleet.start()
        cluster.settle(pid)
        start_writes = cluster.request_counts(parts.cluster) - before + _leases(fleet.counts)
        out["job_start_writes_per_writer"] = round(start_writes.total() / size.writers, 2)

        shard = int(POLICY_BYTES / max(per_policy.values()))
        ticks = size.ticks or hollow.realistic_ticks(
            shard, size.cap_fraction * POLICY_RATE / max(per_policy.values()))
        out["pending_ticks_per_drain"] = ticks
        rounds = []
        for step in range(1, size.rounds + 1):
            log(f"[{size.writers}w/{size.policies}p] round {step}/{size.rounds}")
            before, agent_before = cluster.request_counts(parts.cluster), fleet.counts.copy()
            proc_before, t0 = cluster.sample(pid), time.monotonic()
            fleet.checkpoint(step, shard, ticks, size.tick_s)
            settle_s = cluster.settle(pid)
            proc_after = cluster.sample(pid)
            agent_counts = fleet.counts - agent_before
            counts = cluster.request_counts(parts.cluster) - before + _leases(agent_counts)
            agent = agent_counts.total()
            rounds.append({
                "writes_per_writer": round(counts.total() / size.writers, 3),
                "agent_writes_per_writer": round(agent / size.writers, 3),
                "other_writes_per_writer": round((counts.total() - agent) / size.writers, 3),
                "by_resource": _writes(counts),
                "agent_by_call": dict(sorted(agent_counts.items())),
                "operator_cpu_s": round(proc_after.cpu_s - proc_before.cpu_s, 2),
                "operator_rss_mib": round(proc_after.rss_bytes / 2**20, 1),
                "wall_s": round(time.monotonic() - t0, 1), "settle_s": round(settle_s, 1),
                "settled": settle_s < cluster.SETTLE_TIMEOUT_S})
        out["rounds_detail"] = rounds
        # Renewed about once a checkpoint: by the check before the commit (when
        # the last renewal is over 30 s old), or by the loop a third of the
        # duration (three commit periods) after the last renewal.
        renewals = size.interval_s / (lease_seconds(size.interval_s) * 2 / 3)
        out["lease_renewals_per_checkpoint"] = round(renewals, 1)

        log(f"[{size.writers}w/{size.policies}p] a new job arrives under the cluster cap")
        squeeze = [Writer(SQUEEZE, r) for r in range(size.probe_pods)]
        t0 = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, POLICIES, policy(
            SQUEEZE, writers=size.probe_pods,
            model={"checkpointBytes": str(int(POLICY_BYTES * size.policies))}))
        owners[SQUEEZE] = admission.create_job(batch, NAMESPACE, SQUEEZE, size.probe_pods)
        histograms = cluster.latencies(parts)
        probe, controls, probe_errors = admission.create_with_controls(
            core, NAMESPACE, squeeze, size.rate, owners=owners)
        out["admission_breakdown_with_n_present"] = latency.breakdown(
            histograms, cluster.latencies(parts))
        cluster.settle(pid)
        out["admission_with_n_present"] = admission.quantiles(probe)
        out["creation_without_webhook_with_n_present"] = admission.quantiles(controls)
        out["admission_errors"] += probe_errors[:10]
        out["share_visible"] = watch.visible(t0, {w.pod: w.policy for w in writers})
        out["channel_events"], out["channel_malformed"] = watch.events, watch.malformed
        out["agent_errors"] = dict(fleet.errors)
        watch.stop()
        fleet.close()
        out["overshoot_policy"] = {"worst": round(watch.per_policy.worst, 4),
                                   "policy": watch.per_policy.where}
        out["overshoot_cluster"] = round(watch.cluster.worst, 4)
        out["over_cluster_cap_s"] = round(watch.cluster.over_s, 2)
        out["largest_bytes"] = _largest(core, custom)
        final = cluster.sample(pid)
        out["operator_rss_mib"] = round(final.rss_bytes / 2**20, 1)
        out["operator_peak_rss_mib"] = round(final.peak_rss_bytes / 2**20, 1)
        # The operator's own, then its admission process's.
        out["rss_by_process_mib"] = [round(b / 2**20, 1) for b in final.rss_by_process]
    return summarize(out)


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    """The headline figures next to the detail."""
    rounds = out["rounds_detail"]
    n = max(1, len(rounds))
    mean = lambda key: round(sum(r[key] for r in rounds) / n, 3)  # noqa: E731
    out["writes_per_writer_per_checkpoint"] = mean("writes_per_writer")
    # A real agent's lease writes per checkpoint are the model's (its commit
    # renews, or the loop does, about once an interval); the compressed round
    # renews at its commit only when its last renewal is 30 s old, so its own
    # lease writes are replaced by the model's rather than added to them.
    lease = sum(sum(n for call, n in r["agent_by_call"].items() if call.endswith(":leases"))
                for r in rounds) / n / max(1, out["writers"])
    out["with_lease_renewals"] = round(out["writes_per_writer_per_checkpoint"] - lease
                                       + out["lease_renewals_per_checkpoint"], 3)
    out["operator_cpu_s_per_round"] = mean("operator_cpu_s")
    return out
