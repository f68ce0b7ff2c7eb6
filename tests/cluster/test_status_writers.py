"""Writers of a policy's conditions never drop each other's, on the real
apiserver. A status merge patch replaces the whole conditions list, so each
writer computes its list from the policy as it read it; several write
(the sizing reconcile, the census, the unprotected-pods sweep, the joint
allocation, the stall watchdog, the Kueue check). Each writes at the
resourceVersion it read and, on a conflict, reads again and computes anew:
here a write computed from an older read lands after another writer's and
both writers' conditions are there. On an apiserver of its own, where no
operator runs: the writers are called with a policy read before another
writer's change."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from cluster_helpers import POLICIES, policy
from kubernetes import client, config
from operator_process import repo_root

from ckptdrain.operator import policy_reconcile
from ckptdrain.operator.admission import sweep
from ckptdrain.operator.apiserver import class_view, kube
from ckptdrain.operator.bandwidth import allocation_status, rebalance
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.policy.allocation import DrainingPod
from ckptdrain.operator.records import watchdog
from ckptdrain.sizing import SizingInput, compute
from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import converting_crds

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LOG = logging.getLogger("test")


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """An apiserver with the CRDs and no operator: nothing writes but the test
    (and the conversion webhook: the test writes v1alpha1, v1beta1 is stored)."""
    with apiserver.running(tmp_path_factory.mktemp("quiet-apiserver")) as running, \
            converting_crds(running, [repo_root() / "crds" / "checkpointpolicies.yaml"]):
        apiserver.wait_established(running, "checkpointpolicies.ckptdrain.io")
        yield running


@pytest.fixture
def cluster(quiet: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The quiet apiserver; the operator's API calls, in this process, as its admin."""
    api = config.new_client_from_config(str(quiet.kubeconfig))
    custom = client.CustomObjectsApi(api)
    monkeypatch.setattr(kube, "_custom", lambda: custom)
    monkeypatch.setattr(kube, "_clients", lambda: (client.CoreV1Api(api), custom))
    # No CheckpointClass CRD here: the process's view of classes is current and empty.
    class_view.CLASSES.replace([], "")
    yield quiet
    class_view.CLASSES.replace([], "")


@pytest.fixture
def namespace(quiet: Cluster) -> str:
    name = f"w-{uuid.uuid4().hex[:8]}"
    quiet.kubectl("create", "namespace", name)
    return name


def _read(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", POLICIES, name, "-n", namespace,
                                           "-o", "json").stdout))


def _set_status(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    cluster.kubectl("patch", POLICIES, name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": status}))


def _types(body: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["reason"] for c in (body.get("status") or {}).get("conditions") or []}


def _sized(current: dict[str, Any]) -> dict[str, Any]:
    previous = (current.get("status") or {}).get("conditions") or []
    return st.for_sizing(compute(SizingInput(parameters=1e9, interval_s=900)), 1, NOW,
                         previous, unprotected=[], selected=0)


def test_a_sizing_written_from_an_older_read_keeps_the_sweep_s_condition(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy("p")))
    before = _read(cluster, namespace, "p")
    # The sweep reports an unprotected pod after the sizing pass read the policy.
    unprotected = st.with_unprotected({}, ["bare-0"], 1, NOW)
    assert unprotected is not None
    _set_status(cluster, namespace, "p", unprotected)

    written = policy_reconcile.write_status((namespace, "p"), kopf.Body(before), _sized)

    after = _read(cluster, namespace, "p")
    assert written is not None
    assert _types(after)[st.READY] == st.SIZED
    assert _types(after)[st.UNPROTECTED] == "AdmittedWithoutInjection"
    assert after["status"]["checkpointSize"] == written["checkpointSize"]


def test_a_sizing_of_an_older_spec_is_not_written(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy("p")))
    before = _read(cluster, namespace, "p")
    cluster.kubectl("patch", POLICIES, "p", "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"interval": "30m"}}))

    assert policy_reconcile.write_status((namespace, "p"), kopf.Body(before), _sized) is None
    assert not (_read(cluster, namespace, "p").get("status") or {}).get("conditions")


def test_the_sweep_written_from_an_older_read_keeps_the_sizing_s_ready(
        cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy("p")))
    # The sweep's copy is from before the sizing pass: no conditions at all.
    stale = _read(cluster, namespace, "p")
    _set_status(cluster, namespace, "p", _sized(stale))
    bare = sweep.BarePod("bare-0", "u-bare", {"app": "p"})

    sweep._report_unprotected(namespace, stale, [bare], NOW, LOG)

    after = _types(_read(cluster, namespace, "p"))
    assert after[st.UNPROTECTED] == "AdmittedWithoutInjection"
    assert after[st.READY] == st.SIZED


CFG = OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:test")


def _joint(body: dict[str, Any]) -> tuple[Any, Any, Any]:
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    return rebalance.budgets(CFG, {key: [body]}, {})[key]


def _unprotected_meanwhile(cluster: Cluster, namespace: str) -> None:
    """The sweep's condition, written after the caller's read."""
    current = _read(cluster, namespace, "p")["status"]
    change = st.with_unprotected(current, ["bare-0"], 1, NOW)
    assert change is not None
    _set_status(cluster, namespace, "p", change)


def _sized_then_read_before_the_sweep(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """A sized policy "p" as a writer read it, before the sweep's condition."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy("p")))
    _set_status(cluster, namespace, "p", _sized(_read(cluster, namespace, "p")))
    stale = _read(cluster, namespace, "p")
    _unprotected_meanwhile(cluster, namespace)
    return stale


def test_the_sizing_reconcile_from_an_older_read_keeps_the_sweep_s_condition(
        cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the status write is under test: the passes it schedules stay off.
    monkeypatch.setattr(policy_reconcile.watchdog, "start", lambda *a: None)
    monkeypatch.setattr(policy_reconcile.rebalance, "schedule", lambda *a, **k: None)
    monkeypatch.setattr(policy_reconcile, "schedule_peers", lambda *a, **k: None)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(policy("p")))
    stale = _read(cluster, namespace, "p")
    _set_status(cluster, namespace, "p", {"conditions": []})
    _unprotected_meanwhile(cluster, namespace)
    key = (namespace, "p")

    policy_reconcile.reconcile_policy(
        body=kopf.Body(stale), memo=SimpleNamespace(config=CFG), logger=LOG,  # type: ignore[arg-type]
        pod_index={}, checkpointpolicy_index={key: [stale]}, checkpoint_index={},
        peer_pod_index={}, progress_index={}, announce=False)

    after = _types(_read(cluster, namespace, "p"))
    assert after[st.READY] == st.SIZED
    assert after[st.UNPROTECTED] == "AdmittedWithoutInjection"


def test_the_joint_allocation_from_an_older_read_keeps_the_sweep_s_condition(
        cluster: Cluster, namespace: str) -> None:
    stale = _sized_then_read_before_the_sweep(cluster, namespace)
    sized, share, parsed = _joint(stale)

    allocation_status.write((namespace, "p"), stale, sized, share, parsed, [])

    after = _read(cluster, namespace, "p")
    assert after["status"]["allowedBandwidthBytes"] == int(sized.allowed_bandwidth)
    assert _types(after)[st.UNPROTECTED] == "AdmittedWithoutInjection"
    assert _types(after)[st.READY] == st.SIZED


def test_the_stall_watchdog_from_an_older_read_keeps_the_sweep_s_condition(
        cluster: Cluster, namespace: str) -> None:
    stale = _sized_then_read_before_the_sweep(cluster, namespace)
    drainer = DrainingPod("p-0", 0, created=stale["metadata"]["creationTimestamp"])
    a_day_on = datetime.now(UTC) + timedelta(days=1)  # nothing drained for a day

    watchdog._check_one((namespace, "p"), stale, _joint(stale)[0], [drainer], [], a_day_on)

    after = _read(cluster, namespace, "p")
    assert _types(after)[st.DEGRADED] == "DrainStalled"
    assert _types(after)[st.UNPROTECTED] == "AdmittedWithoutInjection"
