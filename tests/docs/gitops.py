"""The Argo CD Applications and Flux HelmReleases the docs show, reduced to
what the chart gets from them: where it comes from, its release name and
its values. Pure: no helm, no cluster; tests/docs/test_blocks.py renders.

A block marked `<!-- docs-test: fragment gitops -->` holds only the kinds
below; anything else there (a typo in an apiVersion, a kind nobody checks)
is refused rather than passed unread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

APPLICATION = ("argoproj.io/v1alpha1", "Application")
HELM_RELEASE = ("helm.toolkit.fluxcd.io/v2", "HelmRelease")
HELM_REPOSITORY = ("source.toolkit.fluxcd.io/v1", "HelmRepository")
KNOWN = {APPLICATION, HELM_RELEASE, HELM_REPOSITORY}
#: Flux's policies for a chart's crds/ directory (HelmRelease install/upgrade.crds).
FLUX_CRD_POLICIES = {"Skip", "Create", "CreateReplace"}


@dataclass(frozen=True)
class Release:
    """One installation of the chart as a GitOps object describes it."""

    source: str  # "Application/<name>" or "HelmRelease/<name>"
    chart: str  # a path in this repository (Argo CD) or a chart name (Flux)
    release_name: str
    values: dict[str, Any]
    ignored: list[dict[str, Any]]  # Argo CD's ignoreDifferences


def releases(docs: list[dict[str, Any]]) -> list[Release]:
    """Each Application and HelmRelease of `docs`; ValueError naming the
    object and field for anything a reader would copy wrongly."""
    found = []
    repositories = {d["metadata"]["name"] for d in docs
                    if (d.get("apiVersion"), d.get("kind")) == HELM_REPOSITORY}
    for doc in docs:
        kind = (doc.get("apiVersion"), doc.get("kind"))
        name = doc.get("metadata", {}).get("name", "?")
        if kind not in KNOWN:
            raise ValueError(f"{kind[1]} {name}: not one of {sorted(k for _, k in KNOWN)} "
                             f"(apiVersion {kind[0]})")
        spec = doc["spec"]
        if kind == APPLICATION:
            helm = spec["source"]["helm"]
            found.append(Release(f"Application/{name}", spec["source"]["path"],
                                 helm.get("releaseName", name), helm.get("valuesObject", {}),
                                 spec.get("ignoreDifferences", [])))
        elif kind == HELM_RELEASE:
            chart = spec["chart"]["spec"]
            if chart["sourceRef"]["name"] not in repositories:
                raise ValueError(f"HelmRelease {name}: spec.chart.spec.sourceRef names "
                                 f"{chart['sourceRef']['name']!r}, not a HelmRepository "
                                 "of the block")
            for phase in ("install", "upgrade"):
                policy = spec.get(phase, {}).get("crds")
                if policy not in FLUX_CRD_POLICIES:
                    raise ValueError(f"HelmRelease {name}: spec.{phase}.crds is {policy!r}, "
                                     f"expected one of {sorted(FLUX_CRD_POLICIES)}")
            found.append(Release(f"HelmRelease/{name}", chart["chart"],
                                 spec.get("releaseName", name), spec.get("values", {}), []))
    return found


def unknown_values(values: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Paths of `values` that the chart's values.schema.json does not name
    (where it lists its properties), e.g. ["agent.namespace"]."""
    return list(_unknown(values, schema, ""))


def _unknown(values: Mapping[str, Any], schema: Mapping[str, Any],
             prefix: str) -> Iterator[str]:
    properties = schema.get("properties")
    if properties is None:  # free-form (annotations, resources, ...)
        return
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in properties:
            yield path
        elif isinstance(value, Mapping):
            yield from _unknown(value, properties[key], f"{path}.")
