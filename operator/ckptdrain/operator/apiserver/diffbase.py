"""Kopf's diff base, without the cost of one for pods."""

from __future__ import annotations

from typing import Any

import kopf


class PodlessDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, but none for pods. Kopf builds an object's essence
    (two deep copies of the whole object) on every event of every watched
    kind, to detect changes for create/update/resume handlers; pods have no
    such handlers here, only indexes and event handlers, and at a
    checkpoint's burst those copies were the largest part of the operator's
    work and of its memory peak (docs/scale.md, "Operator memory")."""

    def build(self, *, body: kopf.Body,
              extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") == "Pod" and body.get("apiVersion") == "v1":
            return kopf.BodyEssence()
        return super().build(body=body, extra_fields=extra_fields)
