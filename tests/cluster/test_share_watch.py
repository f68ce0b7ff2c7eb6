"""The agent's side of the share channel against a real apiserver: its watch
(agent/share_channel.py) and the share it derives (agent/share.py), with the
CheckpointShare written here by hand, as the operator would, to drive every
case: waiting, admitted, a change, a malformed object, the object deleted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import wait_for
from kubernetes import client, config

from ckptdrain.agent.share import Share, ShareWatcher
from ckptdrain.agent.share_channel import ShareChannel
from ckptdrain.contract import share as sh
from ckptdrain.contract.api import GROUP, VERSION
from support.apiserver import Cluster


def _write(api: client.CustomObjectsApi, namespace: str, **spec: Any) -> None:
    body = sh.body(namespace, sh.Allocation(policy="llama", budget=spec.pop("budget", 900),
                                            drainers=spec.pop("drainers", 3), **spec), None)
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES, body)
    except client.exceptions.ApiException as err:
        if err.status != 409:
            raise
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES, "llama",
                                           {"spec": body["spec"]})


Watched = tuple[ShareChannel, ShareWatcher, list[Share], dict[str, float]]


@pytest.fixture
def custom_api(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))


@pytest.fixture
def watched(cluster: Cluster, crds: None, namespace: str, custom_api: client.CustomObjectsApi,
            tmp_path: Path) -> Iterator[Watched]:
    pending: dict[str, float] = {"bytes": 0, "reported": 0.0}
    applied: list[Share] = []
    fallback = tmp_path / "share"
    fallback.write_text("50")
    watcher = ShareWatcher(fallback, 10.0, applied.append, poll_seconds=0.1)
    channel = ShareChannel(namespace, "llama", rank=1, pod="w-1",
                           pending=lambda: int(pending["bytes"]),
                           reported=lambda: pending["reported"] or None,
                           on_change=watcher.refresh, api=custom_api)
    watcher.attach(channel.view)
    channel.start()
    watcher.start()
    yield channel, watcher, applied, pending
    watcher.stop()
    channel.stop()


def test_an_agent_waits_until_admitted_then_follows_every_change(
        namespace: str, custom_api: client.CustomObjectsApi,
        watched: Watched) -> None:
    channel, watcher, applied, pending = watched
    wait_for(lambda: channel.view().established, what="the watch established")
    assert watcher.current == Share(50.0, "file")  # nothing to drain: the file's
    pending["bytes"], pending["reported"] = 10_000, time.monotonic()
    wait_for(lambda: watcher.current.source == "waiting", what="counted, waiting")
    assert watcher.current.rate == sh.PAUSED_RATE

    _write(custom_api, namespace, drainers=3, active_ranks="0")
    time.sleep(0.5)
    assert watcher.current.source == "waiting"  # rank 0 is admitted, not this one
    _write(custom_api, namespace, drainers=3, active_ranks="0-2", writers=3)
    wait_for(lambda: watcher.current == Share(300.0, "channel"), what="admitted at 900/3")

    _write(custom_api, namespace, drainers=2, active_ranks="1-2")
    wait_for(lambda: watcher.current == Share(450.0, "channel"), what="a drainer left")
    _write(custom_api, namespace, drainers=2, active_ranks="1-2", per_drainer_cap=100)
    wait_for(lambda: watcher.current == Share(100.0, "channel"), what="the cap")

    # Malformed (more admitted than counted): never trusted; the agent waits again.
    _write(custom_api, namespace, drainers=1, active_ranks="0-5")
    wait_for(lambda: watcher.current.source == "waiting", what="a malformed channel refused")

    custom_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES, "llama")
    wait_for(lambda: channel.view().allocation is None, what="the deletion seen")
    assert watcher.current.source == "waiting"
    assert [s.source for s in applied][:2] == ["file", "waiting"]


def test_without_rights_the_agent_keeps_its_file_share(
        cluster: Cluster, crds: None, namespace: str, tmp_path: Path) -> None:
    cluster.kubectl("create", "serviceaccount", "-n", namespace, "nobody")
    nobody = cluster.kubeconfig_for(namespace, "nobody")
    api = client.CustomObjectsApi(config.new_client_from_config(str(nobody)))
    fallback = tmp_path / "share"
    fallback.write_text("50")
    watcher = ShareWatcher(fallback, 10.0, lambda s: None, poll_seconds=0.1)
    channel = ShareChannel(namespace, "llama", rank=0, pod="w-0", pending=lambda: 1,
                           reported=lambda: 0.0, on_change=watcher.refresh, api=api)
    watcher.attach(channel.view)
    channel.start()
    try:
        wait_for(lambda: channel.forbidden, what="the 403 seen")
        watcher.refresh()
        assert watcher.current == Share(50.0, "file")
    finally:
        channel.stop()
