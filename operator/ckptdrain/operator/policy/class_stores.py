"""The stores a CheckpointClass allows (`spec.stores`): read from the
class, and applied to a policy: its `spec.storage.uri` under one of them,
the matching entry's endpoint, region and addressingStyle filled in where
the policy leaves them unset; and the endpoints an entry vouches for
(`ambientIdentity: true`) receiving its policies' ambient identity without
a credentials Secret, as the chart's `agent.ambientEndpoints` do for every
policy (store/ambient_endpoints.py). Pure, no Kubernetes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import InvalidInput
from ckptdrain.store import ambient_endpoints
from ckptdrain.store.endpoint import parse_endpoint

#: The store settings a class's matching entry fills in: (policy field under
#: spec.storage, class field under spec.stores[]).
STORE_SETTINGS = (("endpoint", "endpoint"), ("region", "region"),
                  ("addressingStyle", "addressingStyle"))
NAMESPACE_PLACEHOLDER = "{namespace}"

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
    #: The platform vouches for `endpoint` receiving its policies' ambient
    #: identity (the pods' own, or the class's spec.identity).
    ambient_identity: bool = False

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


def read_stores(raw: object, problems: list[InvalidInput]) -> tuple[Store, ...]:
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
        ambient = entry.get("ambientIdentity", False)
        if not isinstance(ambient, bool):
            found.append(InvalidInput(f"{where}.ambientIdentity", "true or false", ambient))
        elif ambient:
            found += _vouch_problems(where, prefix, settings["endpoint"])
        if not found:
            stores.append(Store(prefix, settings["endpoint"], settings["region"],
                                settings["addressingStyle"], ambient is True))
        problems += found
    return tuple(stores)


def _vouch_problems(where: str, prefix: str, endpoint: object) -> list[InvalidInput]:
    """Why an entry cannot vouch for its endpoint: it has none (S3's own
    need no vouching), it is not an s3:// store (GCS has its own rule), or
    its endpoint is not one URL (`http(s)://host[:port]`: no wildcard, no
    list, no user:password@; what it vouches for is that one origin)."""
    if prefix and not prefix.startswith("s3://"):
        return [InvalidInput(f"{where}.ambientIdentity", "unset or false with a gs:// "
                             "uriPrefix (GCS is reached with the pod's Google identity)", True)]
    if endpoint is None:
        return [InvalidInput(f"{where}.ambientIdentity", "unset or false without an endpoint "
                             "(S3's own endpoints need no vouching)", True)]
    try:
        parse_endpoint(f"{where}.endpoint", endpoint)
    except InvalidInput as error:
        return [error]
    return []


def vouched(namespace: str, spec: Mapping[str, Any], stores: tuple[Store, ...]
            ) -> tuple[ambient_endpoints.Origin, ...]:
    """The origin of the endpoint the store of the policy's storage.uri
    vouches for (ambientIdentity), as an entry of the platform's ambient
    list; () when its store vouches for none."""
    storage = spec.get("storage")
    uri = storage.get("uri") if isinstance(storage, Mapping) else None
    if not isinstance(uri, str):
        return ()
    store = next((s for s in stores if s.admits(namespace, uri)), None)
    if store is None or not store.ambient_identity or store.endpoint is None:
        return ()
    return (ambient_endpoints.origin(parse_endpoint("spec.stores[].endpoint", store.endpoint)),)


def apply_stores(namespace: str, spec: Mapping[str, Any], class_name: str, stores: tuple[Store, ...]
                 ) -> tuple[dict[str, Any], list[InvalidInput]]:
    """The policy's spec with its store's settings filled in where it
    leaves them unset, and the problems: a storage.uri under none of the
    class's prefixes, a setting other than its store's."""
    storage = spec.get("storage")
    uri = storage.get("uri") if isinstance(storage, Mapping) else None
    if not stores or not isinstance(uri, str) or not uri:
        return dict(spec), []  # no allow-list; a missing uri is parse's to name
    if not namespace and any(NAMESPACE_PLACEHOLDER in s.uri_prefix for s in stores):
        return dict(spec), [InvalidInput(
            "metadata.namespace", f"a namespace for the {NAMESPACE_PLACEHOLDER} in the stores "
            f"of CheckpointClass {class_name}", namespace)]
    store = next((s for s in stores if s.admits(namespace, uri)), None)
    if store is None:
        allowed = ", ".join(s.prefix_for(namespace) for s in stores)
        return dict(spec), [InvalidInput(
            "spec.storage.uri", f"a URI under a store of CheckpointClass {class_name} "
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
                f"{class_name} sets for {store.prefix_for(namespace)}", given))
    return {**spec, "storage": filled}, problems
