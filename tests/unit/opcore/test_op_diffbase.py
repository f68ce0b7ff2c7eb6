"""The diff base Kopf compares a policy with: the same values in v1alpha1's
and v1beta1's spellings are no change, so the upgrade from 0.2.0 (which
saved essences from v1alpha1 bodies) and the rollback to it run no update."""

from __future__ import annotations

from typing import Any

import kopf
from kopf._cogs.structs import diffs

from ckptdrain.contract import api
from ckptdrain.contract.policy_versions import V1ALPHA1, to_v1alpha1, to_v1beta1
from ckptdrain.operator.apiserver.diffbase import PodlessDiffBase

ALPHA_SPEC: dict[str, Any] = {
    "model": {"parameters": "405B", "checkpointBytes": "1TB", "bytesPerParameter": 2.5},
    "mtti": "1d", "overlap": 0.1, "localWriteTime": 30,
    "caps": {"bandwidth": "10GB/s"},
}


def _store() -> PodlessDiffBase:
    return PodlessDiffBase(prefix="ckptdrain.io", key="last-handled-configuration")


def _alpha(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": V1ALPHA1, "kind": api.KIND_POLICY,
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": ALPHA_SPEC}


def _saved_by(store: PodlessDiffBase, body: dict[str, Any]) -> dict[str, str]:
    """The annotations an operator leaves after handling `body`, as a
    release that compared spellings as they were saved (plain Kopf) would."""
    patch = kopf.Patch()
    store.store(body=kopf.Body(body), patch=patch,
                essence=kopf.AnnotationsDiffBaseStorage.build(store, body=kopf.Body(body)))
    return dict(patch["metadata"]["annotations"])


def test_the_spellings_really_differ_as_plain_kopf_sees_them() -> None:
    plain = kopf.AnnotationsDiffBaseStorage(prefix="ckptdrain.io",
                                            key="last-handled-configuration")
    old = plain.build(body=kopf.Body(_alpha()))
    new = plain.build(body=kopf.Body(to_v1beta1(_alpha())))
    assert diffs.diff(old, new)  # what 0.3.0 would see without this diff base


def test_a_v1alpha1_saved_essence_against_the_v1beta1_body_is_no_change() -> None:
    store = _store()
    saved = _saved_by(store, _alpha())
    beta = to_v1beta1(_alpha(saved))
    assert beta["spec"]["model"]["parameters"] != "405B"  # really read in other words
    old = store.fetch(body=kopf.Body(beta))
    assert old is not None
    assert diffs.diff(old, store.build(body=kopf.Body(beta))) == ()


def test_a_v1beta1_saved_essence_against_the_v1alpha1_body_is_no_change() -> None:
    store = _store()
    saved = _saved_by(store, to_v1beta1(_alpha()))
    alpha = _alpha(saved)
    old = store.fetch(body=kopf.Body(alpha))
    assert old is not None
    assert diffs.diff(old, store.build(body=kopf.Body(alpha))) == ()


def test_a_changed_value_is_still_a_change() -> None:
    store = _store()
    saved = _saved_by(store, _alpha())
    beta = to_v1beta1(_alpha(saved))
    beta["spec"]["mtti"] = "12h"
    old = store.fetch(body=kopf.Body(beta))
    assert old is not None
    changes = diffs.diff(old, store.build(body=kopf.Body(beta)))
    assert [(c.field, c.old, c.new) for c in changes] == [(("spec", "mtti"), "24h", "12h")]


def test_what_0_3_0_saves_is_no_change_to_0_2_0_after_a_rollback() -> None:
    # 0.2.0 is plain Kopf reading v1alpha1; the policy is stored at v1beta1
    # (migrated), so its v1alpha1 read is the converter's down form.
    store = _store()
    beta = to_v1beta1(_alpha())
    patch = kopf.Patch()
    store.store(body=kopf.Body(beta), patch=patch, essence=store.build(body=kopf.Body(beta)))
    read_by_0_2_0 = to_v1alpha1(beta)
    read_by_0_2_0["metadata"]["annotations"] = dict(patch["metadata"]["annotations"])
    plain = kopf.AnnotationsDiffBaseStorage(prefix="ckptdrain.io",
                                            key="last-handled-configuration")
    old = plain.fetch(body=kopf.Body(read_by_0_2_0))
    assert old is not None
    assert diffs.diff(old, plain.build(body=kopf.Body(read_by_0_2_0))) == ()
    # And 0.3.0 itself still reads it as no change.
    again = store.fetch(body=kopf.Body({**beta, "metadata": read_by_0_2_0["metadata"]}))
    assert again is not None
    assert diffs.diff(again, store.build(body=kopf.Body(beta))) == ()


def test_pods_still_have_no_essence() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"a": 1}}
    assert _store().build(body=kopf.Body(pod)) == {}
