"""The recency of each workload's checkpoints as metrics (labels: namespace,
policy, workload_kind, workload, domain: bounded by the running workloads,
never per step or pod). A workload's series go when its policy's last live
pod under it does. `policy` keeps two policies whose pods share a workload
(a JobSet's trainer and eval Jobs) on series of their own: neither
overwrites nor removes the other's."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

from ckptdrain.contract.api import parse_timestamp
from ckptdrain.operator.recency.document import DOMAINS

LABELS = ["namespace", "policy", "workload_kind", "workload", "domain"]
CHECKPOINT_TIME = Gauge(
    "ckptdrain_workload_checkpoint_time_seconds",
    "When training was at the newest step that survives losing a pod, a node, or "
    "everything (domain): Unix time; work at risk is time() minus this", LABELS)
CHECKPOINT_STEP = Gauge(
    "ckptdrain_workload_checkpoint_step",
    "The newest step that survives losing a pod, a node, or everything (domain)", LABELS)

Workload = tuple[str, str, str, str]  # namespace, policy, kind, name


def publish(workload: Workload, doc: Mapping[str, Any]) -> None:
    """Each domain's series from the document; a domain without a step has none."""
    for domain in DOMAINS:
        entry = doc.get(domain)
        if entry is None:
            for gauge in (CHECKPOINT_TIME, CHECKPOINT_STEP):
                with contextlib.suppress(KeyError):
                    gauge.remove(*workload, domain)
            continue
        CHECKPOINT_STEP.labels(*workload, domain).set(int(entry["step"]))
        CHECKPOINT_TIME.labels(*workload, domain).set(
            parse_timestamp(str(entry["time"])).timestamp())


def forget(workload: Workload) -> None:
    for domain in DOMAINS:
        for gauge in (CHECKPOINT_TIME, CHECKPOINT_STEP):
            with contextlib.suppress(KeyError):
                gauge.remove(*workload, domain)
