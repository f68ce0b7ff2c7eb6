"""The CSI node driver over real gRPC on unix sockets, as kubelet calls it:
identity, publish and unpublish with real bind mounts, ownership, restarts.
Refusals: test_csi_refusals.py; the command: test_csi_node_command.py.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from tests.support.csi_driver import (
    AS_ROOT_ON_LINUX,
    NAME,
    UID_A,
    UID_A2,
    UID_B,
    Harness,
    mount_options,
    new_pod_uid,
    refused,
    running_driver,
)

from ckptdrain.csi import mounts, server
from ckptdrain.csi.stubs import (
    csi_pb2,
    csi_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

pytestmark = AS_ROOT_ON_LINUX


@pytest.fixture
def harness() -> Iterator[Harness]:
    with running_driver() as h:
        yield h


def test_identity_and_node_info_as_kubelet_reads_them(harness: Harness) -> None:
    info = harness.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert info.name == NAME
    assert info.vendor_version
    caps = harness.identity.GetPluginCapabilities(
        csi_pb2.GetPluginCapabilitiesRequest(), timeout=10)
    assert list(caps.capabilities) == []  # no controller service: volumes are inline
    assert harness.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value is True
    assert harness.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10).node_id == "node-a"
    node_caps = harness.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(),
                                                 timeout=10)
    assert [c.rpc.type for c in node_caps.capabilities] == [
        csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP,
        csi_pb2.NodeServiceCapability.RPC.GET_VOLUME_STATS]


def test_publish_mounts_the_policy_dir_and_twice_is_once(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    assert mounts.is_mount_point(target)
    # No set-uid program or device file a pod wrote works through the volume.
    [options] = mount_options(target)
    assert {"rw", "nosuid", "nodev"} <= options
    (target / "step-1").write_text("weights")
    data = harness.data_of("team-a", UID_A)
    assert (data / "step-1").read_text() == "weights"
    owner = json.loads((data.parent / "owner.json").read_text())
    assert owner == {"namespace": "team-a", "policyUid": UID_A, "policyName": "ckpt",
                     "group": 2000}
    st = os.stat(data)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65532, 2000, 0o2770)
    # kubelet retries a publish whose answer it lost: same answer, no second mount.
    harness.publish(target, "team-a", pod)
    assert len(mount_options(target)) == 1


def test_unpublish_unmounts_keeps_the_data_and_twice_is_once(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    (target / "step-1").write_text("weights")
    harness.unpublish(target, pod)
    assert not mounts.is_mount_point(target)
    assert not target.exists()
    assert (harness.data_of("team-a", UID_A) / "step-1").read_text() == "weights"
    harness.unpublish(target, pod)
    # The next pod of the policy gets the same data back.
    pod2 = new_pod_uid()
    target2 = harness.target(pod2)
    harness.publish(target2, "team-a", pod2)
    assert (target2 / "step-1").read_text() == "weights"


def test_a_read_only_volume_cannot_be_written(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod, readonly=True)
    [options] = mount_options(target)
    assert {"ro", "nosuid", "nodev"} <= options
    with pytest.raises(OSError) as err:
        (target / "step-1").write_text("weights")
    assert err.value.errno == errno.EROFS


def test_a_later_pod_with_another_fs_group_is_mounted_leaving_the_group(
        harness: Harness) -> None:
    # Taking the group over would lock the first pod's trainer out of a 2770
    # directory; each pod's trainer reaches only its own work dir, which
    # restore gives that pod's group (test_csi_work_dir.py).
    harness.policies[("team-a", "ckpt")] = UID_A
    first, second, third = new_pod_uid(), new_pod_uid(), new_pod_uid()
    harness.publish(harness.target(first), "team-a", first, group="2000")
    data = harness.data_of("team-a", UID_A)
    (harness.target(first) / "step-1").write_text("weights")
    for pod, group in ((second, "3000"), (third, "")):
        harness.publish(harness.target(pod), "team-a", pod, group=group)
        assert mounts.is_mount_point(harness.target(pod))
        assert (harness.target(pod) / "step-1").read_text() == "weights"
        assert (os.stat(data).st_gid, stat.S_IMODE(os.stat(data).st_mode)) == (2000, 0o2770)
    assert json.loads((data.parent / "owner.json").read_text())["group"] == 2000


def test_without_an_fs_group_the_data_is_the_agents_group(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod, again = new_pod_uid(), new_pod_uid()
    harness.publish(harness.target(pod), "team-a", pod, group="")
    assert os.stat(harness.data_of("team-a", UID_A)).st_gid == 65532
    # A pod whose fsGroup is the agent's own group shares it.
    harness.publish(harness.target(again), "team-a", again, group="65532")


def test_a_restarted_driver_unpublishes_what_the_last_one_published(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    harness.restart()
    harness.publish(target, "team-a", pod)  # kubelet's retry: still one mount
    assert len(mount_options(target)) == 1
    harness.unpublish(target, pod)
    assert not mounts.is_mount_point(target) and not target.exists()


def test_a_restarted_driver_removes_half_made_policy_dirs(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    harness.publish(harness.target(pod), "team-a", pod)
    # A crash between making a staging dir and renaming it into place.
    staging = harness.cfg.root / "team-a" / ".new-0123abcd"
    (staging / "data").mkdir(parents=True)
    harness.restart()
    assert sorted(p.name for p in (harness.cfg.root / "team-a").iterdir()) == [UID_A]


def test_concurrent_first_publishes_make_one_policy_dir(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pods = [new_pod_uid() for _ in range(8)]
    targets = [harness.target(pod) for pod in pods]
    with ThreadPoolExecutor(len(pods)) as pool:
        list(pool.map(lambda i: harness.publish(targets[i], "team-a", pods[i]),
                      range(len(pods))))
    (targets[0] / "shared").write_text("one dir")
    assert all((t / "shared").read_text() == "one dir" for t in targets)
    assert sorted(p.name for p in (harness.cfg.root / "team-a").iterdir()) == [UID_A]


def test_a_recreated_policy_of_the_same_name_starts_empty(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    (target / "step-1").write_text("old run")
    harness.unpublish(target, pod)
    harness.policies[("team-a", "ckpt")] = UID_A2  # deleted, created again: a new UID
    pod2 = new_pod_uid()
    target2 = harness.target(pod2)
    harness.publish(target2, "team-a", pod2)
    assert list(target2.iterdir()) == []
    assert (harness.data_of("team-a", UID_A) / "step-1").read_text() == "old run"


def test_a_tampered_owner_marker_is_refused_and_says_why(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    harness.unpublish(target, pod)
    marker = harness.data_of("team-a", UID_A).parent / "owner.json"
    marker.write_text(json.dumps({"namespace": "team-b", "policyUid": UID_B,
                                  "policyName": "ckpt"}))
    pod2 = new_pod_uid()
    err = refused(harness.publish, harness.target(pod2), "team-a", pod2)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "owner.json names another owner" in err.details()
    # Who that is goes to the driver's log, not into the tenant's pod events.
    assert UID_B not in err.details() and "team-b" not in err.details()
    assert any(UID_B in r.getMessage() and "team-b" in r.getMessage() for r in caplog.records)
    marker.unlink()
    err = refused(harness.publish, harness.target(pod2), "team-a", pod2)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "owner.json" in err.details()
    assert not mounts.is_mount_point(harness.target(pod2))


def test_registration_answers_get_info_as_kubelet_expects(harness: Harness) -> None:
    # Unix sockets have no other authentication: only root (kubelet) connects.
    for socket in (harness.cfg.registration_socket, harness.cfg.csi_socket):
        assert stat.S_ISSOCK(os.stat(socket).st_mode)
        assert stat.S_IMODE(os.stat(socket).st_mode) == 0o600
    with grpc.insecure_channel(f"unix://{harness.cfg.registration_socket}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint) == (
            "CSIPlugin", NAME, str(harness.cfg.csi_socket))
        assert list(info.supported_versions) == ["1.0.0"]
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10)
        assert harness.driver.registration.registered.is_set()
        assert not harness.driver.registration.failed.is_set()
    # The endpoint kubelet is given answers CSI.
    with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
        name = csi_pb2_grpc.IdentityStub(channel).GetPluginInfo(
            csi_pb2.GetPluginInfoRequest(), timeout=10).name
        assert name == NAME


def test_sockets_are_root_only_from_the_moment_they_exist(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # Made 0600 by the bind itself: a chmod after it would leave a window in
    # which anyone on the node could connect.
    chmods: list[str] = []
    monkeypatch.setattr(server.os, "chmod", lambda path, *a, **k: chmods.append(str(path)))
    harness.restart()
    for socket in (harness.cfg.registration_socket, harness.cfg.csi_socket):
        assert stat.S_IMODE(os.stat(socket).st_mode) == 0o600
        assert str(socket) not in chmods


def test_a_second_driver_on_the_node_leaves_the_first_its_sockets(harness: Harness) -> None:
    # Two drivers of one name on a node (a second release, a surge update,
    # two e2e nodes on one host): the second replacing the first's sockets
    # would take kubelet from it, and its stop would remove the first's
    # (gRPC unlinks a unix socket's path when it stops). It refuses to
    # start, naming the socket, and touches nothing of the first's: its
    # half-made dirs stay too.
    staging = harness.cfg.root / "team-a" / ".new-0123abcd"
    (staging / "data").mkdir(parents=True)
    second = server.Driver(harness.cfg, lambda namespace, name: None)
    with pytest.raises(OSError, match=str(harness.cfg.csi_socket)):
        second.start()
    assert staging.is_dir()
    assert harness.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest()).name == NAME
    assert harness.cfg.registration_socket.is_socket()

