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


def _write_scale(api: client.CustomObjectsApi, namespace: str, factor: float) -> None:
    body = sh.scale_body(namespace, sh.scale_spec(factor, None))
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES, body)
    except client.exceptions.ApiException as err:
        if err.status != 409:
            raise
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES,
                                           sh.SCALE_NAME, {"spec": body["spec"]})


def test_an_agent_takes_a_smaller_cluster_scale_from_one_write_and_never_a_larger_one(
        namespace: str, custom_api: client.CustomObjectsApi,
        watched: Watched) -> None:
    _, watcher, _, pending = watched
    assert watcher.path is not None
    watcher.path.write_text("1000000")  # a fallback far above: only the channel limits
    pending["bytes"], pending["reported"] = 10_000, time.monotonic()
    _write_scale(custom_api, namespace, 1.0)
    _write(custom_api, namespace, budget=900, wanted=900, drainers=3, active_ranks="0-2",
           writers=3)
    wait_for(lambda: watcher.current == Share(300.0, "channel"), what="admitted at 900/3")
    version = custom_api.get_namespaced_custom_object(
        GROUP, VERSION, namespace, sh.SHARES, "llama")["metadata"]["resourceVersion"]

    _write_scale(custom_api, namespace, 0.5)  # a new job under the cap: one write
    wait_for(lambda: watcher.current == Share(150.0, "channel"), what="half, from the scale")
    assert custom_api.get_namespaced_custom_object(
        GROUP, VERSION, namespace, sh.SHARES, "llama")["metadata"]["resourceVersion"] == version
    _write_scale(custom_api, namespace, 1.0)  # back up to what the channel says, no further
    wait_for(lambda: watcher.current == Share(300.0, "channel"), what="the channel's budget")
    # A channel published under a factor of 0.5: a larger scale (stale, edited by
    # hand) never raises it; growth is the channel's to say.
    _write(custom_api, namespace, budget=450, wanted=900, drainers=3, active_ranks="0-2",
           writers=3)
    wait_for(lambda: watcher.current == Share(150.0, "channel"), what="the channel's 450")
    time.sleep(0.5)
    assert watcher.current == Share(150.0, "channel")

    # The scale goes down to 0.2, then is deleted under a channel that leaves
    # shrinks to it: not current, and its last factor still holds the share
    # (900 x 0.2 / 3), never the channel's 450 / 3.
    _write_scale(custom_api, namespace, 0.2)
    wait_for(lambda: watcher.current == Share(60.0, "channel"), what="a fifth, from the scale")
    custom_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, sh.SHARES,
                                               sh.SCALE_NAME)
    wait_for(lambda: watcher.current.problem is not None, what="not current without its scale")
    assert watcher.current.rate == 60.0
    _write_scale(custom_api, namespace, 0.5)
    wait_for(lambda: watcher.current == Share(150.0, "channel"), what="current again")
