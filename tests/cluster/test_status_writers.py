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
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from cluster_helpers import POLICIES, policy
from kubernetes import client, config
from operator_process import repo_root

from ckptdrain.operator import policy_reconcile
from ckptdrain.operator.admission import sweep
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import status as st
from ckptdrain.sizing import SizingInput, compute
from support import apiserver
from support.apiserver import Cluster

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LOG = logging.getLogger("test")


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """An apiserver with the CRDs and no operator: nothing writes but the test."""
    with apiserver.running(tmp_path_factory.mktemp("quiet-apiserver")) as running:
        crds = repo_root() / "crds"
        running.kubectl("apply", "-f", str(crds / "checkpointpolicies.yaml"))
        apiserver.wait_established(running, "checkpointpolicies.ckptdrain.io")
        yield running


@pytest.fixture
def cluster(quiet: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The quiet apiserver; the operator's API calls, in this process, as its admin."""
    api = config.new_client_from_config(str(quiet.kubeconfig))
    custom = client.CustomObjectsApi(api)
    monkeypatch.setattr(kube, "_custom", lambda: custom)
    monkeypatch.setattr(kube, "_clients", lambda: (client.CoreV1Api(api), custom))
    yield quiet


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
