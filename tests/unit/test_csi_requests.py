"""The CSI driver's request checks (csi/requests.py) and mountinfo reading:
what kubelet and the tenant send becomes a path only in the one shape
expected, whatever the input."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.csi.mounts import mount_points
from ckptdrain.csi.requests import (
    EPHEMERAL,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    SERVICE_ACCOUNT_TOKENS,
    Refused,
    check_target,
    publish_request,
)

PODS = PurePosixPath("/var/lib/kubelet/pods")
POD = "0f0e0d0c-0b0a-4908-8706-050403020100"
TARGET = f"{PODS}/{POD}/volumes/kubernetes.io~csi/ckptdrain-local/mount"


def context(**tenant: str) -> dict[str, str]:
    return {EPHEMERAL: "true", POD_NAMESPACE: "team-a", POD_NAME: "trainer-0",
            POD_UID: POD, **tenant}


def test_a_kubelet_request_becomes_a_typed_one() -> None:
    req = publish_request("csi-0a1b", TARGET, context(policy="llama.ckpt"), False, "2000", PODS)
    assert (req.namespace, req.policy_name, req.pod_uid, req.mount_group) == (
        "team-a", "llama.ckpt", POD, 2000)
    assert req.target_path == PurePosixPath(TARGET)
    assert publish_request("csi-0a1b", TARGET, context(policy="p"), True, "", PODS
                           ).mount_group is None


def test_service_account_tokens_are_accepted_and_never_echoed() -> None:
    secret = "eyJhbGciOiJSUzI1NiJ9.secret-token"
    req = publish_request("csi-0a1b", TARGET,
                          context(policy="p", **{SERVICE_ACCOUNT_TOKENS: secret}), False, "",
                          PODS)
    assert secret not in repr(req)
    with pytest.raises(Refused) as refused:
        publish_request("csi-0a1b", TARGET, context(
            policy="../p", **{SERVICE_ACCOUNT_TOKENS: secret}), False, "", PODS)
    assert secret not in refused.value.message


@pytest.mark.parametrize(("ctx", "says"), [
    ({**context(policy="p"), "namespace": "team-b"}, "volumeAttributes['namespace']"),
    ({**context(policy="p"), POD_NAMESPACE: "../team-b"}, POD_NAMESPACE),
    ({**context(policy="p"), POD_NAMESPACE: "Team-B"}, POD_NAMESPACE),
    ({**context(policy="p"), POD_UID: "../../x"}, POD_UID),
    ({**context(policy="p"), EPHEMERAL: "false"}, "ephemeral inline volumes only"),
    (context(), "volumeAttributes.policy"),
])
def test_bad_context_is_refused_naming_the_field(ctx: dict[str, str], says: str) -> None:
    with pytest.raises(Refused) as refused:
        publish_request("csi-0a1b", TARGET, ctx, False, "", PODS)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert says in refused.value.message


@pytest.mark.parametrize("group", ["-1", "abc", "2147483648", "1e3"])
def test_a_mount_group_must_be_a_gid(group: str) -> None:
    with pytest.raises(Refused, match="volume_mount_group"):
        publish_request("csi-0a1b", TARGET, context(policy="p"), False, group, PODS)


@given(st.integers(min_value=0, max_value=2**31 - 1), st.integers(min_value=1, max_value=70000))
def test_a_mount_group_below_the_minimum_never_passes(group: int, minimum: int) -> None:
    # Root's group and the node's system groups would get write access to the data.
    if group < minimum:
        with pytest.raises(Refused, match=f"from {minimum} to"):
            publish_request("csi-0a1b", TARGET, context(policy="p"), False, str(group), PODS,
                            minimum)
    else:
        req = publish_request("csi-0a1b", TARGET, context(policy="p"), False, str(group),
                              PODS, minimum)
        assert req.mount_group == group


@given(st.text(min_size=1, max_size=60))
def test_a_policy_name_with_a_slash_or_dots_alone_never_passes(name: str) -> None:
    try:
        req = publish_request("csi-0a1b", TARGET, context(policy=name), False, "", PODS)
    except Refused as refused:
        assert refused.code == "INVALID_ARGUMENT"
        return
    # Only ever a lookup key, yet nothing a path could be made of.
    assert req.policy_name == name
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    assert name == name.strip() and len(name) <= 253


@given(st.lists(st.sampled_from(["..", ".", "", "x", POD, "volumes", "kubernetes.io~csi",
                                 "mount", "v", "/"]), max_size=8))
def test_only_kubelets_mount_dir_shape_is_a_target(parts: list[str]) -> None:
    value = f"{PODS}/" + "/".join(parts)
    try:
        path = check_target(value, PODS, POD)
    except Refused as refused:
        assert refused.code == "INVALID_ARGUMENT" and "target_path" in refused.message
        return
    assert str(path) == TARGET.replace("ckptdrain-local", path.parts[-2])
    assert path.parts[-2] in ("x", "v", "volumes", "mount")


def test_mountinfo_escapes_are_read() -> None:
    info = ("36 35 98:0 /mnt1 /mnt\\040with\\040space rw,noatime master:1 - ext3 /dev/r rw\n"
            "37 35 98:0 / /plain rw - ext4 /dev/s rw\n")
    assert mount_points(info) == {"/mnt with space", "/plain"}
