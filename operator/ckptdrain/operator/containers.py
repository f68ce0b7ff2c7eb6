"""The resources of the containers ckptdrain injects: the platform's block
(operator configuration, CKPTDRAIN_CONTAINERS) and a policy's overrides
(`spec.resources`), read and merged. Pure.

The platform block has the shape a cluster-scoped class will carry:

    {"qos": "MatchPod",
     "agent":   {"requests": {"cpu": "100m", "memory": "256Mi"},
                 "limits": {"memory": "1Gi"},
                 "guaranteed": {"cpu": "1", "memory": "1Gi"},
                 "max": {"cpu": "2", "memory": "8Gi"}},
     "restore": {...}, "peer": {...}, "prepare": {...}}

`requests` and `limits` are what a pod gets as it is (what every injected
pod got before these were configurable, DEFAULT_CONTAINERS);
`guaranteed` the cpu and memory used as requests and limits both where the
pod must stay Guaranteed. A container or one of its keys left out keeps its
default; a key given replaces that key's map. A policy overrides single
amounts of `requests`, `limits` and `guaranteed`: its admission refuses one
above the platform's `max`; at pod admission, where the platform lowered
`max` since, the amount is cut to it with a note (never a pod left without
its containers). How `qos` shapes what is injected into a given pod is
admission/resources.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from ckptdrain.errors import InvalidInput
from ckptdrain.quantity import parse_quantity

AGENT, RESTORE, PEER, PREPARE = "agent", "restore", "peer", "prepare"
NAMES = (AGENT, RESTORE, PEER, PREPARE)
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
#: MatchPod: a Guaranteed pod stays Guaranteed (limits equal to requests),
#: any other pod gets the configured shape; Burstable: always the configured
#: shape; Guaranteed: always limits equal to requests.
QOS_MODES = ("MatchPod", "Burstable", "Guaranteed")
#: What the kubelet's QoS class looks at.
QOS_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class Resources:
    """One container's amounts, as quantity strings (written to the pod as
    given); `guaranteed` the cpu and memory for a pod that stays Guaranteed;
    `max` bounds what a policy may ask for."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    guaranteed: Mapping[str, str] = field(default_factory=dict)
    max: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Containers:
    """The platform's block, or a policy's effective one (merged)."""

    qos: str = "MatchPod"
    agent: Resources = field(default_factory=Resources)
    restore: Resources = field(default_factory=Resources)
    peer: Resources = field(default_factory=Resources)
    prepare: Resources = field(default_factory=Resources)

    def of(self, name: str) -> Resources:
        return {AGENT: self.agent, RESTORE: self.restore, PEER: self.peer,
                PREPARE: self.prepare}[name]


#: The amounts a policy may override (`max` is the platform's alone).
AMOUNT_KEYS = ("requests", "limits", "guaranteed")
PLATFORM_KEYS = (*AMOUNT_KEYS, "max")

# Guaranteed: a whole core, so a checksum, an upload, a restore or the flush
# after SIGTERM is never throttled to the burstable shape's 100m.
_SIDECAR = Resources(requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "1Gi"},
                     guaranteed={"cpu": "1", "memory": "1Gi"},
                     max={"cpu": "2", "memory": "8Gi"})
DEFAULT_CONTAINERS = Containers(
    qos="MatchPod", agent=_SIDECAR, restore=_SIDECAR, peer=_SIDECAR,
    # chown and chmod of two directories: next to nothing.
    prepare=Resources(requests={"cpu": "10m", "memory": "32Mi"}, limits={"memory": "64Mi"},
                      guaranteed={"cpu": "100m", "memory": "64Mi"},
                      max={"cpu": "1", "memory": "1Gi"}))

NO_DISK_LIMIT = ("no ephemeral-storage limit: the kubelet adds the containers' "
                 "ephemeral-storage limits into one for the whole pod and evicts the pod "
                 "when all its containers and emptyDir volumes together pass it, so any "
                 "such limit caps the training pod's disk; give a request only")


def quantity_text(where: str, value: object) -> str:
    """`value` as the quantity text written to a pod: a string stripped, a
    whole JSON number as its digits; a fraction or an exponent number is
    refused (its text is not a quantity the apiserver reads back alike)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if not isinstance(value, str):
        raise InvalidInput(where, "a Kubernetes quantity as a string such as 100m, 1.5 or "
                           "256Mi, or a whole number", value)
    text = value.strip()
    parse_quantity(where, text)
    return text


def _amounts(field_path: str, raw: object, problems: list[InvalidInput],
             names: tuple[str, ...] = RESOURCE_NAMES) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(InvalidInput(field_path, "a map such as {cpu: 100m, memory: 256Mi}",
                                     raw))
        return {}
    out: dict[str, str] = {}
    for name, value in raw.items():
        where = f"{field_path}.{name}"
        if name == "ephemeral-storage" and field_path.endswith(".limits"):
            problems.append(InvalidInput(where, NO_DISK_LIMIT, value))
            continue
        if name not in names:
            problems.append(InvalidInput(where, "one of " + ", ".join(names), name))
            continue
        try:
            out[name] = quantity_text(where, value)
        except InvalidInput as error:
            problems.append(error)
    return out


def _amount(text: str) -> Fraction:
    return parse_quantity("", text)


def read_block(field_path: str, raw: object, *, platform: bool,
               problems: list[InvalidInput]) -> tuple[Resources, set[str]] | None:
    """One container's block at `field_path` (with `platform`, `max` too)
    and the keys it gives. Problems are appended, each naming its field;
    None when unusable."""
    keys = PLATFORM_KEYS if platform else AMOUNT_KEYS
    if not isinstance(raw, Mapping):
        problems.append(InvalidInput(field_path, "{" + ", ".join(keys) + "}", raw))
        return None
    for key in raw:
        if key not in keys:
            problems.append(InvalidInput(f"{field_path}.{key}", "one of " + ", ".join(keys),
                                         key))
    block = Resources(**{k: _amounts(f"{field_path}.{k}", raw.get(k), problems,
                                     QOS_RESOURCES if k == "guaranteed" else RESOURCE_NAMES)
                         for k in keys})
    return block, {k for k in keys if k in raw}


def bound_problems(field_path: str, res: Resources, bound: Mapping[str, str],
                   asked: Resources | None = None) -> list[InvalidInput]:
    """requests above limits, and (of what `asked` names; all when None) an
    amount above `bound`, each naming its field."""
    problems = []
    for name, request in res.requests.items():
        limit = res.limits.get(name)
        if limit is None or _amount(request) <= _amount(limit):
            continue
        if asked is not None and name in asked.limits and name not in asked.requests:
            problems.append(InvalidInput(  # the limit is what was asked for
                f"{field_path}.limits.{name}",
                f"at least the request ({request}); lower {field_path}.requests.{name} with it",
                limit))
        else:
            problems.append(InvalidInput(
                f"{field_path}.requests.{name}",
                f"at most the limit ({limit}); raise {field_path}.limits.{name} with it", request))
    named = res if asked is None else asked
    for kind in AMOUNT_KEYS:
        for name in getattr(named, kind):
            value, most = getattr(res, kind)[name], bound.get(name)
            if most is not None and _amount(value) > _amount(most):
                problems.append(InvalidInput(f"{field_path}.{kind}.{name}",
                                             f"at most {most} (the platform's max)", value))
    return problems


def qos_problems(field_path: str, res: Resources, qos: str) -> list[InvalidInput]:
    """With a mode that can keep a pod Guaranteed, a `guaranteed` cpu and
    memory above 0 (a limit of 0 does not count for the kubelet)."""
    if qos == "Burstable":
        return []
    problems = []
    for name in QOS_RESOURCES:
        amount = res.guaranteed.get(name)
        if amount is None or _amount(amount) <= 0:
            problems.append(InvalidInput(
                f"{field_path}.guaranteed.{name}",
                f"an amount above 0 with qos {qos} (a Guaranteed pod needs one)", amount))
    return problems


def clamp(field_path: str, res: Resources, notes: list[str]) -> Resources:
    """`res` with each amount above its `max` cut to it, and a limit below
    its request raised to it, each change noted naming its field: a policy
    admitted under an older platform block still gets its containers."""
    cut = {kind: dict(getattr(res, kind)) for kind in AMOUNT_KEYS}
    for kind, amounts in cut.items():
        for name, value in amounts.items():
            most = res.max.get(name)
            if most is not None and _amount(value) > _amount(most):
                amounts[name] = most
                notes.append(f"{field_path}.{kind}.{name}: {value} is above the platform's "
                             f"max ({most}); {most} is used")
    for name, request in cut["requests"].items():
        limit = cut["limits"].get(name)
        if limit is not None and _amount(request) > _amount(limit):
            cut["limits"][name] = request
            notes.append(f"{field_path}.limits.{name}: {limit} is below the request "
                         f"({request}); {request} is used")
    return replace(res, **cut)


def qos_fallback(field_path: str, res: Resources, platform: Resources, qos: str,
                 notes: list[str]) -> Resources:
    """`res` with each guaranteed amount that `qos` refuses (a policy
    admitted under Burstable, whose qos changed since) replaced by the
    platform's own (checked against its qos when it was read), each change
    noted naming its field: the pods keep their containers."""
    refused = {p.field.rsplit(".", 1)[1] for p in qos_problems(field_path, res, qos)}
    guaranteed = dict(res.guaranteed)
    for name in sorted(refused):
        fallback = platform.guaranteed.get(name)
        if fallback is None or _amount(fallback) <= 0:
            continue  # nothing to fall back to: qos_problems names it
        notes.append(f"{field_path}.guaranteed.{name}: {guaranteed.get(name)} is not above 0, "
                     f"which qos {qos} needs; the platform's {fallback} is used")
        guaranteed[name] = fallback
    return replace(res, guaranteed=guaranteed)


def read_platform(field_path: str, raw: object,
                  base: Containers = DEFAULT_CONTAINERS) -> Containers:
    """The platform's block, checked whole, over `base` (the defaults; a
    CheckpointClass's block goes over the operator's own); raises one
    InvalidInput listing every problem, each naming its field under
    `field_path`."""
    problems: list[InvalidInput] = []
    if not isinstance(raw, Mapping):
        raise InvalidInput(field_path, "a map {qos, agent, restore, peer, prepare}", raw)
    qos = raw.get("qos", base.qos)
    if qos not in QOS_MODES:
        problems.append(InvalidInput(f"{field_path}.qos", "one of " + ", ".join(QOS_MODES), qos))
    blocks: dict[str, Resources] = {}
    for key, value in raw.items():
        if key == "qos":
            continue
        if key not in NAMES:
            problems.append(InvalidInput(f"{field_path}.{key}",
                                         "one of qos, " + ", ".join(NAMES), key))
            continue
        read = read_block(f"{field_path}.{key}", value, platform=True, problems=problems)
        if read is None:
            continue
        given, keys = read
        # Per key, as the chart merges values: `requests` alone keeps `max`.
        block = replace(base.of(key), **{k: getattr(given, k) for k in keys})
        blocks[key] = block
        problems += bound_problems(f"{field_path}.{key}", block, block.max)
        problems += qos_problems(f"{field_path}.{key}", block, str(qos))
    for key in NAMES:
        # A qos given over another base must fit the blocks it keeps, too.
        if key not in blocks and qos in QOS_MODES:
            problems += qos_problems(f"{field_path}.{key}", base.of(key), str(qos))
    if problems:
        raise Problems(problems)
    return replace(base, qos=str(qos), **blocks)


def read_platform_json(variable: str, text: str) -> Containers:
    """The platform's block from an environment variable holding JSON."""
    try:
        raw: Any = json.loads(text)
    except ValueError:
        raise InvalidInput(variable, "JSON such as {\"agent\": {\"requests\": "
                           "{\"cpu\": \"100m\"}}}", text) from None
    return read_platform(variable, raw)


def to_raw(containers: Containers) -> dict[str, Any]:
    """`containers` as the JSON CKPTDRAIN_CONTAINERS holds, every key given."""
    return {"qos": containers.qos, **{
        name: {key: dict(getattr(containers.of(name), key)) for key in PLATFORM_KEYS}
        for name in NAMES}}


def merge(field_path: str, platform: Containers, raw: object,
          problems: list[InvalidInput], notes: list[str] | None = None) -> Containers:
    """The platform's block with a policy's overrides (`raw`, at
    `field_path`, e.g. spec.resources) applied; every problem appended.
    Without `notes` (a policy's own admission) an amount beyond the
    platform's bounds, or a guaranteed amount its qos refuses, is a problem;
    with them (a pod's admission, where the platform may have changed since)
    it is clamped, or the platform's guaranteed amount used, and noted."""
    if raw is None:
        return platform
    if not isinstance(raw, Mapping):
        problems.append(InvalidInput(field_path, "a map {" + ", ".join(NAMES) + "}", raw))
        return platform
    merged: dict[str, Resources] = {}
    for key, value in raw.items():
        if key not in NAMES:
            problems.append(InvalidInput(f"{field_path}.{key}", "one of " + ", ".join(NAMES),
                                         key))
            continue
        read = read_block(f"{field_path}.{key}", value, platform=False, problems=problems)
        if read is None:
            continue
        asked = read[0]
        base = platform.of(key)
        effective = Resources(requests={**base.requests, **asked.requests},
                              limits={**base.limits, **asked.limits},
                              guaranteed={**base.guaranteed, **asked.guaranteed}, max=base.max)
        if notes is None:
            problems += bound_problems(f"{field_path}.{key}", effective, base.max, asked)
        else:
            effective = clamp(f"{field_path}.{key}", effective, notes)
            effective = qos_fallback(f"{field_path}.{key}", effective, base, platform.qos,
                                     notes)
        problems += qos_problems(f"{field_path}.{key}", effective, platform.qos)
        merged[key] = effective
    return replace(platform, **merged)


class Problems(InvalidInput):
    """Every problem of a block at once, each naming its field."""

    def __init__(self, problems: list[InvalidInput]) -> None:
        first = problems[0]
        super().__init__(first.field, first.expected, first.seen)
        self.args = ("; ".join(str(p) for p in problems),)

    def __str__(self) -> str:
        return str(self.args[0])
