"""CheckpointClass: what the platform decides for a policy, read, chosen and
applied. Pure, no Kubernetes.

A class (cluster-scoped, crds/checkpointclasses.yaml) carries the settings
the operator otherwise takes from its own configuration (the chart's
values): the node-local root, the injected containers' resources, the agent
image, the bandwidth weight; and the stores its policies may write to, with
their endpoints.

    policy CREATE without spec.checkpointClassName
       └── the default class's name written in (`default_choice`: annotation
           ckptdrain.io/is-default-class: "true"; several: the oldest, then
           the first by name, with a warning); no default: left unset
    policy ──spec.checkpointClassName──▶ that class (missing: refused)
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import MAX_WEIGHT, OperatorConfig
from ckptdrain.operator.containers import read_platform

DEFAULT_ANNOTATION = "ckptdrain.io/is-default-class"
CLASS_FIELD = "spec.checkpointClassName"
#: The store settings a class's matching entry fills in: (policy field under
#: spec.storage, class field under spec.stores[]).
STORE_SETTINGS = (("endpoint", "endpoint"), ("region", "region"),
                  ("addressingStyle", "addressingStyle"))
NAMESPACE_PLACEHOLDER = "{namespace}"
#: ClassResolved condition reasons.
RESOLVED, NO_CLASS, NOT_FOUND, INVALID, REFUSED = (
    "Resolved", "NoClass", "ClassNotFound", "ClassInvalid", "RefusedByClass")


def _lower_scheme(uri: str) -> str:
    scheme, sep, rest = uri.partition("://")
    return scheme.lower() + sep + rest if sep else uri


@dataclass(frozen=True)
class Store:
    """One store a class allows: a policy's storage.uri under `uri_prefix`
    (with {namespace} replaced), and the settings it gets from it."""

    uri_prefix: str
    endpoint: str | None = None
    region: str | None = None
    addressing_style: str | None = None

    def prefix_for(self, namespace: str) -> str:
        """The prefix for `namespace`; ValueError for no namespace where the
        prefix has {namespace} (it would widen to the whole bucket)."""
        if not namespace and NAMESPACE_PLACEHOLDER in self.uri_prefix:
            raise ValueError(f"no namespace to put in {self.uri_prefix}")
        return self.uri_prefix.replace(NAMESPACE_PLACEHOLDER, namespace).rstrip("/")

    def admits(self, namespace: str, uri: str) -> bool:
        """`uri` is the prefix or lies below it, segment by segment (a
        prefix s3://b/team-a does not admit s3://b/team-ab); the scheme
        compared without case, as URI schemes are."""
        if not namespace and NAMESPACE_PLACEHOLDER in self.uri_prefix:
            return False
        prefix, uri = _lower_scheme(self.prefix_for(namespace)), _lower_scheme(uri.rstrip("/"))
        return ".." not in uri.split("/") and (uri == prefix or uri.startswith(prefix + "/"))

    def setting(self, class_field: str) -> str | None:
        return {"endpoint": self.endpoint, "region": self.region,
                "addressingStyle": self.addressing_style}[class_field]


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


def _stores(raw: object, problems: list[InvalidInput]) -> tuple[Store, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(InvalidInput("spec.stores", "a list of {uriPrefix, endpoint, region, "
                                     "addressingStyle}", raw))
        return ()
    stores = []
    for index, entry in enumerate(raw):
        where = f"spec.stores[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(InvalidInput(where, "{uriPrefix, endpoint, region, "
                                         "addressingStyle}", entry))
            continue
        found: list[InvalidInput] = []
        prefix = entry.get("uriPrefix")
        if not isinstance(prefix, str) or not prefix:
            found.append(InvalidInput(f"{where}.uriPrefix", "s3://bucket/prefix or "
                                      "gs://bucket/prefix", prefix))
            prefix = ""
        rest = prefix.partition("://")[2]
        placeholders_ok = "{" not in prefix.replace(NAMESPACE_PLACEHOLDER, "") \
            and "}" not in prefix.replace(NAMESPACE_PLACEHOLDER, "")
        if prefix and (not prefix.startswith(("s3://", "gs://")) or not rest.split("/")[0]
                       or ".." in rest.split("/") or not placeholders_ok):
            found.append(InvalidInput(f"{where}.uriPrefix", "s3://bucket/prefix or "
                                      "gs://bucket/prefix, {namespace} the only placeholder",
                                      prefix))
        settings = {key: entry.get(key) for _, key in STORE_SETTINGS}
        for key, value in settings.items():
            if value is not None and (not isinstance(value, str) or not value):
                found.append(InvalidInput(f"{where}.{key}", "a non-empty string", value))
        if not found:
            stores.append(Store(prefix, settings["endpoint"], settings["region"],
                                settings["addressingStyle"]))
        problems += found
    return tuple(stores)


def read(body: Mapping[str, Any]) -> CheckpointClass:
    """The typed class; raises ClassInvalid naming every wrong field."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = body.get("spec") or {}
    problems: list[InvalidInput] = []
    root = _root(spec, problems)
    stores = _stores(spec.get("stores"), problems)
    resources = spec.get("resources")
    if resources is not None:
        try:
            read_platform("spec.resources", resources)
        except InvalidInput as error:
            problems += getattr(error, "problems", None) or [error]
    image = _text(spec, "agentImage", problems)
    weight = spec.get("bandwidthWeight")
    if weight is not None and (not isinstance(weight, int) or isinstance(weight, bool)
                               or not 1 <= weight <= MAX_WEIGHT):
        problems.append(InvalidInput("spec.bandwidthWeight",
                                     f"a whole number from 1 to {MAX_WEIGHT}", weight))
    created = str(meta.get("creationTimestamp", ""))
    default = (meta.get("annotations") or {}).get(DEFAULT_ANNOTATION) == "true"
    if problems:
        raise ClassInvalid(name, problems, created, default)
    return CheckpointClass(
        name=name, created=created, default=default, root=root, stores=stores,
        resources=resources, agent_image=image, bandwidth_weight=weight)


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


def default_choice(classes: Catalogue) -> Choice:
    """The default class: the oldest annotated one (then by name), with a
    warning naming them all when there are several. A class the operator
    cannot use takes part: when it wins, classless policies are refused
    under it (fail closed) rather than fall to the next default or to none,
    which could lift its store allow-list."""
    defaults = sorted((c for c in classes.values() if c.default),
                      key=lambda c: (c.created, c.name))
    if not defaults:
        return Choice(None)
    warning = ""
    if len(defaults) > 1:
        warning = (f"{len(defaults)} CheckpointClasses are marked {DEFAULT_ANNOTATION}: "
                   + ", ".join(c.name for c in defaults)
                   + f"; the oldest, {defaults[0].name}, is the default")
    return Choice(defaults[0], warning=warning)


def choose(spec: Mapping[str, Any], classes: Catalogue) -> Choice:
    """The class a policy's spec names; none when it names none (its class
    was bound when it was created: `default_choice`)."""
    name = spec.get("checkpointClassName")
    if not name:
        return Choice(None)
    cls = classes.get(str(name))
    return Choice(cls) if cls is not None else Choice(None, missing=str(name))


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


def apply_stores(namespace: str, spec: Mapping[str, Any], cls: CheckpointClass
                 ) -> tuple[dict[str, Any], list[InvalidInput]]:
    """The policy's spec with its store's settings filled in where it
    leaves them unset, and the problems: a storage.uri under none of the
    class's prefixes, a setting other than its store's."""
    storage = spec.get("storage")
    uri = storage.get("uri") if isinstance(storage, Mapping) else None
    if not cls.stores or not isinstance(uri, str) or not uri:
        return dict(spec), []  # no allow-list; a missing uri is parse's to name
    if not namespace and any(NAMESPACE_PLACEHOLDER in s.uri_prefix for s in cls.stores):
        return dict(spec), [InvalidInput(
            "metadata.namespace", f"a namespace for the {NAMESPACE_PLACEHOLDER} in the stores "
            f"of CheckpointClass {cls.name}", namespace)]
    store = next((s for s in cls.stores if s.admits(namespace, uri)), None)
    if store is None:
        allowed = ", ".join(s.prefix_for(namespace) for s in cls.stores)
        return dict(spec), [InvalidInput(
            "spec.storage.uri", f"a URI under a store of CheckpointClass {cls.name} "
            f"({allowed})", uri)]
    filled = dict(storage)
    problems = []
    for policy_key, class_key in STORE_SETTINGS:
        given, decided = filled.get(policy_key), store.setting(class_key)
        if decided is None:
            continue
        if given is None:
            filled[policy_key] = decided
        elif str(given).rstrip("/") != decided.rstrip("/"):
            problems.append(InvalidInput(
                f"spec.storage.{policy_key}", f"unset or {decided!r}, what CheckpointClass "
                f"{cls.name} sets for {store.prefix_for(namespace)}", given))
    return {**spec, "storage": filled}, problems


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

    @property
    def resolved(self) -> bool:
        return not self.problems


def resolve(namespace: str, spec: Mapping[str, Any], config: OperatorConfig,
            classes: Catalogue) -> Resolution:
    """Choose the policy's class and apply it."""
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
    filled, problems = apply_stores(namespace, spec, cls)
    return Resolution(classed, filled, cls.name, REFUSED if problems else RESOLVED,
                      tuple(problems), choice.warning)


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
             classes: Catalogue) -> Resolution:
    """`resolve`, raising ClassUnresolved when the class does not take the policy."""
    resolution = resolve(namespace, spec, config, classes)
    if not resolution.resolved:
        raise ClassUnresolved(resolution)
    return resolution

