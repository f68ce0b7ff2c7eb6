"""What the CSI node driver refuses, over real gRPC as kubelet calls it:
tenant-written attributes, paths and ids that would reach another tenant's
data or another place on the node, and groups that would hand the data to
the node's own daemons. Nothing refused is made or mounted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.support.csi_driver import (
    AS_ROOT_ON_LINUX,
    UID_A,
    Harness,
    new_pod_uid,
    refused,
    running_driver,
)

from ckptdrain.csi import mounts

pytestmark = AS_ROOT_ON_LINUX


@pytest.fixture
def harness() -> Iterator[Harness]:
    with running_driver() as h:
        yield h


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
    assert not mounts.is_mount_point(target)
    assert not (harness.cfg.root / "team-b").exists()


def test_pod_info_a_tenant_writes_itself_does_not_match_kubelets_target(
        harness: Harness) -> None:
    # Were podInfoOnMount off, kubelet would pass the tenant's own
    # csi.storage.k8s.io/* attributes. A tenant in team-a claims team-b's
    # namespace; it cannot know its new pod's uid (the apiserver makes it
    # after the spec is written), so it makes one up: kubelet's target path
    # names the real pod, and the two do not match.
    harness.policies[("team-b", "ckpt")] = UID_A
    real_pod, made_up = new_pod_uid(), new_pod_uid()
    target = harness.target(real_pod)
    err = refused(harness.publish, target, "team-b", made_up)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "target_path" in err.details() and made_up in err.details()
    assert not mounts.is_mount_point(target)
    assert not (harness.cfg.root / "team-b").exists()


@pytest.mark.parametrize("group", ["0", "999"])
def test_root_and_system_groups_never_get_the_data(harness: Harness, group: str) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    pod = new_pod_uid()
    err = refused(harness.publish, harness.target(pod), "team-a", pod, group=group)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "volume_mount_group" in err.details() and "from 1000 to" in err.details()
    assert not (harness.cfg.root / "team-a").exists()


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
