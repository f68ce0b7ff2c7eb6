"""The versions of a CRD in Kubernetes' order of preference: the served one
`kubectl` shows and a user should write comes first; versions defined but
not served yet (staged for the next release) after the served ones."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_STABILITY = {"alpha": 0, "beta": 1, "": 2}


def _priority(name: str) -> tuple[int, int, int]:
    """Kubernetes' version priority: GA over beta over alpha, then the higher
    major, then the higher minor (v1 > v1beta2 > v1beta1 > v1alpha1)."""
    match = re.fullmatch(r"v([0-9]+)(alpha|beta)?([0-9]*)", name)
    if not match:
        return (-1, 0, 0)
    return (_STABILITY[match[2] or ""], int(match[1]), int(match[3] or 0))


def versions(crd: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The served versions, the preferred (what to write) first."""
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    return sorted(served, key=lambda v: _priority(v["name"]), reverse=True)


def defined_only(crd: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The versions defined but not served (served from a later release),
    highest priority first."""
    staged = [v for v in crd["spec"]["versions"] if not v.get("served")]
    return sorted(staged, key=lambda v: _priority(v["name"]), reverse=True)


def listed(crd: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every version: the served ones, preferred first, then the staged ones."""
    return [*versions(crd), *defined_only(crd)]
