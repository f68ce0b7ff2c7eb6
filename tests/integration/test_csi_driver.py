"""The CSI node driver over real gRPC on unix sockets, as kubelet calls it.

The client side uses the stubs generated from the CSI and kubelet protos, so
these calls are the real protocol. Volumes are real bind mounts (the tests
run as root, as the driver does); the policy lookup is a dict standing in
for the apiserver (tests/cluster covers the real lookup).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import grpc
import pytest

from ckptdrain.csi import mounts
from ckptdrain.csi.config import DriverConfig
from ckptdrain.csi.server import Driver
from ckptdrain.csi.stubs import (
    csi_pb2,
    csi_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="the driver bind-mounts volumes: Linux, as root (as its DaemonSet pod runs)")

NAME = "node.ckptdrain.io"
UID_A = "11111111-1111-4111-8111-111111111111"
UID_A2 = "22222222-2222-4222-8222-222222222222"
UID_B = "33333333-3333-4333-8333-333333333333"


@dataclass
class Harness:
    cfg: DriverConfig
    driver: Driver
    policies: dict[tuple[str, str], str]
    node: csi_pb2_grpc.NodeStub
    identity: csi_pb2_grpc.IdentityStub
    targets: list[Path] = field(default_factory=list)

    def target(self, pod_uid: str, volume: str = "ckptdrain-local") -> Path:
        """kubelet's mount dir for a pod's CSI volume, its parent made as kubelet does."""
        parent = Path(self.cfg.pods_dir) / pod_uid / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        self.targets.append(parent / "mount")
        return parent / "mount"

    def publish(self, target: Path, namespace: str, pod_uid: str, policy: str | None = "ckpt",
                volume_id: str | None = None, group: str = "2000",
                extra: dict[str, str] | None = None, readonly: bool = False
                ) -> csi_pb2.NodePublishVolumeResponse:
        context = {"csi.storage.k8s.io/ephemeral": "true",
                   "csi.storage.k8s.io/pod.namespace": namespace,
                   "csi.storage.k8s.io/pod.name": "trainer-0",
                   "csi.storage.k8s.io/pod.uid": pod_uid,
                   "csi.storage.k8s.io/serviceAccount.name": "default"}
        if policy is not None:
            context["policy"] = policy
        context.update(extra or {})
        return self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id_of(pod_uid) if volume_id is None else volume_id,
            target_path=str(target),
            volume_capability=csi_pb2.VolumeCapability(
                mount=csi_pb2.VolumeCapability.MountVolume(volume_mount_group=group),
                access_mode=csi_pb2.VolumeCapability.AccessMode(
                    mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)),
            readonly=readonly, volume_context=context), timeout=10)

    def unpublish(self, target: Path, pod_uid: str) -> None:
        self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=volume_id_of(pod_uid), target_path=str(target)), timeout=10)

    def data_of(self, namespace: str, policy_uid: str) -> Path:
        return self.cfg.root / namespace / policy_uid / "data"


def volume_id_of(pod_uid: str) -> str:
    # kubelet's inline volume ids are csi-<sha256 hex>; any stable id will do.
    return f"csi-{pod_uid.replace('-', '')}"


def new_pod_uid() -> str:
    return str(uuid.uuid4())


def is_mounted(path: Path) -> bool:
    return mounts.is_mount_point(path)


def mount_count(path: Path) -> int:
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return sum(1 for line in info if line.split()[4] == str(path))


@pytest.fixture
def harness() -> Iterator[Harness]:
    # Unix socket paths are limited to 108 bytes: a short directory of our own.
    base = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    cfg = DriverConfig(
        name=NAME, node_id="node-a", root=base / "root", pods_dir=PurePosixPath(base / "pods"),
        csi_socket=base / "plugins" / NAME / "csi.sock",
        registration_socket=base / "registry" / f"{NAME}-reg.sock", owner_uid=65532)
    policies: dict[tuple[str, str], str] = {}
    driver = Driver(cfg, lambda namespace, name: policies.get((namespace, name)))
    driver.start()
    channel = grpc.insecure_channel(f"unix://{cfg.csi_socket}")
    h = Harness(cfg, driver, policies, csi_pb2_grpc.NodeStub(channel),
                csi_pb2_grpc.IdentityStub(channel))
    try:
        yield h
    finally:
        channel.close()
        h.driver.stop(grace_s=1)
        for target in h.targets:
            while is_mounted(target):
                mounts.unmount(target)
        shutil.rmtree(base)


def refused(call: Callable[..., object], *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


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
        csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP]


def test_publish_mounts_the_policy_dir_and_twice_is_once(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    assert is_mounted(target)
    (target / "step-1").write_text("weights")
    data = harness.data_of("team-a", UID_A)
    assert (data / "step-1").read_text() == "weights"
    owner = json.loads((data.parent / "owner.json").read_text())
    assert owner == {"namespace": "team-a", "policyUid": UID_A, "policyName": "ckpt"}
    st = os.stat(data)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65532, 2000, 0o2770)
    # kubelet retries a publish whose answer it lost: same answer, no second mount.
    harness.publish(target, "team-a", pod)
    assert mount_count(target) == 1


def test_unpublish_unmounts_keeps_the_data_and_twice_is_once(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    (target / "step-1").write_text("weights")
    harness.unpublish(target, pod)
    assert not is_mounted(target)
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
    with pytest.raises(OSError) as err:
        (target / "step-1").write_text("weights")
    assert err.value.errno == errno.EROFS


def test_a_restarted_driver_unpublishes_what_the_last_one_published(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod)
    harness.driver.stop(grace_s=1)
    # A new process (the DaemonSet's pod restarted) on the same sockets and root.
    harness.driver = Driver(harness.cfg, lambda ns, name: harness.policies.get((ns, name)))
    harness.driver.start()
    harness.publish(target, "team-a", pod)  # kubelet's retry: still one mount
    assert mount_count(target) == 1
    harness.unpublish(target, pod)
    assert not is_mounted(target) and not target.exists()


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
    assert not is_mounted(harness.target(pod2))


@pytest.mark.parametrize(("attributes", "code", "says"), [
    ({"policy": "../team-a/ckpt"}, grpc.StatusCode.INVALID_ARGUMENT, "volumeAttributes.policy"),
    ({"policy": "/var/lib/ckptdrain"}, grpc.StatusCode.INVALID_ARGUMENT,
     "volumeAttributes.policy"),
    ({"policy": ""}, grpc.StatusCode.INVALID_ARGUMENT, "volumeAttributes.policy"),
    ({"policy": "ckpt", "path": "/"}, grpc.StatusCode.INVALID_ARGUMENT, "'path'"),
    ({"policy": "ckpt", "namespace": "team-a"}, grpc.StatusCode.INVALID_ARGUMENT,
     "'namespace'"),
    # team-a's policy name, asked for from team-b: looked up in team-b only.
    ({"policy": "ckpt"}, grpc.StatusCode.NOT_FOUND, "namespace 'team-b'"),
])
def test_hostile_attributes_are_refused(harness: Harness, attributes: dict[str, str],
                                        code: grpc.StatusCode, says: str) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = harness.target(pod)
    policy = attributes.pop("policy")
    err = refused(harness.publish, target, "team-b", pod, policy=policy, extra=attributes)
    assert err.code() == code
    assert says in err.details()
    assert not is_mounted(target)
    assert not (harness.cfg.root / "team-b").exists()


def test_hostile_paths_and_ids_are_refused(harness: Harness, tmp_path: Path) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    pods = Path(harness.cfg.pods_dir)
    other_pod = new_pod_uid()
    for target in (Path("/etc/ckptdrain-mount"),
                   pods / pod / "volumes" / "kubernetes.io~csi" / ".." / ".." / "mount",
                   pods / pod / "volumes" / "kubernetes.io~csi" / "v" / "mount" / "deeper",
                   harness.target(other_pod)):  # another pod's volume
        err = refused(harness.publish, Path(str(target)), "team-a", pod)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, target
        assert "target_path" in err.details()
    for volume_id in ("../../etc", "a/b", ""):
        err = refused(harness.publish, harness.target(pod), "team-a", pod, volume_id=volume_id)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "volume_id" in err.details()
    # A link in kubelet's dir must not send the mount elsewhere on the node.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = pods / pod / "volumes" / "kubernetes.io~csi" / "linked"
    linked.symlink_to(elsewhere)
    err = refused(harness.publish, linked / "mount", "team-a", pod)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not (elsewhere / "mount").exists()
    # Not an inline volume, or no pod info: refused, saying what is missing.
    err = refused(harness.publish, harness.target(pod), "team-a", pod,
                  extra={"csi.storage.k8s.io/ephemeral": "false"})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "ephemeral" in err.details()
    err = refused(harness.publish, harness.target(pod), "team-a", pod,
                  extra={"csi.storage.k8s.io/pod.namespace": ""})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "podInfoOnMount" in err.details()
    assert not (harness.cfg.root / "team-a").exists()


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


def csi_node(base: Path, *flags: str, kubeconfig: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "ckptdrain", "csi-node", "--node-id", "node-a",
            "--root", str(base / "root"), "--pods-dir", str(base / "pods"),
            "--csi-socket", str(base / "plugins" / "csi.sock"),
            "--registration-socket", str(base / "registry" / f"{NAME}-reg.sock"), *flags]


def command_env(base: Path) -> dict[str, str]:
    """This interpreter's imports; a kubeconfig naming an apiserver that is
    never called (no volume is published here)."""
    kubeconfig = base / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "never-used"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
            "KUBECONFIG": str(kubeconfig)}


def test_csi_node_command_refuses_a_bad_start_in_one_line(tmp_path: Path) -> None:
    env = command_env(tmp_path)
    (tmp_path / "real-pods").mkdir()
    (tmp_path / "pods").symlink_to(tmp_path / "real-pods")
    for argv, env_, says in (
            (csi_node(tmp_path), env, "--pods-dir"),
            (csi_node(tmp_path, "--node-id", ""), env, "--node-id"),
            (csi_node(tmp_path, "--name", "Node_CkptDrain"), env, "--name"),
            (csi_node(tmp_path, "--pods-dir", str(tmp_path / "real-pods")),
             {**env, "KUBECONFIG": str(tmp_path / "absent")}, "apiserver credentials: expected")):
        done = subprocess.run(argv, env=env_, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("ckptdrain csi-node: ") and says in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def test_csi_node_command_exits_non_zero_when_kubelet_refuses_it() -> None:
    base = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    registration = base / "registry" / f"{NAME}-reg.sock"
    proc = subprocess.Popen(csi_node(base), env=command_env(base), stderr=subprocess.PIPE,
                            text=True)
    try:
        with grpc.insecure_channel(f"unix://{registration}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            assert stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10).name == NAME
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=False, error="version 0.3 not supported"), timeout=10)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert "kubelet did not register node.ckptdrain.io: version 0.3 not supported" in stderr
        assert not registration.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base)
