"""The operator's goodput metrics, per policy (labels: namespace, policy;
bounded by the number of policies, never per step or per pod)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Gauge

LABELS = ["namespace", "policy"]
RUNTIME_GOODPUT = Gauge("ckptdrain_runtime_goodput_ratio",
                        "Productive training time / time the job held its resources "
                        "(at the last interruption or restore the operator saw)", LABELS)
AVAILABLE_SECONDS = Gauge("ckptdrain_resources_available_seconds",
                          "Time the job held its resources: runtime goodput's denominator",
                          LABELS)
WAITING_SECONDS = Gauge("ckptdrain_waiting_for_resources_seconds",
                        "Time from interruptions until their replacement pods had a node "
                        "(not in runtime goodput)", LABELS)
INTERRUPTIONS = Gauge("ckptdrain_interruptions", "Interruptions seen since the policy was "
                      "created", LABELS)
LOST_STEPS = Gauge("ckptdrain_lost_steps", "Training steps redone after interruptions",
                   LABELS)
LOST_SECONDS = Gauge("ckptdrain_lost_seconds", "Training time redone after interruptions",
                     LABELS)
RECOVERY_SECONDS = Gauge("ckptdrain_recovery_seconds",
                         "Time from interruptions to training again, summed", LABELS)
LAST_RECOVERY_SECONDS = Gauge("ckptdrain_last_recovery_seconds",
                              "Time from the newest interruption to training again", LABELS)
BLOCKED_SECONDS = Gauge("ckptdrain_trainers_blocked_seconds",
                        "Time trainers spent inside checkpoint saves, summed over writers",
                        LABELS)
FAILED_RESTORES = Gauge("ckptdrain_failed_restores", "Restores that failed", LABELS)
ALL = (RUNTIME_GOODPUT, AVAILABLE_SECONDS, WAITING_SECONDS, INTERRUPTIONS, LOST_STEPS,
       LOST_SECONDS, RECOVERY_SECONDS, LAST_RECOVERY_SECONDS, BLOCKED_SECONDS, FAILED_RESTORES)


def publish(key: tuple[str, str], status: Mapping[str, Any]) -> None:
    """Set every gauge of one policy from its `status.goodput`."""
    if status.get("runtimeGoodput") is not None:
        RUNTIME_GOODPUT.labels(*key).set(float(status["runtimeGoodput"]))
    AVAILABLE_SECONDS.labels(*key).set(float(status.get("availableSeconds") or 0))
    WAITING_SECONDS.labels(*key).set(float(status.get("waitingForResourcesSeconds") or 0))
    INTERRUPTIONS.labels(*key).set(int(status.get("interruptions") or 0))
    LOST_STEPS.labels(*key).set(int(status.get("lostSteps") or 0))
    LOST_SECONDS.labels(*key).set(float(status.get("lostSeconds") or 0))
    RECOVERY_SECONDS.labels(*key).set(float(status.get("recoverySeconds") or 0))
    last = (status.get("lastInterruption") or {}).get("recoverySeconds")
    if last is not None:
        LAST_RECOVERY_SECONDS.labels(*key).set(float(last))
    BLOCKED_SECONDS.labels(*key).set(float(status.get("blockedSeconds") or 0))
    FAILED_RESTORES.labels(*key).set(int(status.get("failedRestores") or 0))


def forget(key: tuple[str, str]) -> None:
    for gauge in ALL:
        with contextlib.suppress(KeyError):
            gauge.remove(*key)
