"""Where an admission's time goes, from the servers' own histograms, read
before and after a phase: the apiserver's whole pod creation
(`apiserver_request_duration_seconds`, POST pods), its call to our mutating
webhook (`apiserver_admission_webhook_admission_duration_seconds`), and our
webhook's own handling (`ckptdrain_webhook_seconds{webhook="pod"}`). A
quantile from a histogram is the upper edge of the bucket it falls in: a
bound, as coarse as the buckets."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)_bucket\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')

#: (what, metric, labels a series must have)
SERIES: tuple[tuple[str, str, Mapping[str, str]], ...] = (
    ("apiserver_pod_create", "apiserver_request_duration_seconds",
     {"verb": "POST", "resource": "pods", "subresource": ""}),
    ("apiserver_webhook_call", "apiserver_admission_webhook_admission_duration_seconds",
     {"type": "admit", "operation": "CREATE"}),
    ("ckptdrain_webhook", "ckptdrain_webhook_seconds", {"webhook": "pod"}),
)


def buckets(text: str, metric: str, match: Mapping[str, str]) -> dict[float, float]:
    """Cumulative counts by upper edge, summed over every series of `metric`
    whose labels include `match`."""
    found: dict[float, float] = {}
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if not sample or sample["name"] != metric:
            continue
        labels = dict(_LABEL.findall(sample["labels"]))
        if any(labels.get(k, "") != v for k, v in match.items()) or "le" not in labels:
            continue
        edge = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
        found[edge] = found.get(edge, 0.0) + float(sample["value"])
    return found


def quantile_ms(before: Mapping[float, float], after: Mapping[float, float],
                q: float) -> float | None:
    """The upper edge (ms) of the bucket holding quantile `q` of what was
    observed between `before` and `after`; None if nothing was."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    if not counts or counts[-1] <= 0 or min(counts) < 0:
        return None  # nothing observed, or a counter reset (a restart) between
    wanted = q * counts[-1]
    for edge, count in zip(edges, counts, strict=True):
        if count >= wanted:
            return None if edge == float("inf") else round(edge * 1000, 1)
    return None


def snapshot(apiserver_text: str, operator_text: str) -> dict[str, dict[float, float]]:
    """Every series of SERIES as it stands."""
    return {what: buckets(operator_text if what.startswith("ckptdrain") else apiserver_text,
                          metric, match)
            for what, metric, match in SERIES}


def breakdown(before: Mapping[str, Mapping[float, float]],
              after: Mapping[str, Mapping[float, float]]) -> dict[str, dict[str, float | None]]:
    """p50 and p99 bounds (ms) of each series between two snapshots."""
    return {what: {"p50_ms_at_most": quantile_ms(before.get(what, {}), after[what], 0.5),
                   "p99_ms_at_most": quantile_ms(before.get(what, {}), after[what], 0.99)}
            for what in after}
