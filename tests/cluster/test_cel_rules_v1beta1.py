"""The CheckpointPolicy CRD's v1beta1 schema against a real apiserver: every
CEL rule of v1alpha1 (test_cel_rules.py's rows) and every type v1beta1
changes (Quantities, Go durations, percentages, RFC3339 status times) with
an accepted and a refused object, refused by the apiserver's own
validation and naming the field.

An apiserver of this module's own: the session's may run the operator,
whose policy webhook is registered for v1alpha1 and would be sent these
objects relabelled, and a CRD served with a conversion webhook needs that
webhook to store anything. Validation judges an object in the version it
was sent in, before any conversion, so the CRD is served here without
spec.conversion (None: objects are only relabelled), and every object is
written and read through v1beta1 alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import policy, policy_crd_source
from operator_process import repo_root
from test_cel_rules import RULES, Change, Rule, _set

from support import apiserver
from support.apiserver import Cluster

CRD = repo_root() / "crds" / "checkpointpolicies.yaml"
API_VERSION = "ckptdrain.io/v1beta1"
NAMESPACE = "default"
#: v1alpha1's rows whose objects spell a field v1beta1 changes: RESPELLED
#: has them in v1beta1's spelling.
V1ALPHA1_ONLY = {"model size", "parameters positive", "checkpointBytes positive",
                 "overlap at most 100%", "overlap above 0%", "overlap fraction",
                 "overlap fraction above 0"}
PATTERN = "should match"

RESPELLED = [
    Rule("model size", _set("model", {"checkpointBytes": "5.67T"}),
         _set("model", {"bytesPerParameter": 14}), ("spec.model", "checkpointBytes (e.g. 5.67T)")),
    Rule("parameters positive", _set("model", {"parameters": "0.5G"}),
         _set("model", {"parameters": "0.0G"}), ("spec.model.parameters", "positive")),
    Rule("parameters positive, an integer", _set("model", {"parameters": 1}),
         _set("model", {"parameters": 0}), ("spec.model.parameters", "positive")),
    Rule("parameters not negative", _set("model", {"parameters": 405000000000}),
         _set("model", {"parameters": -405000000000}), ("spec.model.parameters", "positive")),
    Rule("checkpointBytes positive", _set("model", {"checkpointBytes": "0.5Ti"}),
         _set("model", {"checkpointBytes": "0Ti"}), ("spec.model.checkpointBytes", "positive")),
    Rule("checkpointBytes positive, an integer", _set("model", {"checkpointBytes": 1}),
         _set("model", {"checkpointBytes": 0}), ("spec.model.checkpointBytes", "positive")),
    # A string the pattern admits ends in a digit other than 0: never zero.
    Rule("bytesPerParameter positive", _set("model.bytesPerParameter", "0.5"),
         _set("model.bytesPerParameter", "0.00"), ("spec.model.bytesPerParameter", PATTERN)),
    Rule("bytesPerParameter positive, an integer", _set("model.bytesPerParameter", 1),
         _set("model.bytesPerParameter", 0), ("spec.model.bytesPerParameter", "positive")),
    Rule("overlap at most 100%", _set("overlap", "100%"), _set("overlap", "100.5%"),
         ("spec.overlap", "(0%, 100%]", "100.5%")),
    Rule("overlap above 0%", _set("overlap", "0.01%"), _set("overlap", "0%"),
         ("spec.overlap", "(0%, 100%]")),
    # v1alpha1's fractions are no v1beta1 spelling: refused by the pattern.
    Rule("overlap fraction", _set("overlap", "100%"), _set("overlap", "1.0"),
         ("spec.overlap", PATTERN)),
    Rule("overlap fraction above 0", _set("overlap", "50%"), _set("overlap", ".5"),
         ("spec.overlap", PATTERN)),
]


@dataclass(frozen=True)
class Spelling:
    path: str  # below spec, dots
    value: Any
    #: What a refusal says besides the field (None: accepted).
    refusal: str | None = None


def _ok(path: str, *values: Any) -> list[Spelling]:
    return [Spelling(path, v) for v in values]


def _no(path: str, refusal: str, *values: Any) -> list[Spelling]:
    return [Spelling(path, v, refusal) for v in values]


NUMBER_OR_STRING = "integer,string"
DURATIONS = ["interval", "mtti", "localWriteTime", "restore.retryDeadline",
             "restore.agreementTimeout", "drain.stallTimeout"]

SPELLINGS = [
    *_ok("model.parameters", "405G", 405000000000, "1.5T", "70M", "4.05e11", "4.05E+11", "0.5"),
    # Plain digits are an integer, never a string (v1alpha1 could not give
    # the string back as written).
    *_no("model.parameters", PATTERN, "405B", "1.5P", "405g", "405 G", "1.5Ti", "-5G", "405",
         "405000000000"),
    # A JSON number with a fraction (a whole one reads as an integer).
    *_no("model.parameters", NUMBER_OR_STRING, 1.5),
    *_ok("model.bytesPerParameter", "12.5", 14, 2, "0.25", "12.345678901234"),
    # As a string only a decimal with a fraction and no trailing zero: what a
    # JSON number in v1alpha1 gives back unchanged.
    *_no("model.bytesPerParameter", PATTERN, "12.5B", "1e1", ".5", "-2", "2", "14", "12.50",
         "2.0", "012.5"),
    *_no("model.bytesPerParameter", "16", "12.3456789012345678"),
    *_no("model.bytesPerParameter", NUMBER_OR_STRING, 12.5),
    *_ok("model.checkpointBytes", "5.67T", "1.5Ti", 5670000000000, "5e12", "800G", "1E"),
    *_no("model.checkpointBytes", PATTERN, "5.67TB", "1.5TiB", "800GB", "8K", "1e-3", "5.67 T",
         "800", "5670000000000"),
    *_ok("localTier.capacity", "8Ti", "8T", 8000000000000, 0),
    *_no("localTier.capacity", PATTERN, "8TB", "8TiB", "8t", "800", "0"),
    *_no("localTier.capacity", "greater than or equal to 0", -1),
    *_ok("peerTier.capacity", "2T", "2Ti", 2000000000000),
    *_no("peerTier.capacity", PATTERN, "2TB"),
    *_no("peerTier.capacity", "greater than or equal to 0", -1),
    *_ok("caps.bandwidth", "10G", "1.25Gi", 10000000000),
    *_no("caps.bandwidth", PATTERN, "10GB/s", "10G/s", "1E", "1Ei", "1e9", "14",
         "10000000000"),
    *_no("caps.bandwidth", "greater than or equal to 0", -1),
    *_ok("caps.perDrainer", "2G", "500Mi"),
    *_no("caps.perDrainer", PATTERN, "2GB/s", "500MiB"),
    *[s for path in DURATIONS for s in _ok(path, "24h", "1h30m", "90s", "1.5h", "500ms",
                                             "2h45m30.5s")],
    *[s for path in DURATIONS for s in _no(path, PATTERN, "1d", "90", "15 m", "1us", "1.h",
                                             "")],
    *_no("interval", "must be of type string", 90),
    *_ok("overlap", "12.5%", "10%", "100%", "0.01%"),
    *_no("overlap", PATTERN, "0.1", "10", "12.%", ".5%", "10 %", "-5%"),
    *_no("overlap", "(0%, 100%]", "0%", "100.5%", "0.000%"),
]


def _memory(value: Any) -> Change:
    return _set("localTier.memory", {"sizeLimit": value})


MEMORY = [(_memory("64Gi"), None), (_memory(68719476736), None), (_memory("64G"), None),
          (_memory("64GB"), PATTERN), (_memory("64GiB"), PATTERN),
          (_memory("68719476736"), PATTERN), (_memory(-1), "greater than or equal to 0")]


def _body(change: Change) -> dict[str, Any]:
    body = policy("cel")
    body["apiVersion"] = API_VERSION
    body["spec"]["model"] = {"parameters": "405G"}
    change(body)
    return body


def _dry_run(cluster: Cluster, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-n", NAMESPACE, "-o", "json", "-f",
                           "-", input=json.dumps(body), check=False)


def _refused_by_the_apiserver(result: Any, body: dict[str, Any]) -> str:
    assert result.returncode != 0, f"accepted: {body['spec']}"
    # The apiserver's own validation (422 "is invalid"), not a webhook's.
    assert "is invalid" in result.stderr and "denied the request" not in result.stderr, \
        result.stderr
    return str(result.stderr)


@pytest.fixture(scope="module")
def beta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    crd = policy_crd_source()
    crd["spec"].pop("conversion", None)
    path: Path = tmp_path_factory.mktemp("crd") / "checkpointpolicies.yaml"
    path.write_text(yaml.safe_dump(crd))
    yield from apiserver.crd_cluster(path)


ROWS = [r for r in RULES if r.label not in V1ALPHA1_ONLY] + RESPELLED


def test_every_v1alpha1_rule_row_is_carried_or_respelled() -> None:
    labels = {r.label for r in RULES}
    assert labels >= V1ALPHA1_ONLY
    assert {r.label for r in RESPELLED} >= V1ALPHA1_ONLY


@pytest.mark.parametrize("rule", ROWS, ids=[r.label for r in ROWS])
def test_the_apiserver_judges_v1beta1_by_the_same_rules(beta: Cluster, rule: Rule) -> None:
    accepted, refused = _body(rule.accepted), _body(rule.refused)
    ok = _dry_run(beta, accepted)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["apiVersion"] == API_VERSION
    stderr = _refused_by_the_apiserver(_dry_run(beta, refused), refused)
    for text in rule.names:
        assert text in stderr, stderr


@pytest.mark.parametrize("spelling", SPELLINGS,
                         ids=[f"{s.path}={s.value!r}" for s in SPELLINGS])
def test_a_v1beta1_spelling_is_accepted_or_refused_naming_the_field(
        beta: Cluster, spelling: Spelling) -> None:
    body = _body(_set(spelling.path, spelling.value))
    result = _dry_run(beta, body)
    if spelling.refusal is None:
        assert result.returncode == 0, result.stderr
        # Kept as written: an int-or-string field is not normalised.
        node = json.loads(result.stdout)["spec"]
        for part in spelling.path.split("."):
            node = node[part]
        assert node == spelling.value
        return
    stderr = _refused_by_the_apiserver(result, body)
    assert f"spec.{spelling.path}" in stderr and spelling.refusal in stderr, stderr


@pytest.mark.parametrize("index", range(len(MEMORY)))
def test_the_memory_tier_size_is_a_quantity(beta: Cluster, index: int) -> None:
    change, refusal = MEMORY[index]
    body = _body(change)
    result = _dry_run(beta, body)
    if refusal is None:
        assert result.returncode == 0, result.stderr
        return
    stderr = _refused_by_the_apiserver(result, body)
    assert "spec.localTier.memory.sizeLimit" in stderr and refusal in stderr, stderr


def test_v1beta1_defaults_are_v1alpha1s_in_the_new_spelling(beta: Cluster) -> None:
    made = _dry_run(beta, _body(_set("overlap", None)))
    assert made.returncode == 0, made.stderr
    spec = json.loads(made.stdout)["spec"]
    assert spec["model"]["bytesPerParameter"] == 14  # an integer, not 14.0
    assert spec["overlap"] == "10%"
    assert spec["restore"]["retryDeadline"] == "10m"
    assert spec["restore"]["agreementTimeout"] == "1m"
    assert spec["drain"]["stallTimeout"] == "5m"


STATUS_TIMES = ["lastRestoreAgreement.startedAt", "lastRestoreFailure.startedAt",
                "goodput.heldSince", "goodput.endedAt"]


def _status(path: str, value: Any) -> dict[str, Any]:
    parent, name = path.split(".")
    return {"status": {parent: {name: value}}}


@pytest.mark.parametrize("path", STATUS_TIMES)
def test_status_times_are_rfc3339(beta: Cluster, path: str) -> None:
    name = "times-" + path.split(".")[0].lower()
    body = _body(lambda b: None)
    body["metadata"]["name"] = name
    made = beta.kubectl("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(body),
                        check=False)
    assert made.returncode == 0, made.stderr
    try:
        def patch(value: Any) -> Any:
            return beta.kubectl("patch", "-n", NAMESPACE, f"checkpointpolicies.v1beta1."
                                f"ckptdrain.io/{name}", "--subresource=status",
                                "--type=merge", "-p", json.dumps(_status(path, value)),
                                "-o", "json", check=False)
        when = "2026-11-30T01:02:03.123456Z"
        ok = patch(when)
        assert ok.returncode == 0, ok.stderr
        parent, field = path.split(".")
        assert json.loads(ok.stdout)["status"][parent][field] == when
        for bad in (1764464523.123456, "yesterday", "2026-11-30"):
            no = patch(bad)
            assert no.returncode != 0, f"accepted {bad!r}"
            assert f"status.{path}" in no.stderr and "date-time" in no.stderr, no.stderr
    finally:
        beta.kubectl("delete", "-n", NAMESPACE, "checkpointpolicies.v1beta1.ckptdrain.io",
                     name, "--wait=false", check=False)
