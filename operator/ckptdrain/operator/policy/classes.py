"""CheckpointClass: what the platform decides for a policy, read, chosen and
applied. Pure, no Kubernetes.

A class (cluster-scoped, crds/checkpointclasses.yaml) carries the settings
the operator otherwise takes from its own configuration (the chart's
values): the node-local root, the injected containers' resources, the agent
image, the bandwidth weight and cap (policy/class_bandwidth.py), the store
identity (policy/class_identity.py) and credentials Secret
(policy/class_credentials.py); the stores its policies may write to,
with their endpoints and whether each may receive the ambient identity
(policy/class_stores.py); the namespaces whose policies may use it
(policy/class_namespaces.py); and the nodes its policies' pods may run on
(policy/class_placement.py).

    policy CREATE without spec.checkpointClassName
       └── the default class's name written in (`default_choice`: annotation
           ckptdrain.io/is-default-class: "true", allowing the namespace;
           several: the oldest, then the first by name, with a warning); no
           default: left unset
    policy ──spec.checkpointClassName──▶ that class (missing, or not
                                          allowing the namespace: refused)
       └── unset ──▶ the operator's own configuration, for good

Bound at creation, as a PVC's StorageClass is: a default class that comes
or goes later never re-judges a policy that names no class.

`read` turns a class body into a `CheckpointClass` (or `ClassInvalid`
naming every field); `choose` picks a policy's class from a catalogue;
`resolve` applies it: the configuration `spec.parse` is handed
(`config_for`) and the policy's spec with the class's store settings
filled in, or the problems that keep the class from taking the policy,
each naming the field and the class.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckptdrain.contract.api import class_named
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.containers import read_platform
from ckptdrain.operator.policy.class_bandwidth import read_cap, read_weight
from ckptdrain.operator.policy.class_credentials import read_secret_ref, with_secret
from ckptdrain.operator.policy.class_identity import applied, read_google, read_identity
from ckptdrain.operator.policy.class_namespaces import (
    EVERY_NAMESPACE,
    NamespaceRule,
    read_rule,
    refusal,
)
from ckptdrain.operator.policy.class_placement import (
    ANYWHERE,
    Placement,
    policy_outside,
    read_placement,
)
from ckptdrain.operator.policy.class_stores import (  # noqa: F401 (classes.Store, as before)
    NAMESPACE_PLACEHOLDER,
    STORE_SETTINGS,
    Store,
    apply_stores,
    read_stores,
    vouched,
)
from ckptdrain.operator.tenant_identities import WebIdentity

DEFAULT_ANNOTATION = "ckptdrain.io/is-default-class"
CLASS_FIELD = "spec.checkpointClassName"
#: ClassResolved condition reasons.
RESOLVED, NO_CLASS, NOT_FOUND, INVALID, REFUSED, NOT_ALLOWED = (
    "Resolved", "NoClass", "ClassNotFound", "ClassInvalid", "RefusedByClass",
    "NamespaceNotAllowed")
#: The labels of the policy's namespace, asked only of a class that allows
#: namespaces by label. When they cannot be read it raises, and `resolve`
#: lets that through: a read error is a retry for the caller, never a
#: judgement of the policy (an unreadable namespace is not a disallowed one).
Labels = Callable[[], Mapping[str, str]]


@dataclass(frozen=True)
class CheckpointClass:
    name: str
    #: metadata.creationTimestamp (RFC3339, UTC: sorts as text).
    created: str
    default: bool
    root: str
    #: () = any store, as without a class.
    stores: tuple[Store, ...] = ()
    #: spec.resources as written; applied over the operator's own block.
    resources: Mapping[str, Any] | None = None
    agent_image: str | None = None
    bandwidth_weight: int | None = None
    #: spec.bandwidthCap (bytes/s): the most its policies drain at together.
    bandwidth_cap: float | None = None
    #: spec.namespaces: which namespaces' policies the class takes.
    namespaces: NamespaceRule = EVERY_NAMESPACE
    #: spec.identity as written ({namespace} kept); None: the chart's mapping.
    identity: WebIdentity | None = None
    #: spec.identity.googleServiceAccount as written ({namespace} kept).
    google_service_account: str | None = None
    #: spec.credentialsSecretRef as written: for s3:// policies naming none.
    credentials: Mapping[str, str] | None = None
    #: spec.nodeTier.nodeSelector and tolerations: where its pods may run.
    placement: Placement = ANYWHERE


class ClassInvalid(InvalidInput):
    """A class body the operator cannot use; `errors` holds each problem."""

    def __init__(self, name: str, errors: list[InvalidInput], created: str = "",
                 default: bool = False) -> None:
        self.name, self.errors = name, errors
        #: As CheckpointClass's: an unusable class annotated default still
        #: takes part in choosing the default, so that it fails closed.
        self.created, self.default = created, default
        super().__init__(errors[0].field, errors[0].expected, errors[0].seen)
        self.args = (f"CheckpointClass {name}: " + "; ".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return str(self.args[0])


#: Each class by name: read, or why it cannot be.
Catalogue = Mapping[str, CheckpointClass | ClassInvalid]


def _text(spec: Mapping[str, Any], path: str, problems: list[InvalidInput],
          required: bool = False) -> str | None:
    node: Any = spec
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None:
        if required:
            problems.append(InvalidInput(f"spec.{path}", "a value", None))
        return None
    if not isinstance(node, str) or not node:
        problems.append(InvalidInput(f"spec.{path}", "a non-empty string", node))
        return None
    return node


def _root(spec: Mapping[str, Any], problems: list[InvalidInput]) -> str:
    root = _text(spec, "nodeTier.root", problems, required=True) or ""
    if root and (not root.startswith("/") or ".." in root.split("/")
                 or posixpath.normpath(root) in ("/", "//")):
        problems.append(InvalidInput("spec.nodeTier.root",
                                     "an absolute directory other than /, without ..", root))
        return ""
    return posixpath.normpath(root) if root else ""


def read(body: Mapping[str, Any]) -> CheckpointClass:
    """The typed class; raises ClassInvalid naming every wrong field."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = body.get("spec") or {}
    problems: list[InvalidInput] = []
    root = _root(spec, problems)
    placement = read_placement(spec.get("nodeTier"), problems)
    stores = read_stores(spec.get("stores"), problems)
    namespaces = read_rule(spec.get("namespaces"), problems)
    identity = read_identity(spec.get("identity"), problems)
    google = read_google(spec.get("identity"), problems)
    credentials = read_secret_ref(spec.get("credentialsSecretRef"), problems)
    resources = spec.get("resources")
    if resources is not None:
        try:
            read_platform("spec.resources", resources)
        except InvalidInput as error:
            problems += getattr(error, "problems", None) or [error]
    image = _text(spec, "agentImage", problems)
    weight = read_weight(spec.get("bandwidthWeight"), problems)
    cap = read_cap(spec.get("bandwidthCap"), problems)
    created = str(meta.get("creationTimestamp", ""))
    default = (meta.get("annotations") or {}).get(DEFAULT_ANNOTATION) == "true"
    if problems:
        raise ClassInvalid(name, problems, created, default)
    return CheckpointClass(
        name=name, created=created, default=default, root=root, stores=stores,
        resources=resources, agent_image=image, bandwidth_weight=weight, bandwidth_cap=cap,
        namespaces=namespaces, identity=identity, google_service_account=google,
        credentials=credentials, placement=placement)


def catalogue(bodies: list[Mapping[str, Any]]) -> dict[str, CheckpointClass | ClassInvalid]:
    """Every class body read, by name; a class that does not read keeps its
    problems, so that a policy naming it is told them."""
    out: dict[str, CheckpointClass | ClassInvalid] = {}
    for body in bodies:
        try:
            cls: CheckpointClass | ClassInvalid = read(body)
        except ClassInvalid as error:
            cls = error
        out[cls.name] = cls
    return out


@dataclass(frozen=True)
class Choice:
    """A policy's class: None with `missing` "" = no class (the operator's
    own configuration); `missing` = the name asked for, found nowhere."""

    cls: CheckpointClass | ClassInvalid | None
    missing: str = ""
    #: Several default classes: which one won and why ("" otherwise).
    warning: str = ""


def default_choice(classes: Catalogue, labels: Mapping[str, str] | None = None) -> Choice:
    """The default class: the oldest annotated one (then by name), with a
    warning naming them all when there are several. With the labels of a
    policy's namespace, only the default classes that allow it take part
    (none: no class). A class the operator cannot use takes part: when it
    wins, classless policies are refused under it (fail closed) rather than
    fall to the next default or to none, which could lift its store
    allow-list."""
    defaults = sorted((c for c in classes.values() if c.default and (
        labels is None or isinstance(c, ClassInvalid) or c.namespaces.allows(labels))),
                      key=lambda c: (c.created, c.name))
    if not defaults:
        return Choice(None)
    warning = ""
    if len(defaults) > 1:
        warning = (f"{len(defaults)} CheckpointClasses are marked {DEFAULT_ANNOTATION}: "
                   + ", ".join(c.name for c in defaults)
                   + f"; the oldest, {defaults[0].name}, is the default")
    return Choice(defaults[0], warning=warning)


def needs_labels(spec: Mapping[str, Any], classes: Catalogue) -> bool:
    """Whether judging the policy asks for its namespace's labels: the class
    it names allows namespaces by label, or (naming none, at its creation)
    a default class does."""
    named = [choose(spec, classes).cls] if spec.get("checkpointClassName") else [
        c for c in classes.values() if c.default]
    return any(isinstance(c, CheckpointClass) and c.namespaces.restricted for c in named)


def namespaces_needing_labels(policies: Mapping[tuple[str, str], Mapping[str, Any]],
                              classes: Catalogue) -> list[str]:
    """The namespaces (sorted) of the policies (by (namespace, name)) that
    `needs_labels`."""
    return sorted({key[0] for key, body in policies.items()
                   if key[0] and needs_labels(body.get("spec") or {}, classes)})


def choose(spec: Mapping[str, Any], classes: Catalogue) -> Choice:
    """The class a policy's spec names; none when it names none (its class
    was bound when it was created: `default_choice`)."""
    name = class_named(spec)
    if name is None:
        return Choice(None)
    cls = classes.get(name)
    return Choice(cls) if cls is not None else Choice(None, missing=name)


def config_for(config: OperatorConfig, cls: CheckpointClass | None) -> OperatorConfig:
    """The operator's configuration with the class's settings in place, so
    that `spec.parse`'s own checks (local path under the root, resources
    within max) hold a policy to its class. Raises ClassInvalid when the
    class's resources do not fit over the operator's own block."""
    if cls is None:
        return config
    containers = config.containers
    if cls.resources is not None:
        try:
            containers = read_platform("spec.resources", cls.resources, config.containers)
        except InvalidInput as error:
            raise ClassInvalid(cls.name, getattr(error, "problems", None) or [error],
                               cls.created, cls.default) from None
    return replace(config, allowed_root=cls.root, image=cls.agent_image or config.image,
                   containers=containers)


@dataclass(frozen=True)
class Resolution:
    """What a policy's class makes of it: the configuration and spec to
    parse, or the problems (each naming the field and the class)."""

    config: OperatorConfig
    spec: Mapping[str, Any]
    class_name: str
    reason: str
    problems: tuple[InvalidInput, ...] = ()
    warning: str = ""
    #: Where the class's pods may run (policy/class_placement.py).
    placement: Placement = ANYWHERE

    @property
    def resolved(self) -> bool:
        return not self.problems


def resolve(namespace: str, spec: Mapping[str, Any], config: OperatorConfig,
            classes: Catalogue, labels: Labels = dict) -> Resolution:
    """Choose the policy's class and apply it; `labels`, of its namespace,
    read only for a class that allows namespaces by label (what it raises
    passes through)."""
    choice = choose(spec, classes)
    if choice.missing:
        return Resolution(config, spec, choice.missing, NOT_FOUND, (InvalidInput(
            CLASS_FIELD, "the name of a CheckpointClass (none is named "
            f"{choice.missing}; `kubectl get checkpointclasses` lists them)",
            choice.missing),))
    cls = choice.cls
    if cls is None:
        return Resolution(config, spec, "", NO_CLASS)
    if isinstance(cls, ClassInvalid):
        return Resolution(config, spec, cls.name, INVALID, tuple(cls.errors), choice.warning)
    try:
        classed = config_for(config, cls)
    except ClassInvalid as error:
        return Resolution(config, spec, cls.name, INVALID, tuple(error.errors),
                          choice.warning)
    if cls.namespaces.restricted:
        seen = labels()
        if not cls.namespaces.allows(seen):
            return Resolution(config, spec, cls.name, NOT_ALLOWED,
                              (refusal(cls.name, namespace, cls.namespaces, seen),),
                              choice.warning)
    filled, problems = apply_stores(namespace, spec, cls.name, cls.stores)
    filled = dict(with_secret(filled, cls.credentials))
    classed, identity_problem = _with_identity(classed, cls, namespace, filled)
    problems += [identity_problem] if identity_problem is not None else []
    problems += policy_outside(spec, cls.placement, cls.name)
    return Resolution(classed, filled, cls.name, REFUSED if problems else RESOLVED,
                      tuple(problems), choice.warning, cls.placement)


def _with_identity(config: OperatorConfig, cls: CheckpointClass, namespace: str,
                   spec: Mapping[str, Any]) -> tuple[OperatorConfig, InvalidInput | None]:
    """`config` with what the class decides of the policy's store identity
    (class_identity.applied), and the endpoint its store vouches for added
    to the chart's ambient list."""
    config = replace(config, ambient_endpoints=(
        *config.ambient_endpoints, *vouched(namespace, spec, cls.stores)))
    uri = (spec.get("storage") or {}).get("uri")
    return applied(config, namespace, uri if isinstance(uri, str) else "", cls.name,
                   cls.identity, cls.google_service_account)


def condition(resolution: Resolution) -> dict[str, str]:
    """The ClassResolved condition's type, status, reason and message."""
    if resolution.resolved:
        message = (f"CheckpointClass {resolution.class_name}" if resolution.class_name
                   else "no class (created while none was the default): the operator's "
                   "own settings")
        if resolution.warning:
            message += f" ({resolution.warning})"
        return {"type": "ClassResolved", "status": "True", "reason": resolution.reason,
                "message": message}
    subject = f"CheckpointClass {resolution.class_name}"
    if resolution.reason == INVALID:
        subject += " cannot be used"
    elif resolution.reason == REFUSED:
        subject += " refuses this policy"
    elif resolution.reason == NOT_ALLOWED:
        subject += " does not allow this policy's namespace"
    return {"type": "ClassResolved", "status": "False", "reason": resolution.reason,
            "message": f"{subject}: " + "; ".join(str(p) for p in resolution.problems)}


class ClassUnresolved(InvalidInput):
    """A policy its class does not take (missing, unusable, or refusing
    it): reported as an invalid policy is, the message naming the class."""

    def __init__(self, resolution: Resolution) -> None:
        self.resolution = resolution
        first = resolution.problems[0]
        super().__init__(first.field, first.expected, first.seen)
        self.args = (condition(resolution)["message"],)

    def __str__(self) -> str:
        return str(self.args[0])


def resolved(namespace: str, spec: Mapping[str, Any], config: OperatorConfig,
             classes: Catalogue, labels: Labels = dict) -> Resolution:
    """`resolve`, raising ClassUnresolved when the class does not take the policy."""
    resolution = resolve(namespace, spec, config, classes, labels)
    if not resolution.resolved:
        raise ClassUnresolved(resolution)
    return resolution

