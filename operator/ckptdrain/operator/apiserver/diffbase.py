"""Kopf's diff base, without the cost of one for pods, and spelling-free
for policies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from ckptdrain.contract import api
from ckptdrain.contract.policy_versions import VERSIONS, to_v1alpha1, to_v1beta1


def _is_policy(body: Mapping[str, Any]) -> bool:
    return body.get("kind") == api.KIND_POLICY and body.get("apiVersion") in VERSIONS


def _in_v1beta1_spellings(essence: Mapping[str, Any]) -> kopf.BodyEssence:
    """An essence (no apiVersion, no kind) with its spec in v1beta1's
    spellings: to_v1beta1 keeps a v1beta1 value as it is, so an essence
    saved by either release comes out the same for the same values."""
    up = to_v1beta1(essence)
    up.pop("apiVersion", None)
    return cast(kopf.BodyEssence, up)


class PodlessDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, but none for pods. Kopf builds an object's essence
    (two deep copies of the whole object) on every event of every watched
    kind, to detect changes for create/update/resume handlers; pods have no
    such handlers here, only indexes and event handlers, and at a
    checkpoint's burst those copies were the largest part of the operator's
    work and of its memory peak (docs/scale.md, "Operator memory").

    A policy's essence is built and read back in v1beta1's spellings. 0.2.0
    saved it from v1alpha1 bodies (`405B`, `1d`, `0.1`), 0.3.0 reads v1beta1
    (`405G`, `24h`, `10%`): compared as saved, every policy written at
    v1alpha1 would look changed at the upgrade (a spurious update: a status
    rewrite and a "Sized" Event per policy). It is saved in the v1alpha1
    form of those v1beta1 spellings: what 0.2.0 builds from its v1alpha1
    read of a policy stored at v1beta1, so a rollback to 0.2.0 sees no
    change either."""

    def build(self, *, body: kopf.Body,
              extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") == "Pod" and body.get("apiVersion") == "v1":
            return kopf.BodyEssence()
        if _is_policy(body):
            body = kopf.Body(to_v1beta1(body))
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        essence = super().fetch(body=body)
        if essence is None or not _is_policy(body):
            return essence
        return _in_v1beta1_spellings(essence)

    def store(self, *, body: kopf.Body, patch: kopf.Patch,
              essence: kopf.BodyEssence) -> None:
        if _is_policy(body):
            down = to_v1alpha1(_in_v1beta1_spellings(essence))
            down.pop("apiVersion", None)
            essence = cast(kopf.BodyEssence, down)
        super().store(body=body, patch=patch, essence=essence)
