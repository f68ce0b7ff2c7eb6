"""The CSI driver's collection and usage with a real apiserver (the
driver's own ServiceAccount, `get` only) and real bind mounts, as root: a
deleted policy's node data goes within the grace period and a scan
interval; Retain keeps it; a published volume is never deleted; an
unknown owner is reported and kept; NodeGetVolumeStats and /metrics report
what was written."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.request
import uuid
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import pytest
from cluster_helpers import POLICIES, create, policy, wait_for
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim
from ckptdrain.csi.collector import DELETED_SINCE_FILE
from ckptdrain.csi.policies import apiserver_resolver
from ckptdrain.csi.stubs import csi_pb2
from support.apiserver import Cluster
from support.csi_driver import (
    AS_ROOT_ON_LINUX,
    Harness,
    new_pod_uid,
    refused,
    running_driver,
)

pytestmark = AS_ROOT_ON_LINUX

GRACE_S = 1.0
INTERVAL_S = 0.5
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(h: Harness) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{h.cfg.metrics_port}/metrics", timeout=10).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def dirs(h: Harness, state: str) -> float:
    return scrape(h)[("ckptdrain_csi_policy_dirs", (("state", state),))]


def make_policy(cluster: Cluster, namespace: str, name: str) -> str:
    made = create(cluster, namespace, policy(name))
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["metadata"]["uid"])


def delete_policy(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.kubectl("delete", "-n", namespace, POLICIES, name)


def driver(api: client.CustomObjectsApi, reclaim: str) -> AbstractContextManager[Harness]:
    """The driver as its DaemonSet runs it, with a grace and scan interval short
    enough to watch."""
    return running_driver(apiserver_resolver(api), reclaim=Reclaim(reclaim, GRACE_S),
                          scan_interval_s=INTERVAL_S, metrics_port=free_port())


def publish_and_write(h: Harness, namespace: str, size: int) -> tuple[Path, str]:
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, namespace, pod)
    (target / "step-1.bin").write_bytes(b"x" * size)
    return target, pod


def test_a_deleted_policys_data_goes_within_the_grace_and_an_interval(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    uid = make_policy(cluster, namespace, "ckpt")
    with driver(driver_api, DELETE) as h:
        target, pod = publish_and_write(h, namespace, 3 * MIB)
        stats = h.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(
            volume_id=f"csi-{pod.replace('-', '')}", volume_path=str(target)), timeout=10)
        by_unit = {u.unit: u for u in stats.usage}
        in_bytes = by_unit[csi_pb2.VolumeUsage.BYTES]
        assert 3 * MIB <= in_bytes.used < 4 * MIB
        assert 0 < in_bytes.available <= in_bytes.total
        assert by_unit[csi_pb2.VolumeUsage.INODES].used >= 2  # the data dir and the file
        policy_labels = (("namespace", namespace), ("policy", "ckpt"), ("uid", uid))
        used = wait_for(lambda: scrape(h).get(("ckptdrain_csi_policy_used_bytes",
                                               policy_labels)), what="usage metric")
        assert 3 * MIB <= used < 4 * MIB
        assert scrape(h)[("ckptdrain_csi_filesystem_available_bytes", ())] > 0
        h.unpublish(target, pod)
        directory = h.cfg.root / namespace / uid
        assert directory.is_dir()  # unpublished, the data stays while its policy lives

        delete_policy(cluster, namespace, "ckpt")
        deleted_at = time.monotonic()
        wait_for(lambda: not directory.exists(), timeout_s=30, what="node data deleted")
        took = time.monotonic() - deleted_at
        # The first scan to see the policy gone starts the clock, the first
        # one a grace later deletes: at most the grace and two intervals.
        assert GRACE_S <= took <= GRACE_S + 2 * INTERVAL_S + 1.5, took
        logging.getLogger(__name__).warning("node data of a deleted policy gone after %.2f s "
                                            "(grace %s s, interval %s s)", took, GRACE_S,
                                            INTERVAL_S)
        assert scrape(h)[("ckptdrain_csi_deletions_total", ())] == 1
        assert ("ckptdrain_csi_policy_used_bytes", policy_labels) not in scrape(h)
        assert not list((h.cfg.root / ".trash").iterdir())


def test_a_policy_created_again_under_its_name_frees_the_old_data(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    old = make_policy(cluster, namespace, "ckpt")
    with driver(driver_api, DELETE) as h:
        target, pod = publish_and_write(h, namespace, MIB)
        h.unpublish(target, pod)
        delete_policy(cluster, namespace, "ckpt")
        new = make_policy(cluster, namespace, "ckpt")
        wait_for(lambda: not (h.cfg.root / namespace / old).exists(), timeout_s=30,
                 what="the old uid's data deleted")
        target, pod = publish_and_write(h, namespace, MIB)
        time.sleep(GRACE_S + 3 * INTERVAL_S)
        assert (h.cfg.root / namespace / new / "data" / "step-1.bin").is_file()
        h.unpublish(target, pod)


def test_a_published_volume_is_never_deleted_under_it(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    uid = make_policy(cluster, namespace, "ckpt")
    with driver(driver_api, DELETE) as h:
        target, pod = publish_and_write(h, namespace, MIB)
        delete_policy(cluster, namespace, "ckpt")
        directory = h.cfg.root / namespace / uid
        wait_for(lambda: (directory / DELETED_SINCE_FILE).is_file(), what="clock started")
        time.sleep(GRACE_S + 4 * INTERVAL_S)
        assert (target / "step-1.bin").read_bytes() == b"x" * MIB  # the pod still reads it
        assert dirs(h, "pending_deletion") == 1
        h.unpublish(target, pod)
        wait_for(lambda: not directory.exists(), timeout_s=30, what="deleted once unpublished")


#: A version of the group the CRD does not serve.
UNSERVED = "v1beta9"


def test_an_unserved_api_version_deletes_nothing_and_publishes_nothing(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    """The driver reading a version the CRD does not serve (as after a CRD
    upgrade that stops serving the driver's): the apiserver answers `404 page not found` for
    every policy. That is no sighting of a deleted policy: the data stays
    past the grace, and a publish waits (UNAVAILABLE, kubelet retries)
    instead of failing the pod for good (NOT_FOUND)."""
    uid = make_policy(cluster, namespace, "ckpt")
    with driver(driver_api, DELETE) as h:
        target, pod = publish_and_write(h, namespace, MIB)
        h.unpublish(target, pod)
        h.resolve = apiserver_resolver(driver_api, version=UNSERVED)
        h.restart()
        directory = h.cfg.root / namespace / uid
        time.sleep(GRACE_S + 2 * INTERVAL_S + 1)
        assert (directory / "data" / "step-1.bin").read_bytes() == b"x" * MIB
        assert not (directory / DELETED_SINCE_FILE).exists()  # no clock started
        assert dirs(h, "live") == 1
        assert scrape(h)[("ckptdrain_csi_deletions_total", ())] == 0
        pod = new_pod_uid()
        err = refused(h.publish, h.target(pod), namespace, pod)
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
        assert f"{UNSERVED} served?" in (err.details() or "")


def test_retain_keeps_the_data_and_reports_it_across_a_restart(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi) -> None:
    uid = make_policy(cluster, namespace, "ckpt")
    with driver(driver_api, RETAIN) as h:
        target, pod = publish_and_write(h, namespace, MIB)
        h.unpublish(target, pod)
        delete_policy(cluster, namespace, "ckpt")
        directory = h.cfg.root / namespace / uid
        marker = directory / DELETED_SINCE_FILE
        wait_for(lambda: marker.is_file(), what="clock started")
        since = json.loads(marker.read_text())["since"]
        wait_for(lambda: dirs(h, "retained") == 1, what="reported retained")
        h.restart()
        time.sleep(GRACE_S + 4 * INTERVAL_S)
        # The restarted driver read the time the owner was first seen gone.
        assert json.loads(marker.read_text())["since"] == since
        assert (directory / "data" / "step-1.bin").read_bytes() == b"x" * MIB
        assert dirs(h, "retained") == 1
        assert scrape(h)[("ckptdrain_csi_deletions_total", ())] == 0


def test_unknown_owners_are_reported_once_and_kept(
        cluster: Cluster, namespace: str, driver_api: client.CustomObjectsApi,
        caplog: pytest.LogCaptureFixture) -> None:
    with driver(driver_api, DELETE) as h:
        without = h.cfg.root / namespace / str(uuid.uuid4())
        (without / "data").mkdir(parents=True)
        (without / "data" / "found.bin").write_bytes(b"y")
        elsewhere = h.cfg.root / namespace / str(uuid.uuid4())
        elsewhere.mkdir()
        # A marker naming another directory: not this one's owner.
        (elsewhere / "owner.json").write_text(json.dumps(
            {"namespace": namespace, "policyUid": str(uuid.uuid4()), "policyName": "x"}))
        with caplog.at_level(logging.WARNING, logger="ckptdrain.csi.collector"):
            wait_for(lambda: dirs(h, "unknown_owner") == 2, what="unknown owners reported")
            time.sleep(GRACE_S + 4 * INTERVAL_S)
        assert (without / "data" / "found.bin").read_bytes() == b"y"
        assert elsewhere.is_dir()
        assert dirs(h, "unknown_owner") == 2
        warnings = [r.getMessage() for r in caplog.records if "unknown owner" in r.getMessage()]
        assert sorted(w.split(":")[0] for w in warnings) == sorted([str(without),
                                                                     str(elsewhere)])
