"""Reclaim per CheckpointClass with a real apiserver (the driver's own
ServiceAccount, bound to the rules docs/csi-driver.md shows) and real bind
mounts, as root: each policy's node data goes, or stays, as its class said
while the policy was there; a class the driver cannot read (refused, or
deleted before its policy) leaves the recorded value in force."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import POLICIES, create, policy, wait_for
from kubernetes import client, config

from ckptdrain.csi import class_reclaim
from ckptdrain.csi.class_reclaim import RECLAIM_FILE
from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim, Recorded, Verdict
from ckptdrain.csi.policies import apiserver_classes, apiserver_resolver
from support.apiserver import Cluster
from support.csi_driver import AS_ROOT_ON_LINUX, Harness, new_pod_uid, running_driver

pytestmark = AS_ROOT_ON_LINUX

GRACE_S = 1.0
INTERVAL_S = 0.5
#: The driver's own setting: nothing in these tests may fall to it unseen.
DRIVER = Reclaim(DELETE, 3600.0)


@pytest.fixture
def classes(cluster: Cluster) -> Iterator[dict[str, str]]:
    """Two classes, by role: research (Delete after GRACE_S) and prod
    (Retain), under names of this test's own."""
    suffix = uuid.uuid4().hex[:6]
    names = {"research": f"research-{suffix}", "prod": f"prod-{suffix}"}
    for role, reclaim in (("research", {"policy": "Delete", "gracePeriod": f"{GRACE_S:g}s"}),
                          ("prod", {"policy": "Retain"})):
        apply_class(cluster, names[role], reclaim)
    try:
        yield names
    finally:
        cluster.kubectl("delete", "checkpointclasses", *names.values(), "--ignore-not-found",
                        check=False)


def apply_class(cluster: Cluster, name: str, reclaim: dict[str, Any]) -> None:
    body = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": name},
            "spec": {"nodeTier": {"root": "/mnt/ckptdrain", "reclaim": reclaim}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))


def make_policy(cluster: Cluster, namespace: str, name: str, class_name: str) -> str:
    made = create(cluster, namespace, policy(name, checkpointClassName=class_name))
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["metadata"]["uid"])


def write_data(h: Harness, namespace: str, name: str) -> None:
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, namespace, pod, policy=name)
    (target / "step-1.bin").write_bytes(b"x" * 1024)
    h.unpublish(target, pod)


@contextlib.contextmanager
def both_policies_driven(cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi,
                         classes: dict[str, str]) -> Iterator[tuple[Harness, str, str]]:
    """A policy of each class, the driver running as its own ServiceAccount
    and each policy's data written: (the driver, research's uid, prod's)."""
    research = make_policy(cluster, namespace, "research", classes["research"])
    prod = make_policy(cluster, namespace, "prod", classes["prod"])
    with running_driver(apiserver_resolver(driver_api), apiserver_classes(driver_api),
                        reclaim=DRIVER, scan_interval_s=INTERVAL_S) as h:
        write_data(h, namespace, "research")
        write_data(h, namespace, "prod")
        yield h, research, prod


def recorded(h: Harness, namespace: str, uid: str) -> Recorded | None:
    try:
        return class_reclaim.loads((h.cfg.root / namespace / uid / RECLAIM_FILE).read_text())
    except FileNotFoundError:
        return None


def test_each_class_decides_its_policys_data_once_the_policy_is_deleted(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi,
        classes: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with both_policies_driven(cluster, namespace, driver_api, classes) as (h, research, prod):
        wait_for(lambda: recorded(h, namespace, research) == Recorded(
            classes["research"], DELETE, GRACE_S), what="research's reclaim recorded")
        wait_for(lambda: recorded(h, namespace, prod) == Recorded(classes["prod"], RETAIN),
                 what="prod's reclaim recorded")
        caplog.set_level(logging.INFO, logger="ckptdrain.csi.collector")
        cluster.kubectl("delete", "-n", namespace, POLICIES, "research", "prod")
        research_dir, prod_dir = (h.cfg.root / namespace / uid for uid in (research, prod))
        wait_for(lambda: not research_dir.exists(), timeout_s=30, what="research's data deleted")
        wait_for(lambda: retained(h) == ["prod"], what="prod's data reported retained")
        time.sleep(GRACE_S + 2 * INTERVAL_S)
        assert (prod_dir / "data" / "step-1.bin").is_file()
        assert f"reclaim Delete from class {classes['research']}" in caplog.text
        assert f"kept (reclaim Retain) (reclaim from class {classes['prod']})" in caplog.text


def retained(h: Harness) -> list[str]:
    report = h.driver.collector.report
    return [] if report is None else [p.policy_name for p in report.policies
                                      if p.verdict is Verdict.RETAINED]


@pytest.fixture
def refusing_api(cluster: Cluster, crds: None,
                 namespace: str) -> Iterator[client.CustomObjectsApi]:
    """A ServiceAccount that may get policies but not list classes: every
    class LIST is a 403."""
    name = f"csi-noclass-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    cluster.kubectl("create", "clusterrole", name, "--verb=get",
                    "--resource=checkpointpolicies.ckptdrain.io")
    cluster.kubectl("create", "clusterrolebinding", name, f"--clusterrole={name}",
                    f"--serviceaccount={namespace}:{name}")
    try:
        yield client.CustomObjectsApi(config.new_client_from_config(
            str(cluster.kubeconfig_for(namespace, name))))
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", name, check=False)


def test_a_class_the_driver_cannot_read_leaves_the_recorded_reclaim(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi,
        refusing_api: client.CustomObjectsApi, classes: dict[str, str]) -> None:
    with both_policies_driven(cluster, namespace, driver_api, classes) as (h, research, prod):
        wait_for(lambda: recorded(h, namespace, research) is not None
                 and recorded(h, namespace, prod) is not None, what="both recorded")
        # prod's class is deleted before its policy: its Retain holds.
        cluster.kubectl("delete", "checkpointclasses", classes["prod"])
        time.sleep(3 * INTERVAL_S)
        assert recorded(h, namespace, prod) == Recorded(classes["prod"], RETAIN)
        # research's class now says Retain, but the driver may not list
        # classes (a 403): it cannot know, so Delete, as recorded, holds.
        h.list_classes = apiserver_classes(refusing_api)
        h.restart()
        apply_class(cluster, classes["research"], {"policy": "Retain"})
        time.sleep(3 * INTERVAL_S)
        assert recorded(h, namespace, research) == Recorded(classes["research"], DELETE,
                                                            GRACE_S)
        cluster.kubectl("delete", "-n", namespace, POLICIES, "research", "prod")
        wait_for(lambda: not (h.cfg.root / namespace / research).exists(), timeout_s=30,
                 what="research's data deleted as recorded")
        time.sleep(GRACE_S + 2 * INTERVAL_S)
        assert (h.cfg.root / namespace / prod / "data" / "step-1.bin").is_file()


def test_a_class_the_driver_never_listed_holds_its_policys_data(
        cluster: Cluster, namespace: str, refusing_api: client.CustomObjectsApi,
        classes: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """The class LIST refused from the first scan: the record names the
    class alone, and once the policy is deleted its data is held, though
    the driver's own setting would delete it after GRACE_S."""
    uid = make_policy(cluster, namespace, "research", classes["research"])
    caplog.set_level(logging.WARNING, logger="ckptdrain.csi.collector")
    with running_driver(apiserver_resolver(refusing_api), apiserver_classes(refusing_api),
                        reclaim=Reclaim(DELETE, GRACE_S), scan_interval_s=INTERVAL_S) as h:
        write_data(h, namespace, "research")
        wait_for(lambda: recorded(h, namespace, uid) == Recorded(classes["research"],
                                                                  known=False),
                 what="the class recorded by name, its reclaim unknown")
        assert "listing CheckpointClasses from the apiserver: HTTP 403" in caplog.text
        cluster.kubectl("delete", "-n", namespace, POLICIES, "research")
        wait_for(lambda: retained(h) == ["research"], what="the data held")
        time.sleep(GRACE_S + 3 * INTERVAL_S)
        assert (h.cfg.root / namespace / uid / "data" / "step-1.bin").is_file()
        assert h.driver.collector.report is not None
        assert h.driver.collector.report.held_records == 1
        assert "its reclaim never read: held" in caplog.text
