"""Hostile bodies for the admission process's HTTPS server
(test_webhook_payloads.py): a hand-written corpus by class, and seeded
mutations of well-formed reviews. Pure: the same SEED gives the same cases,
in the same order, on every run.

Every review carries MARKER where a tenant keeps a secret (an env value, an
annotation, a Secret's data): no answer and no line of the server's log may
hold it."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cluster_helpers

from ckptdrain.operator.admission import rules

SEED = 20261130
MUTATIONS = 160
#: Planted where a tenant's secrets live; never to be seen again.
MARKER = "s3cr3t-0f-tenant-a-9f1c2e"
POD_PATH = f"/{rules.MUTATE_ID}"
POLICY_PATH = f"/{rules.VALIDATE_ID}"
POLICY_CLASS_PATH = f"/{rules.MUTATE_POLICY_ID}"
CONVERT_PATH = "/convert"
ADMISSION_PATHS = (POD_PATH, POLICY_PATH, POLICY_CLASS_PATH)
#: The server's limits (admission/server.py), exceeded by the oversize class.
MAX_REVIEW_BYTES = 4 << 20
MAX_CONVERSION_BYTES = 16 << 20
JSON = {"Content-Type": "application/json"}
#: What a valid case's answer must be (Case.expect): a review that admits,
#: one that admits with a patch, a conversion's Success.
ALLOWED, PATCHED, SUCCESS = "allowed", "allowed with a patch", "Success"
#: What each webhook's answer to its well-formed review must be (the pod:
#: one the sample's policy selects).
WELLFORMED_EXPECT = {POD_PATH: PATCHED, POLICY_PATH: ALLOWED, POLICY_CLASS_PATH: ALLOWED,
                     CONVERT_PATH: SUCCESS}
#: Values of every JSON type, put where another is expected.
WRONG = (None, 0, -1, 2**70, 1.5, True, "", "x", [], [1, "x"], {}, {"a": MARKER})


@dataclass(frozen=True)
class Case:
    """One request: its class (for the figures), path, body and headers.
    `uid`: what the answer must echo when it is a 200 review. `declared`: a
    Content-Length sent with no body at all (an oversize body announced).
    `expect`: for a valid review, what its answer must be (ALLOWED,
    PATCHED, SUCCESS), so that a false refusal fails the sample. `changed`:
    the field a case of webhook_unread.py set to a wrong type, as a refusal
    names it."""

    kind: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    uid: str | None = None
    declared: int | None = None
    method: str = "POST"
    expect: str | None = None
    changed: str | None = None


def pod(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """A trainer pod carrying MARKER in its env and annotations."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer-0", "namespace": namespace, "labels": dict(labels),
                         "annotations": {"example.com/api-token": MARKER}},
            "spec": {"containers": [{
                "name": "trainer", "image": "trainer:1",
                "env": [{"name": "DB_PASSWORD", "value": MARKER},
                        {"name": "AWS_SECRET_ACCESS_KEY", "value": MARKER}]}]}}


def admission(uid: str, namespace: str, obj: Any, kind: str = "Pod",
              group: str = "", operation: str = "CREATE") -> dict[str, Any]:
    """An AdmissionReview as the apiserver sends it."""
    version = "v1alpha1" if group else "v1"
    gvk = {"group": group, "version": version, "kind": kind}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": gvk, "resource": gvk, "requestKind": gvk,
                        "name": "trainer-0", "namespace": namespace, "operation": operation,
                        "userInfo": {"username": "tenant-b"}, "object": obj,
                        "oldObject": None, "dryRun": False}}


def policy(namespace: str) -> dict[str, Any]:
    """A valid CheckpointPolicy carrying MARKER in an annotation."""
    body = cluster_helpers.policy("fuzz")
    body["metadata"].update(namespace=namespace, annotations={"example.com/api-token": MARKER})
    return body


def conversion(uid: str, desired: Any, objects: Any) -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects}}


def _body(review: Any) -> bytes:
    return json.dumps(review).encode()


class Corpus:
    """The cases for one namespace whose policy selects `labels`."""

    def __init__(self, namespace: str, labels: dict[str, str]) -> None:
        self.namespace, self.labels = namespace, labels
        self.count = 0

    def uid(self) -> str:
        self.count += 1
        return f"fuzz-{self.count:05d}"

    def pod_review(self, obj: Any = None) -> dict[str, Any]:
        return admission(self.uid(), self.namespace,
                         pod(self.namespace, self.labels) if obj is None else obj)

    def policy_review(self) -> dict[str, Any]:
        return admission(self.uid(), self.namespace, policy(self.namespace),
                         "CheckpointPolicy", "ckptdrain.io")

    def conversion_review(self) -> dict[str, Any]:
        return conversion(self.uid(), "ckptdrain.io/v1beta1", [policy(self.namespace)])

    def wellformed(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(path, review) of each webhook, as the apiserver sends them."""
        yield POD_PATH, self.pod_review()
        yield POLICY_PATH, self.policy_review()
        review = self.policy_review()
        yield POLICY_CLASS_PATH, review
        yield CONVERT_PATH, self.conversion_review()


    def case(self, kind: str, path: str, review: Any, **extra: Any) -> Case:
        uid = None
        if isinstance(review, dict) and isinstance(review.get("request"), dict):
            found = review["request"].get("uid")
            uid = found if isinstance(found, str) else None
        return Case(kind, path, _body(review), uid=uid, **extra)

    def cases(self) -> list[Case]:
        return [*self.malformed(), *self.wrong_types(), *self.deep(), *self.huge(),
                *self.oversize(), *self.content_types(), *self.wrong_kinds(),
                *self.conversions(), *self.unicode(), *self.uids(), *self.secrets(),
                *self.methods(), *self.mutations()]

    def malformed(self) -> Iterator[Case]:
        bodies = [b"{", b"}", b"[", b'{"apiVersion": ', b"null", b"true", b"42", b'"str"',
                  b"[]", b"{}", b"{'single': 'quotes'}", b'{"a": NaN}', b'{"a": 1} trailing',
                  b"\xff\xfe\x00{", b"\xef\xbb\xbf{}", b'{"a": "\\ud800"}', b"\x00" * 64,
                  b'{"request": {"uid": "x"' + b" " * 1000]
        for body in bodies:
            for path in (POD_PATH, CONVERT_PATH):
                yield Case("malformed JSON", path, body)

    def wrong_types(self) -> Iterator[Case]:
        """Each field the server or the rules read, set to a value of every
        other JSON type."""
        fields: list[tuple[str, Callable[[], dict[str, Any]], tuple[Any, ...]]] = [
            (POD_PATH, self.pod_review, (
                ("apiVersion",), ("kind",), ("request",), ("request", "uid"),
                ("request", "namespace"), ("request", "operation"), ("request", "object"),
                ("request", "dryRun"), ("request", "object", "metadata"),
                ("request", "object", "metadata", "labels"),
                ("request", "object", "metadata", "annotations"),
                ("request", "object", "metadata", "name"), ("request", "object", "spec"),
                ("request", "object", "spec", "containers"),
                ("request", "object", "spec", "containers", 0),
                ("request", "object", "spec", "containers", 0, "env"),
                ("request", "object", "spec", "containers", 0, "env", 0),
                ("request", "object", "spec", "containers", 0, "name"),
                ("request", "object", "spec", "initContainers"),
                ("request", "object", "spec", "volumes"))),
            (POLICY_PATH, self.policy_review, (
                ("request",), ("request", "uid"), ("request", "operation"),
                ("request", "requestKind"), ("request", "object"),
                ("request", "oldObject"), ("request", "object", "metadata"),
                ("request", "object", "spec"), ("request", "object", "spec", "storage"),
                ("request", "object", "spec", "selector"))),
            (CONVERT_PATH, self.conversion_review, (
                ("request",), ("request", "uid"), ("request", "desiredAPIVersion"),
                ("request", "objects"), ("request", "objects", 0),
                ("request", "objects", 0, "apiVersion"), ("request", "objects", 0, "metadata"),
                ("request", "objects", 0, "spec"))),
        ]
        rng = random.Random(SEED)
        for path, make, where in fields:
            for at in where:
                for value in rng.sample(WRONG, 6):
                    review = make()
                    _set(review, at, copy.deepcopy(value))
                    yield self.case("wrong type", path, review)

    def deep(self) -> Iterator[Case]:
        for depth in (100, 990, 5_000, 100_000):
            nested = "[" * depth + "]" * depth
            for path in (POD_PATH, CONVERT_PATH):
                yield Case("deep nesting", path, nested.encode())
                labels = ('{"a":' * depth) + "1" + "}" * depth
                body = _body(self.pod_review()).replace(b'"labels": {', b'"labels": {"deep": '
                                                        + labels.encode() + b", ", 1)
                yield self.case("deep nesting", path, json.loads(body)) if depth < 900 \
                    else Case("deep nesting", path, body)

    def huge(self) -> Iterator[Case]:
        big = "x" * (3 << 20)
        review = self.pod_review()
        review["request"]["object"]["metadata"]["annotations"]["big"] = big
        yield self.case("huge values", POD_PATH, review)
        review = self.pod_review()
        review["request"]["uid"] = "u" * (1 << 20)
        yield self.case("huge values", POD_PATH, review)
        many = pod(self.namespace, self.labels)
        trainer = many["spec"]["containers"][0]
        many["spec"]["containers"] = [dict(trainer, name=f"c{i}") for i in range(5_000)]
        yield self.case("huge values", POD_PATH, self.pod_review(many))
        env = pod(self.namespace, self.labels)
        env["spec"]["containers"][0]["env"] = [{"name": f"E{i}", "value": MARKER}
                                               for i in range(40_000)]
        yield self.case("huge values", POD_PATH, self.pod_review(env))
        review = self.pod_review()
        review["request"]["object"]["spec"]["volumes"] = list(range(400_000))
        yield self.case("huge values", POD_PATH, review)
        policies = [policy(self.namespace) for _ in range(20_000)]
        yield self.case("huge values", CONVERT_PATH,
                        conversion(self.uid(), "ckptdrain.io/v1beta1", policies))

    def oversize(self) -> Iterator[Case]:
        for path, limit in ((POD_PATH, MAX_REVIEW_BYTES), (CONVERT_PATH, MAX_CONVERSION_BYTES)):
            for declared in (limit + 1, 1 << 40, 10**30):
                yield Case("oversized body", path, b"", declared=declared)
            yield Case("oversized body", path, b" " * (limit + 1) + b"{}")
        for length in ("-1", "abc", "0x10", ""):
            yield Case("oversized body", POD_PATH, b"{}",
                       headers={**JSON, "Content-Length": length})
        yield Case("oversized body", POD_PATH, b"{}",
                   headers={**JSON, "Transfer-Encoding": "chunked"})

    def content_types(self) -> Iterator[Case]:
        for kind in ("text/plain", "application/yaml", "multipart/form-data; boundary=x",
                     "application/x-www-form-urlencoded", "application/json; charset=utf-16"):
            for path, review in self.wellformed():
                # Read as JSON whatever it says (the apiserver sends JSON).
                yield Case("wrong Content-Type", path, _body(review),
                           headers={"Content-Type": kind}, uid=review["request"]["uid"],
                           expect=WELLFORMED_EXPECT[path])
        yield Case("wrong Content-Type", POD_PATH, b"apiVersion: v1\nkind: Pod\n",
                   headers={"Content-Type": "application/yaml"})

    def wrong_kinds(self) -> Iterator[Case]:
        for api, kind in (("admission.k8s.io/v2", "AdmissionReview"), ("v1", "Pod"),
                          ("apiextensions.k8s.io/v1", "ConversionReview"),
                          ("admission.k8s.io/v1", "ConversionReview"), ("", ""),
                          ("admission.k8s.io/v1", "AdmissionReviewList")):
            for path, review in self.wellformed():
                review.update(apiVersion=api, kind=kind)
                yield self.case("wrong kind/apiVersion", path, review)

    def conversions(self) -> Iterator[Case]:
        one = [policy(self.namespace)]
        for desired in ("ckptdrain.io/v9", "apps/v1", "v1", "", "ckptdrain.io/",
                        "ckptdrain.io/v1beta1/extra"):
            yield self.case("ConversionReview, unknown desiredAPIVersion", CONVERT_PATH,
                            conversion(self.uid(), desired, copy.deepcopy(one)))
        secret = {"apiVersion": "v1", "kind": "Secret", "data": {"token": MARKER},
                  "metadata": {"name": "s", "annotations": {"t": MARKER}}}
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "d"}, "spec": {"template": pod("x", {})}}
        other = {**policy(self.namespace), "apiVersion": "other.example.com/v1alpha1"}
        for obj in (secret, deployment, other, {**policy(self.namespace), "kind": "Other"}):
            yield self.case("objects of another group/kind", CONVERT_PATH,
                            conversion(self.uid(), "ckptdrain.io/v1beta1", [obj]))
            yield self.case("objects of another group/kind", POD_PATH, self.pod_review(obj))
            yield self.case("objects of another group/kind", POLICY_PATH,
                            admission(self.uid(), self.namespace, obj, "CheckpointPolicy",
                                      "ckptdrain.io"))

    def unicode(self) -> Iterator[Case]:
        odd = ("a\x00b", "\u202eevil", "\ud800", "名前", "😀" * 60, "../../etc", "a" * 300,
               "\n\r\t", "UPPER", "-x-")
        for name in odd:
            obj = pod(self.namespace, self.labels)
            obj["metadata"]["name"] = name
            obj["metadata"]["labels"] = {**self.labels, name: name}
            obj["spec"]["containers"][0]["name"] = name
            yield self.case("unicode/NUL in names", POD_PATH, self.pod_review(obj))
            review = self.pod_review()
            review["request"]["namespace"] = name
            yield self.case("unicode/NUL in names", POD_PATH, review)
            review = self.policy_review()
            review["request"]["object"]["metadata"]["name"] = name
            yield self.case("unicode/NUL in names", POLICY_PATH, review)
        for path in ("/ckptdrain-inject%00", "/%2e%2e/convert", "/名前", "/convert/../x", "//",
                     "/ckptdrain-inject?timeout=abc", "/ckptdrain-inject?timeout=-5s"):
            yield self.case("unicode/NUL in names", path, self.pod_review())

    def uids(self) -> Iterator[Case]:
        for uid in ("", " ", "\x00", "\ud800x", "名前-uid", '"}{"injected":1', "<script>",
                    "u" * 10_000):
            for path, review in self.wellformed():
                review["request"]["uid"] = uid
                yield self.case("uid echoed", path, review)

    def secrets(self) -> Iterator[Case]:
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": MARKER},
                  "data": {"password": MARKER}, "stringData": {"token": MARKER}}
        for path in ADMISSION_PATHS:
            yield self.case("secrets planted", path, admission(
                self.uid(), self.namespace, secret, "Secret"), expect=ALLOWED)
        obj = pod(self.namespace, self.labels)
        obj["spec"]["containers"][0]["env"].append(
            {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": MARKER, "key": MARKER}}})
        obj["spec"]["initContainers"] = [{"name": "init", "image": "i",
                                          "env": [{"name": "P", "value": MARKER}]}]
        yield self.case("secrets planted", POD_PATH, self.pod_review(obj), expect=PATCHED)
        review = self.pod_review()
        review["request"]["oldObject"] = {"data": {"k": MARKER}}
        review["request"]["operation"] = "UPDATE"
        yield self.case("secrets planted", POD_PATH, review, expect=ALLOWED)

    def methods(self) -> Iterator[Case]:
        for method in ("GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"):
            yield Case("other methods", POD_PATH, b"", method=method,
                       headers={"Content-Length": "0"})

    def mutations(self) -> Iterator[Case]:
        """Seeded mutations of the well-formed reviews: a value replaced by
        one of another type, a key dropped, a list emptied or repeated."""
        rng = random.Random(SEED + 1)
        for _ in range(MUTATIONS):
            path, review = rng.choice(list(self.wellformed()))
            for _ in range(rng.randint(1, 3)):
                at = rng.choice(list(paths(review)))
                action = rng.randrange(3)
                if action == 0:
                    _set(review, at, copy.deepcopy(rng.choice(WRONG)))
                elif action == 1 and at:
                    parent = get_at(review, at[:-1])
                    parent.pop(at[-1]) if isinstance(parent, (dict, list)) else None
                else:
                    value = get_at(review, at)
                    _set(review, at, [copy.deepcopy(value)] * rng.choice((0, 2, 50)))
            yield self.case("seeded mutations", path, review)


def paths(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if at:
        yield at
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, (*at, index))


def get_at(node: Any, at: tuple[Any, ...]) -> Any:
    for step in at:
        node = node[step]
    return node


def _set(review: Any, at: tuple[Any, ...], value: Any) -> None:
    """`value` at `at`, making what is missing on the way (a dict)."""
    node = review
    for step in at[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(step), (dict, list)):
            node[step] = {}
        node = node[step]
    if isinstance(node, list) and isinstance(at[-1], int) and at[-1] >= len(node):
        node.append(value)
    else:
        node[at[-1]] = value
