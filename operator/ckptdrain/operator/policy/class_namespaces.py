"""Which namespaces a CheckpointClass allows: its `spec.namespaces`, the
way Gateway API's `allowedRoutes.namespaces` says which namespaces may
attach routes to a Gateway. Pure, no Kubernetes.

    spec.namespaces unset, or {from: All}  ──▶ every namespace (as before)
    {from: Selector, selector: <LabelSelector>}
                                           ──▶ namespaces whose labels match

A class is cluster-scoped and carries the platform's roots, stores and
resources; without this rule any tenant could name any class. The
namespace's labels, not its name, are matched: a label is what a platform
team sets on a namespace it hands out, and a tenant cannot set it on its
own (namespaces are cluster-scoped objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import selectors
from ckptdrain.operator.policy.spec import selector_matches

FROM_ALL, FROM_SELECTOR = "All", "Selector"
FIELD = "spec.namespaces"


@dataclass(frozen=True)
class NamespaceRule:
    """`selector` None: every namespace; otherwise those it matches."""

    selector: Mapping[str, Any] | None = None

    @property
    def restricted(self) -> bool:
        return self.selector is not None

    def allows(self, labels: Mapping[str, str]) -> bool:
        return self.selector is None or selector_matches(self.selector, labels)

    def describe(self) -> str:
        """The selector's terms, one phrase each (`tenant=a, env in (prod)`)."""
        if self.selector is None:
            return "every namespace"
        return ", ".join([f"{key}={value}" for key, value in
                          sorted((self.selector.get("matchLabels") or {}).items())]
                         + [_phrase(t) for t in self.selector.get("matchExpressions") or []])

    def lacks(self, labels: Mapping[str, str]) -> list[str]:
        """What `labels` lack for the selector, one phrase a term, such as
        `team=a` or `env in (prod, staging)`; [] when allowed."""
        if self.selector is None:
            return []
        missing = [f"{key}={value}" for key, value in
                   sorted((self.selector.get("matchLabels") or {}).items())
                   if labels.get(key) != value]
        for term in self.selector.get("matchExpressions") or []:
            if not selector_matches({"matchExpressions": [term]}, labels):
                missing.append(_phrase(term))
        return missing


EVERY_NAMESPACE = NamespaceRule()


def _phrase(term: Mapping[str, Any]) -> str:
    key, op, values = term.get("key"), term.get("operator"), term.get("values") or []
    return {"In": f"{key} in ({', '.join(values)})",
            "NotIn": f"{key} not in ({', '.join(values)})",
            "Exists": f"a label {key}",
            "DoesNotExist": f"no label {key}"}.get(str(op), f"{key} {op}")


def read_rule(raw: object, problems: list[InvalidInput]) -> NamespaceRule:
    """The class's `spec.namespaces`; appends each wrong field to `problems`."""
    if raw is None:
        return EVERY_NAMESPACE
    if not isinstance(raw, Mapping):
        problems.append(InvalidInput(FIELD, "{from: All} or {from: Selector, selector: "
                                     "<label selector>}", raw))
        return EVERY_NAMESPACE
    source = raw.get("from", FROM_ALL)
    selector = raw.get("selector")
    if source == FROM_ALL:
        if selector is not None:
            problems.append(InvalidInput(f"{FIELD}.selector", "unset with from: All (set "
                                         "from: Selector to use it)", selector))
        return EVERY_NAMESPACE
    if source != FROM_SELECTOR:
        problems.append(InvalidInput(f"{FIELD}.from", f"{FROM_ALL} or {FROM_SELECTOR}", source))
        return EVERY_NAMESPACE
    if not isinstance(selector, Mapping):
        problems.append(InvalidInput(f"{FIELD}.selector", "a label selector (matchLabels, "
                                     "matchExpressions) with from: Selector", selector))
        return EVERY_NAMESPACE
    found = [InvalidInput(f"{FIELD}.{where}", expected, seen)
             for where, expected, seen in selectors.problems(selector)]
    problems += found
    # An unreadable selector allows nothing rather than everything.
    return NamespaceRule(dict(selector) if not found else {"matchLabels": {"": ""}})


def refusal(class_name: str, namespace: str, rule: NamespaceRule,
            labels: Mapping[str, str]) -> InvalidInput:
    """Why the class does not allow `namespace`, naming the policy's field,
    the class and the labels the namespace lacks."""
    lacking = ", ".join(rule.lacks(labels)) or "a label the selector matches"
    return InvalidInput(
        "spec.checkpointClassName",
        f"a CheckpointClass that allows namespace {namespace} (CheckpointClass "
        f"{class_name} allows only namespaces its spec.namespaces.selector matches; "
        f"{namespace} lacks {lacking})", class_name)
