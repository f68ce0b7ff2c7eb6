"""docs/audit.md's apiserver audit policy says what the page says of it:
one event per request (RequestReceived omitted), Secrets and the other
kinds a tenant's attempts go through recorded at Metadata (never a body),
no rule recording bodies. The cluster tests' apiserver runs this very block
(tests/support/audit_log.py), and the hostile-tenant suite finds its
refusals in the log it writes."""

from __future__ import annotations

from typing import Any

import yaml
from tests.support import audit_log

#: The kinds the hostile-tenant suite's refused requests are on.
REFUSED_ON = {("", "secrets"), ("", "configmaps"), ("", "pods"), ("", "pods/exec"),
              ("", "serviceaccounts/token"),
              ("ckptdrain.io", "checkpointpolicies"), ("ckptdrain.io", "checkpoints")}


def policy() -> dict[str, Any]:
    return dict(yaml.safe_load(audit_log.policy_text()))


def test_the_policy_is_an_audit_policy_with_one_event_a_request() -> None:
    doc = policy()
    assert (doc["apiVersion"], doc["kind"]) == ("audit.k8s.io/v1", "Policy")
    assert doc["omitStages"] == ["RequestReceived"]


def test_no_rule_records_a_body() -> None:
    assert {r["level"] for r in policy()["rules"]} <= {"None", "Metadata"}


def test_the_kinds_of_the_refused_requests_are_recorded_for_any_tenant() -> None:
    """A rule that leaves a user out names only system users, reads only,
    and the Metadata rule lists each kind the suite is refused on."""
    rules = policy()["rules"]
    for rule in rules:
        if rule["level"] == "None":
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
            assert all(u.startswith("system:") for u in
                       rule.get("users", []) + rule.get("userGroups", [])), rule
            assert "resources" not in rule and "namespaces" not in rule, rule
    (recorded,) = [r for r in rules if r["level"] == "Metadata"]
    listed = {(g["group"], kind) for g in recorded["resources"] for kind in g["resources"]}
    assert listed >= REFUSED_ON and "verbs" not in recorded and "users" not in recorded
