"""A CheckpointPolicy spec, read and checked: pure, no Kubernetes.

`parse` turns the spec (a plain dict, as the apiserver stores it) into a
typed `Policy` with the `SizingInput` the sizing model needs. `validate`
collects every semantic problem the schema cannot express, each an
`InvalidInput` naming the field (`spec.overlap`, `spec.localTier.path`, …),
what was expected and what was seen.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptdrain import sizing, units
from ckptdrain.contract import api, share
from ckptdrain.contract.cold import cold_class_problem
from ckptdrain.contract.drain import DEFAULT_STALL_AFTER, parse_stall_timeout
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.containers import DEFAULT_CONTAINERS, Containers, merge
from ckptdrain.operator.policy import relocation, selectors
from ckptdrain.operator.policy.fields import (
    Reader,
    choice,
    flag,
    number,
    read_identity,
    read_placement,
    seconds_or_zero,
    text,
)
from ckptdrain.operator.policy.identity import Rule
from ckptdrain.operator.policy.peer_tier import PeerTier
from ckptdrain.operator.policy.peer_tier import read as read_peer_tier
from ckptdrain.operator.policy.storage_options import StorageOptions
from ckptdrain.operator.policy.storage_options import read as read_storage_options
from ckptdrain.store import ambient_endpoints, parse_store_uri
from ckptdrain.store.endpoint import parse_endpoint

GRACE_POLICIES = ("Warn", "Refuse")
RESTORE_PREFER = ("local", "global")
#: spec.readers: which pods restore without writing (policy/roles.py).
READERS = ("Declared", "Replicas")
#: spec.restore.reshard: who loads a newest step saved by another writer count.
RESHARD = ("DCP", "Trainer")
DEFAULT_LOCAL_KEEP = 2
DEFAULT_GLOBAL_KEEP = 3
MAX_LABEL_VALUE = api.MAX_LABEL_VALUE
#: How long restore retries a store that does not answer (restore/retry.py).
DEFAULT_RETRY_DEADLINE_S = 600.0
#: How long a multi-writer restore waits for every rank to report (restore/agreement.py).
DEFAULT_AGREE_TIMEOUT_S = 60.0
#: What is expected of spec.model, and of a checkpointBytes of zero
#: (said in v1beta1's spellings by policy/version_messages.py).
MODEL_EXPECTED = "model.parameters (e.g. 405B) or model.checkpointBytes (e.g. 5.67TB)"
FINITE_SIZE_EXPECTED = ("a value whose model.parameters × model.bytesPerParameter (the "
                        "checkpoint size in bytes) is a finite number, e.g. 14 bytes per parameter")
POSITIVE_SIZE_EXPECTED = "a positive size such as 5.67TB"


class PolicyInvalid(InvalidInput):
    """One or more fields are wrong; `errors` holds each, the message all."""

    def __init__(self, errors: list[InvalidInput]) -> None:
        self.errors = errors
        first = errors[0]
        super().__init__(first.field, first.expected, first.seen)
        self.args = ("; ".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class SecretRef:
    name: str
    access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"


@dataclass(frozen=True)
class Policy:
    namespace: str
    name: str
    selector: Mapping[str, Any]
    sizing_input: sizing.SizingInput
    writers: int
    interval_s: float
    local_path: str
    local_keep: int
    local_capacity: int | None
    memory_limit: str | None
    store_uri: str
    endpoint: str | None
    region: str | None
    credentials: SecretRef | None
    global_keep: int
    schedule: bool
    sigterm: bool
    restore_enabled: bool
    restore_prefer: str
    grace_policy: str
    per_drainer_cap: float | None
    identity: Rule | None = None
    restore_retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S
    restore_agree_timeout_s: float = DEFAULT_AGREE_TIMEOUT_S
    #: Restore onto a local disk by direct I/O (transfer/direct_io.py).
    restore_direct_io: bool = True
    #: spec.drain.stallTimeout: seconds without progress before a drain attempt fails.
    stall_timeout_s: float = DEFAULT_STALL_AFTER
    #: spec.storage.trainerAccess: the application containers get the
    #: namespace's store identity too (admission/tenant_identity.py).
    trainer_access: bool = False
    #: spec.storage.encryption / caBundle / addressingStyle (policy/storage_options.py).
    storage_options: StorageOptions = field(default_factory=StorageOptions)
    #: spec.placement: node requirements ANDed into the pod's required node
    #: affinity, and tolerations added to the pod's (Kubernetes' own shapes).
    node_expressions: tuple[dict[str, Any], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()
    #: spec.peerTier (policy/peer_tier.py): a copy of each writer's newest local steps
    #: on a partner node.
    peer: PeerTier = field(default_factory=PeerTier)
    #: spec.readers: "Declared" (only pods annotated ckptdrain.io/role: reader)
    #: or "Replicas" (also every pod ranked at or past `writers`).
    readers: str = "Declared"
    #: spec.restore.reshard (restore/reshard.py).
    restore_reshard: str = "DCP"
    #: The injected containers' resources: the platform's (operator config)
    #: with spec.resources merged, within its max (operator/containers.py).
    containers: Containers = DEFAULT_CONTAINERS
    #: spec.resources amounts the platform's block no longer allows, each
    #: with what is used instead (a pod's admission warns with them).
    resource_notes: tuple[str, ...] = ()
    #: spec.relocation: why the checkpoints last moved ("" when unset), and
    #: whether to start from step 0 at the new location although checkpoints
    #: exist at an earlier one (policy/history.py).
    relocation_reason: str = ""
    start_fresh: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def checkpoint_bytes(self) -> float:
        return sizing.checkpoint_size(self.sizing_input)

    def store_prefix(self) -> str:
        """Where this policy's global tier is: one prefix per namespace/policy
        under spec.storage.uri (per the pod contract)."""
        return self.store_uri.rstrip("/") + f"/{self.namespace}/{self.name}"

    def node_path(self) -> str:
        """hostPath of this policy's local tier on every node (per the pod contract)."""
        return posixpath.join(self.local_path, self.namespace, self.name)


def _read_storage(r: Reader) -> tuple[str, SecretRef | None]:
    uri = r.get("storage.uri", text, "")
    if not uri:
        r.fail("storage.uri", "a URI such as s3://bucket/prefix, gs://bucket/prefix or "
               "file:///path",
               r.raw("storage.uri"))
    else:
        # The parser `ckptdrain push` and the agent use: a URI the webhook
        # admits is one the agent can open.
        try:
            parse_store_uri(uri)
        except InvalidInput as error:
            r.fail("storage.uri", error.expected, error.seen)
    ref = r.raw("storage.credentialsSecretRef")
    if ref is None:
        return uri, None
    if not isinstance(ref, Mapping):
        r.fail("storage.credentialsSecretRef", "{name, accessKeyIdKey, secretAccessKeyKey}", ref)
        return uri, None
    name = r.get("storage.credentialsSecretRef.name", text, "")
    if not name:
        r.fail("storage.credentialsSecretRef.name", "the name of a Secret", ref.get("name"))
    return uri, SecretRef(
        name=name,
        access_key_id_key=r.get("storage.credentialsSecretRef.accessKeyIdKey", text,
                                "AWS_ACCESS_KEY_ID"),
        secret_access_key_key=r.get("storage.credentialsSecretRef.secretAccessKeyKey", text,
                                    "AWS_SECRET_ACCESS_KEY"),
    )


def _check_local_path(r: Reader, path: str, config: OperatorConfig) -> None:
    norm = posixpath.normpath(path) if path.startswith("/") else ""
    root = config.allowed_root.rstrip("/")
    if not norm or ".." in path.split("/") or not (norm == root or norm.startswith(root + "/")):
        r.fail("localTier.path", f"an absolute path under {config.allowed_root}", path)


def _read(namespace: str, name: str, spec: Mapping[str, Any], config: OperatorConfig,
          drainers: int, *, strict: bool = False) -> tuple[Policy | None, list[InvalidInput]]:
    r = Reader(spec)
    if not isinstance(spec.get("selector"), Mapping):
        r.fail("selector", "a label selector (matchLabels / matchExpressions)",
               spec.get("selector"))
    elif strict:
        # A selector no pod can satisfy as written would also give overlap
        # checks a witness no pod can carry. Admission only: a policy stored
        # before these checks keeps parsing (and injecting) as it did.
        for path, expected, seen in selectors.problems(spec["selector"]):
            r.fail(path, expected, seen)
    params = r.get("model.parameters", units.parse_count, None)
    per_param = r.get("model.bytesPerParameter", number, sizing.DEFAULT_BYTES_PER_PARAMETER)
    ckpt_bytes = r.get("model.checkpointBytes", units.parse_bytes, None)
    if r.raw("model.parameters") is None and r.raw("model.checkpointBytes") is None:
        r.fail("model", MODEL_EXPECTED, spec.get("model"))
    if ckpt_bytes == 0:
        r.fail("model.checkpointBytes", POSITIVE_SIZE_EXPECTED, 0)
    if ckpt_bytes is None and params and not math.isfinite(params * per_param):
        # Each factor finite (the schema takes 1e300), their product not.
        field = "model.bytesPerParameter" if r.raw("model.bytesPerParameter") is not None \
            else "model.parameters"
        r.fail(field, FINITE_SIZE_EXPECTED, r.raw(field))
    interval = r.get("interval", units.parse_duration, None)
    mtti = r.get("mtti", units.parse_duration, None)
    if interval is None and mtti is None and r.raw("interval") is None \
            and r.raw("mtti") is None:
        r.fail("interval", "interval (e.g. 15m) or mtti (e.g. 150m)", None)
    overlap = r.get("overlap", units.parse_fraction, sizing.DEFAULT_OVERLAP)
    global_every = r.get("globalEvery", units.parse_positive_int, 1)
    writers = r.get("writers", units.parse_positive_int, 1)
    write_s = r.get("localWriteTime", units.parse_duration, None)
    cap = r.get("caps.bandwidth", units.parse_rate, None)
    per_drainer = r.get("caps.perDrainer", units.parse_rate, None)
    if cap is not None and per_drainer is not None and per_drainer > cap:
        # Bounds rounded towards what they allow: pasted back, they are met.
        r.fail("caps.perDrainer",
               f"at most caps.bandwidth ({units.format_rate(cap, units.DOWN)})",
               r.raw("caps.perDrainer"))
    path = r.get("localTier.path", text, "")
    if not path:
        r.fail("localTier.path", f"an absolute path under {config.allowed_root}",
               r.raw("localTier.path"))
    else:
        _check_local_path(r, path, config)
    keep = r.get("localTier.keep", units.parse_positive_int, DEFAULT_LOCAL_KEEP)
    capacity = r.get("localTier.capacity", units.parse_bytes, None)
    memory = r.raw("localTier.memory.sizeLimit")
    memory_bytes = r.get("localTier.memory.sizeLimit", units.parse_bytes, None)
    uri, secret = _read_storage(r)
    inp = sizing.SizingInput(
        parameters=params, bytes_per_parameter=per_param, checkpoint_bytes=ckpt_bytes,
        interval_s=interval, mtti_s=mtti, overlap=overlap, global_every=global_every,
        local_write_s=write_s, policy_cap=cap, cluster_cap=config.cluster_bandwidth,
        drainers=max(1, drainers))
    if not r.errors:
        shard = sizing.checkpoint_size(inp) / writers
        # The hard minimum stays what policies were stored with: a stricter one
        # would make a stored policy unreadable, and its pods uninjected. The
        # trainer's work dir on this disk (no memory tier) is the agent's to
        # fit (node/space.py); docs/pod-contract.md says how to size for it.
        if capacity is not None and capacity < (keep + 1) * shard:
            r.fail("localTier.capacity",
                   f"at least {units.format_bytes((keep + 1) * shard, units.UP)} "
                   f"(keep={keep} checkpoints plus the one being captured, "
                   f"{units.format_bytes(shard)} per writer)", r.raw("localTier.capacity"))
        if memory_bytes is not None and memory_bytes < shard:
            r.fail("localTier.memory.sizeLimit",
                   f"at least one checkpoint shard, {units.format_bytes(shard, units.UP)} "
                   "per writer",
                   memory)
    endpoint = r.get("storage.endpoint", parse_endpoint, None)
    region = r.get("storage.region", text, None)
    global_keep = r.get("storage.keep", units.parse_positive_int, DEFAULT_GLOBAL_KEEP)
    trainer_access = r.get("storage.trainerAccess", flag, False)
    schedule = r.get("triggers.schedule", flag, True)
    sigterm = r.get("triggers.sigterm", flag, True)
    restore_enabled = r.get("restore.enabled", flag, True)
    prefer = r.get("restore.prefer", choice(RESTORE_PREFER), "local")
    retry_deadline = r.get("restore.retryDeadline", seconds_or_zero, DEFAULT_RETRY_DEADLINE_S)
    direct_io = r.get("restore.directIO", flag, True)
    agree_timeout = r.get("restore.agreementTimeout", seconds_or_zero, DEFAULT_AGREE_TIMEOUT_S)
    reshard = r.get("restore.reshard", choice(RESHARD), "DCP")
    readers = r.get("readers", choice(READERS), "Declared")
    stall_timeout = r.get("drain.stallTimeout", parse_stall_timeout, DEFAULT_STALL_AFTER)
    start_fresh = r.get("relocation.startFresh", flag, False)
    storage_opts = read_storage_options(r.raw("storage"), r.fail)
    if storage_opts.cold_class and storage_opts.cold_after >= global_keep:
        r.fail("storage.coldStorage.after", f"fewer than storage.keep ({global_keep}), "
               "or no checkpoint is ever kept long enough to move", storage_opts.cold_after)
    cold_problem = storage_opts.cold_class and uri and cold_class_problem(
        uri, storage_opts.cold_class)
    if cold_problem:
        r.fail("storage.coldStorage.storageClass", cold_problem, storage_opts.cold_class)
    if uri.startswith("gs://") and endpoint is not None:
        from ckptdrain.store.gcs import endpoint_problem
        problem = endpoint_problem(endpoint)
        if problem is not None:
            r.fail("storage.endpoint", problem, endpoint)
    if uri.startswith("s3://") and secret is None:  # the pods' own identity signs
        problem = endpoint and ambient_endpoints.problem(endpoint, config.ambient_endpoints)
        if problem:
            r.fail("storage.endpoint", problem, endpoint)
        elif storage_opts.ca_bundle is not None and not (
                endpoint and ambient_endpoints.listed(endpoint, config.ambient_endpoints)):
            r.fail("storage.caBundle", "unset without a credentialsSecretRef, unless "
                   f"storage.endpoint is one the platform lists in "
                   f"{ambient_endpoints.VARIABLE} or its class's store vouches for (spec."
                   "stores[].ambientIdentity): S3's own certificates are public, and "
                   "a private CA would let another host pose as it", "set")
    if uri.startswith("gs://"):
        # GCS is reached with Application Default Credentials, and encrypts
        # every object at rest (a customer-managed key is the bucket's setting).
        for field, setting in (("credentialsSecretRef", secret), ("encryption",
                               storage_opts.sse), ("addressingStyle", storage_opts.addressing)):
            if setting is not None:
                r.fail(f"storage.{field}", "unset with a gs:// storage.uri (GCS uses the pod's "
                       "Google identity, e.g. GKE Workload Identity, and the bucket's "
                       "encryption)", r.raw(f"storage.{field}"))
    node_expressions, tolerations = read_placement(r)
    # Its own admission holds a policy to the platform's max; afterwards a
    # lowered max is applied, not a reason to leave pods without containers.
    notes: list[str] | None = None if strict else []
    containers = merge("spec.resources", config.containers, r.raw("resources"), r.errors,
                       notes)
    grace = r.get("gracePolicy", choice(GRACE_POLICIES), "Warn")
    rule = read_identity(r)
    shard = sizing.checkpoint_size(inp) / writers if not r.errors else None
    peer = read_peer_tier(r.raw("peerTier"), shard, r.fail)
    if peer.enabled and len(name) > MAX_LABEL_VALUE:
        # Its pods carry the name as the ckptdrain.io/policy label (a
        # NetworkPolicy selects on it); a longer value would fail every pod.
        r.errors.append(InvalidInput(
            "metadata.name", f"at most {MAX_LABEL_VALUE} characters with spec.peerTier.enabled "
            "(its pods carry the name as a label)", name))
    reserved = share.reserved_name_problem(name)
    if reserved is not None:
        r.errors.append(reserved)
    if r.errors:
        return None, r.errors
    return Policy(
        namespace=namespace, name=name, selector=spec["selector"], sizing_input=inp,
        writers=writers, interval_s=interval if interval is not None
        else (mtti or 0) * sizing.DEFAULT_INTERVAL_FRACTION_OF_MTTI,
        local_path=posixpath.normpath(path), local_keep=keep, local_capacity=capacity,
        # Written into the pod as a Kubernetes quantity: "64GB" is ours, not the apiserver's.
        memory_limit=units.format_quantity(memory_bytes) if memory_bytes is not None else None,
        store_uri=uri, endpoint=endpoint, region=region, credentials=secret,
        global_keep=global_keep, schedule=schedule, sigterm=sigterm,
        restore_enabled=restore_enabled, restore_prefer=prefer, grace_policy=grace,
        per_drainer_cap=per_drainer, identity=rule, restore_retry_deadline_s=retry_deadline,
        restore_agree_timeout_s=agree_timeout,
        restore_direct_io=direct_io,
        stall_timeout_s=stall_timeout, trainer_access=trainer_access,
        storage_options=storage_opts,
        node_expressions=node_expressions, tolerations=tolerations, peer=peer,
        readers=readers, restore_reshard=reshard, containers=containers,
        resource_notes=tuple(notes or ()), relocation_reason=relocation.reason(spec),
        start_fresh=start_fresh,
    ), []


def validate(spec: Mapping[str, Any], config: OperatorConfig,
             name: str = "") -> list[InvalidInput]:
    """Every semantic problem in `spec` (and the policy's `name`, where a
    field depends on it), each naming its field; [] when valid. Amounts
    above the platform's max count, as at the policy's own admission."""
    return _read("", name, spec, config, 1, strict=True)[1]


def parse(namespace: str, name: str, spec: Mapping[str, Any], config: OperatorConfig,
          drainers: int = 1) -> Policy:
    """The typed policy; raises PolicyInvalid listing every problem."""
    policy, errors = _read(namespace, name, spec, config, drainers)
    if policy is None:
        raise PolicyInvalid(errors)
    return policy


def compute_sizing(policy: Policy) -> sizing.Sizing:
    return sizing.compute(policy.sizing_input)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics; an empty selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
