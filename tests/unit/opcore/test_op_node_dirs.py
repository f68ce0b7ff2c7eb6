"""Tenants' node directories never nest (policy/node_dirs.py): the rule
against what pods would actually be given, `<path>/<namespace>/<policy>`."""

from __future__ import annotations

import posixpath
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.operator.policy import node_dirs

#: Few components, so that paths and namespaces often meet.
PARTS = ["a", "b", "ab", "nvme"]
parts = st.sampled_from(PARTS)
paths = st.lists(parts, max_size=4).map(lambda p: "/" + "/".join(p))
#: Spellings of one path that normpath makes equal.
spellings = st.sampled_from(["{}", "{}/", "/{}", "{}/."])


def body(namespace: str, name: str, path: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"localTier": {"path": path}}}


def within(a: str, b: str) -> bool:
    """Whether file path `a` is `b` or lies under it, component by component."""
    a_parts, b_parts = a.strip("/").split("/"), b.strip("/").split("/")
    return a_parts[:len(b_parts)] == b_parts or b == "/"


@given(paths, parts, paths, parts)
def test_a_clash_is_exactly_two_tenants_pods_whose_directories_nest(
        path: str, namespace: str, other_path: str, other_namespace: str) -> None:
    """Refused exactly when some policy name of each namespace would give
    one tenant's pods a directory equal to, inside or around the other's."""
    clash = node_dirs.first_clash(namespace, path, [body(other_namespace, "p", other_path)])
    names = [*PARTS, "zz"]  # every component that can appear, and one that cannot
    reachable = any(
        within(mine, theirs) or within(theirs, mine)
        for x in names for y in names
        for mine in [posixpath.join(path, namespace, x)]
        for theirs in [posixpath.join(other_path, other_namespace, y)])
    if namespace == other_namespace:
        assert clash is None
    else:
        assert (clash is not None) == reachable, (path, namespace, other_path, other_namespace)


@given(paths, parts, paths, parts)
def test_the_rule_is_symmetric(path: str, namespace: str, other_path: str,
                               other_namespace: str) -> None:
    one = node_dirs.first_clash(namespace, path, [body(other_namespace, "p", other_path)])
    other = node_dirs.first_clash(other_namespace, other_path, [body(namespace, "q", path)])
    assert (one is None) == (other is None)


@given(paths, parts, paths, parts, spellings, spellings)
def test_how_a_path_is_spelled_changes_nothing(path: str, namespace: str, other_path: str,
                                               other_namespace: str, mine: str,
                                               theirs: str) -> None:
    plain = node_dirs.first_clash(namespace, path, [body(other_namespace, "p", other_path)])
    spelled = node_dirs.first_clash(namespace, mine.format(path),
                                    [body(other_namespace, "p", theirs.format(other_path))])
    assert (plain is None) == (spelled is None)


def test_the_reported_attempt_is_refused_and_a_sibling_is_not() -> None:
    a = body("team-a", "ckpt", "/mnt/ckptdrain/nvme")
    clash = node_dirs.first_clash("team-b", "/mnt/ckptdrain/nvme/team-a/ckpt", [a])
    assert clash == node_dirs.NodeDir("team-a", "ckpt", "/mnt/ckptdrain/nvme/team-a")
    # Around A's: B's namespace directory would hold A's.
    assert node_dirs.first_clash("nvme", "/mnt/ckptdrain", [a]) is not None
    # A name that merely starts like A's directory is another directory.
    assert node_dirs.first_clash("team-a2", "/mnt/ckptdrain/nvme", [a]) is None
    assert node_dirs.first_clash("team-b", "/mnt/ckptdrain/nvme", [a]) is None


def test_one_namespaces_policies_may_share_a_path() -> None:
    a = body("team-a", "ckpt", "/mnt/ckptdrain/nvme")
    assert node_dirs.first_clash("team-a", "/mnt/ckptdrain/nvme", [a]) is None
    assert node_dirs.first_clash("team-a", "/mnt/ckptdrain/nvme/team-a/x", [a]) is None


def test_policies_without_a_usable_path_are_passed_over() -> None:
    others = [body("team-a", "p", None), body("team-a", "q", "relative"), {"metadata": {}},
              {"metadata": {"namespace": "team-a"}, "spec": "not a mapping"}]
    assert node_dirs.first_clash("team-b", "/mnt/ckptdrain", others) is None


def test_refusals_name_the_field_and_not_the_other_tenant() -> None:
    said = node_dirs.policy_refusal("team-b", "/mnt/ckptdrain/nvme/team-a/ckpt")
    assert said.startswith("spec.localTier.path: ")
    assert "another namespace's node directory" in said
    assert "/mnt/ckptdrain/nvme/team-a/ckpt/team-b" in said  # its own directory, said
    pod = node_dirs.pod_refusal("nest", "team-b", "/mnt/ckptdrain/nvme/team-a/ckpt")
    assert "CheckpointPolicy nest spec.localTier.path" in pod
    assert "another namespace's node directory" in pod


def test_of_two_nesting_policies_only_the_newer_one_s_pods_are_refused() -> None:
    """Two creations at once on two replicas can both pass policy admission:
    pod admission then refuses the newcomer's pods, never the running
    tenant's (a newcomer cannot stop another tenant's job by nesting)."""
    older = body("team-a", "ckpt", "/mnt/ckptdrain/nvme")
    older["metadata"]["creationTimestamp"] = "2026-11-30T10:00:00Z"
    newer = body("team-b", "ckpt", "/mnt/ckptdrain/nvme/team-a/ckpt")
    newer["metadata"]["creationTimestamp"] = "2026-11-30T10:00:01Z"
    # A's pods: the only clash is newer than A's policy.
    assert node_dirs.first_clash("team-a", "/mnt/ckptdrain/nvme", [newer],
                                 "2026-11-30T10:00:00Z") is None
    # B's pods: A's policy is older.
    assert node_dirs.first_clash("team-b", "/mnt/ckptdrain/nvme/team-a/ckpt", [older],
                                 "2026-11-30T10:00:01Z") is not None
    # Created in the same second: neither is the newer, both are refused.
    assert node_dirs.first_clash("team-a", "/mnt/ckptdrain/nvme", [newer],
                                 "2026-11-30T10:00:01Z") is not None
    # A policy admission (no creation time yet) counts every clash.
    assert node_dirs.first_clash("team-a", "/mnt/ckptdrain/nvme", [newer]) is not None
