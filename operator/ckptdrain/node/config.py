"""One configuration object for the agent and the restore step.

Every field is documented once, in `FIELDS`: its flag, its environment
variable (named in contract/env.py, the list the webhook injects from; see
docs/pod-contract.md), its parser from `units` and its default.
Flags win over the environment, the environment over defaults. `load`
validates everything at start, so a bad value stops the process with one line
naming the field, instead of surfacing an hour later in a drain.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptdrain import units
from ckptdrain.contract.cold import cold_class_problem
from ckptdrain.contract.drain import parse_stall_timeout
from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.contract.earlier_stores import parse as parse_earlier_stores
from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput
from ckptdrain.node import values

#: Used when neither the share file nor CKPTDRAIN_DEFAULT_RATE gives a rate:
#: the agent is never unlimited, because an unthrottled drain starves the
#: training job's own network.
FALLBACK_RATE = 100e6


@dataclass(frozen=True)
class AgentConfig:
    work_dir: Path
    #: The same directory as the trainer mounts it: restore.json and the
    #: resume answer name steps by it (default: work_dir).
    trainer_work_dir: Path
    local_dir: Path
    local_keep: int
    #: Bytes this writer's local tier may hold (None: only the disk's free space).
    local_capacity: int | None
    global_keep: int
    interval_s: float
    global_every: int
    overlap: float
    store_uri: str | None
    s3_endpoint: str | None
    region: str | None
    writer: int
    writers: int
    share_file: Path | None
    default_rate: float
    grace_s: float
    safety_margin_s: float
    metrics_port: int
    restore: bool
    restore_prefer: str
    restore_result: Path
    #: Seconds restore keeps retrying a store that does not answer (0: one try).
    restore_retry_deadline_s: float
    #: Restore onto a local disk by direct I/O (transfer/direct_io.py).
    restore_direct_io: bool
    #: A deliberate fresh start asked for by the pod's annotation.
    restore_skip: bool
    part_size: int
    concurrency: int
    #: drain.stallTimeout: seconds without progress before a drain attempt fails.
    stall_timeout_s: float
    policy: str
    pod_name: str
    namespace: str
    node_name: str
    #: Holder of this writer's lease (node/lease.py); None outside a pod.
    pod_uid: str | None = None
    #: Encryption, private CA, addressing (a store.s3_options.S3Options; None: none).
    s3_options: Any = None
    #: The writer id is a rank (a number), not a pod name (a policy of one writer).
    writer_ranked: bool = True
    #: Cold storage (transfer/cooling.py): the class, None for none, and how
    #: many newest complete checkpoints stay in the bucket's class.
    cold_storage_class: str | None = None
    cold_after: int = 1
    #: Seconds restore waits for every rank's report before the fall-back
    #: decision (restore/agreement.py); 0: ranks do not coordinate.
    restore_agree_timeout_s: float = 60.0
    #: "writer", or "reader": restores shard `writer` and never writes.
    role: str = "writer"
    #: Readers restore this job's checkpoints beside its writers.
    readers: bool = False
    #: A newest step saved by another writer count: "dcp" hands a DCP
    #: checkpoint to the trainer to load resharded, "trainer" any format.
    restore_reshard: str = "dcp"
    #: Where the policy's checkpoints were before its store moved, newest
    #: first: nothing at `store_uri` is then no fresh start (restore/engine.py).
    earlier_stores: tuple[EarlierStore, ...] = ()
    #: The group restore gives the pod's own work dir on the node (the pod's
    #: fsGroup; restore/pod_work.py); None: the one it inherits.
    work_group: int | None = None

    @property
    def flush_budget_s(self) -> float:
        """Seconds from SIGTERM until the agent must have exited."""
        return max(0.5, self.grace_s - self.safety_margin_s)

    @property
    def reader(self) -> bool:
        return self.role == "reader"

    @property
    def restores_alone(self) -> bool:
        """No other pod restores this job's checkpoints (one writer, no
        readers): its own node's steps need not be complete anywhere else."""
        return self.writers == 1 and not self.reader and not self.readers


@dataclass(frozen=True)
class Field:
    name: str
    env: Env | None
    parse: Callable[[str, object], Any]
    default: object
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


FIELDS: tuple[Field, ...] = (
    Field("work_dir", Env.WORK_DIR, values.path, "/ckptdrain/work",
          "where the trainer writes step-<N>/ (memory tier when memory-backed)"),
    Field("trainer_work_dir", Env.TRAINER_WORK_DIR, values.optional_text, None,
          "the work dir as the trainer mounts it, when it is not the work dir's path here "
          "(default: the work dir)"),
    Field("work_group", Env.WORK_GROUP, values.optional_group, None,
          "the group restore gives the pod's own work dir on the node (the pod's "
          "fsGroup); unset: the group it inherits"),
    Field("local_dir", Env.LOCAL_DIR, values.path, "/ckptdrain/local",
          "the node-local (NVMe) tier"),
    Field("local_keep", Env.LOCAL_KEEP, units.parse_positive_int, "2",
          "local retention: keep the newest K checkpoints"),
    Field("local_capacity", Env.LOCAL_CAPACITY, values.optional_bytes, None,
          "bytes the local tier may hold, e.g. 8TB (default: the disk's free space)"),
    Field("global_keep", Env.GLOBAL_KEEP, units.parse_positive_int, "3",
          "global retention: keep the newest K complete checkpoints in the store"),
    Field("interval", Env.INTERVAL, units.parse_duration, "15m",
          "local checkpoint interval (how often the trainer is asked)"),
    Field("global_every", Env.GLOBAL_EVERY, units.parse_positive_int, "1",
          "every N-th local checkpoint is drained to the global tier"),
    Field("overlap", Env.OVERLAP, units.parse_fraction, "10%",
          "target drain time / global interval (reported, not enforced)"),
    Field("store_uri", Env.STORE_URI, values.optional_text, None,
          "global tier: s3://bucket/prefix, gs://bucket/prefix or file:///path "
          "(none: local tier only)"),
    Field("s3_endpoint", Env.S3_ENDPOINT, values.optional_endpoint, None,
          "S3-compatible endpoint URL"),
    Field("region", Env.REGION, values.optional_text, None, "S3 region"),
    Field("s3_sse", Env.S3_SSE, values.optional_text, None,
          "server-side encryption of every object written: SSE-S3 or SSE-KMS"),
    Field("s3_sse_kms_key_id", Env.S3_SSE_KMS_KEY_ID, values.optional_text, None,
          "with SSE-KMS: the KMS key id or ARN"),
    Field("s3_ca_bundle", Env.S3_CA_BUNDLE, values.optional_text, None,
          "PEM file of CAs trusted for the S3 endpoint (a private CA)"),
    Field("s3_addressing", Env.S3_ADDRESSING, values.optional_text, None,
          "S3 addressing style: auto, path or virtual"),
    Field("cold_storage_class", Env.COLD_STORAGE_CLASS, values.optional_text, None,
          "move the data of older complete checkpoints to this S3 storage class"),
    Field("cold_after", Env.COLD_AFTER, units.parse_positive_int, "1",
          "newest complete checkpoints kept in the bucket's class"),
    Field("writer_id", Env.WRITER_ID, values.text, "0",
          "this pod's writer rank (a pod name is accepted when writers is 1)"),
    Field("writers", Env.WRITERS, units.parse_positive_int, "1",
          "how many writers make one checkpoint"),
    Field("role", Env.ROLE, values.choice("writer", "reader"), "writer",
          "writer: captures and drains its shard; reader: restores the shard "
          "CKPTDRAIN_WRITER_ID and never writes"),
    Field("readers", Env.READERS, values.boolean, "false",
          "readers restore this job's checkpoints beside its writers (every pod then "
          "restores only steps all of them can get)"),
    Field("share_file", Env.SHARE_FILE, values.optional_text, None,
          "file holding this pod's bandwidth share in bytes/s, re-read every second"),
    Field("default_rate", Env.DEFAULT_RATE, units.parse_rate, None,
          "share used when the share file is missing or malformed (bytes/s)"),
    Field("grace", Env.GRACE_SECONDS, units.parse_duration, "30",
          "the pod's terminationGracePeriodSeconds"),
    Field("safety_margin", Env.SAFETY_MARGIN, values.seconds_or_zero, None,
          "exit this long before the grace period ends (default: 10% of grace, >= 2s)"),
    Field("metrics_port", Env.METRICS_PORT, values.port, "9108",
          "Prometheus /metrics and /healthz port (0 disables)"),
    Field("restore", Env.RESTORE, values.boolean, "true", "restore on start"),
    Field("restore_prefer", Env.RESTORE_PREFER, values.choice("local", "global"), "local",
          "tier preferred when both hold the same newest step"),
    Field("restore_result", Env.RESTORE_RESULT, values.optional_text, None,
          "restore result file (default <work>/restore.json)"),
    Field("restore_retry_deadline", Env.RESTORE_RETRY_DEADLINE, values.seconds_or_zero, "10m",
          "how long restore retries a global tier that does not answer (0: no retry)"),
    Field("restore_direct_io", Env.RESTORE_DIRECT_IO, values.boolean, "true",
          "restore onto a local disk by direct I/O (false: through the page cache)"),
    Field("restore_reshard", Env.RESTORE_RESHARD, values.choice("dcp", "trainer"), "dcp",
          "newest step saved by another writer count: dcp hands a DCP checkpoint to the "
          "trainer to load resharded (other formats stop restore), trainer any format"),
    Field("restore_agree_timeout", Env.RESTORE_AGREE_TIMEOUT, values.seconds_or_zero, "1m",
          "with several writers, how long restore waits for every rank to report what it "
          "holds before falling back to the newest global step (0: no coordination)"),
    Field("restore_mode", Env.RESTORE_MODE, values.restore_mode, "",
          "the pod's ckptdrain.io/restore annotation: 'skip' for a deliberate fresh start"),
    Field("earlier_stores", Env.EARLIER_STORES, parse_earlier_stores, "",
          "JSON list of the store prefixes this policy's checkpoints were under before it "
          "moved, newest first: with nothing at the store, restore refuses a fresh start"),
    Field("part_size", Env.PART_SIZE, units.parse_bytes, "64MiB",
          "multipart part size for the drain"),
    Field("concurrency", Env.CONCURRENCY, units.parse_positive_int, "8",
          "parts in flight while draining"),
    Field("stall_timeout", Env.STALL_TIMEOUT, parse_stall_timeout, "5m",
          "a drain attempt that makes no progress this long fails and is retried"),
    Field("policy", Env.POLICY, values.text, "", "<namespace>/<name> of the policy"),
    Field("pod_name", Env.POD_NAME, values.text, "", "this pod (downward API)"),
    Field("pod_uid", Env.POD_UID, values.optional_text, None,
          "this pod's uid (downward API): holds the writer's lease"),
    Field("namespace", Env.NAMESPACE, values.text, "", "this pod's namespace (downward API)"),
    Field("node_name", Env.NODE_NAME, values.text, "", "this node (downward API)"),
)


#: The fields the restore step and the peer server read; `--help` of each
#: lists only these (the others still parse: one configuration, one loader).
RESTORE_FIELDS = frozenset({
    "work_dir", "trainer_work_dir", "work_group", "local_dir", "store_uri", "s3_endpoint",
    "region", "s3_sse", "s3_sse_kms_key_id", "s3_ca_bundle", "s3_addressing", "writer_id",
    "writers", "role", "readers", "restore", "restore_prefer", "restore_result",
    "restore_retry_deadline", "restore_direct_io", "restore_reshard", "restore_mode",
    "restore_agree_timeout",
    "earlier_stores", "policy", "pod_name", "pod_uid", "namespace", "node_name"})
PEER_FIELDS = frozenset({"local_dir", "writer_id", "writers", "policy"})


def add_arguments(parser: argparse.ArgumentParser,
                  shown: frozenset[str] | None = None) -> None:
    """One flag per field; each defaults to None so the environment can fill it.
    With `shown`, the help lists only those fields."""
    for f in FIELDS:
        env = f" [env {f.env.value}]" if f.env else ""
        default = f" (default {f.default})" if f.default else ""
        text = f"{f.help}{env}{default}".replace("%", "%%")  # argparse formats help with %
        parser.add_argument(f.flag, dest=f.name, default=None,
                            help=text if shown is None or f.name in shown else argparse.SUPPRESS)


def _writer(writer_id: str, writers: int) -> int:
    text = writer_id.strip()
    if text.isdigit():
        writer = int(text)
        if writer >= writers:
            raise InvalidInput(Env.WRITER_ID.value, f"a rank in 0..{writers - 1}", writer_id)
        return writer
    if writers == 1:
        return 0  # a pod name: the only writer
    raise InvalidInput(Env.WRITER_ID.value, "a whole-number rank when writers > 1", writer_id)


def load(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Read, parse and validate every field. Raises InvalidInput naming the field."""
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    for f in FIELDS:
        value: object = getattr(args, f.name, None) if args is not None else None
        label = f.flag
        if value is None and f.env and env.get(f.env, "").strip():
            value, label = env[f.env], f.env.value
        if value is None:
            value = f.default
        raw[f.name] = None if value is None else f.parse(label, value)

    grace = raw["grace"]
    margin = raw["safety_margin"]
    if margin is None:
        margin = min(max(2.0, 0.1 * grace), grace / 2)
    if margin >= grace:
        raise InvalidInput(
            Env.SAFETY_MARGIN.value, f"less than the grace period {grace}s", margin
        )
    part_size = raw["part_size"]
    if part_size < 1 << 20:
        raise InvalidInput(Env.PART_SIZE.value, "at least 1MiB", part_size)
    if raw["store_uri"] is not None:
        from ckptdrain.store import parse_store_uri

        parse_store_uri(raw["store_uri"])  # validates; opening waits for first use
    if raw["cold_storage_class"] is not None:
        problem = cold_class_problem(raw["store_uri"] or "", raw["cold_storage_class"])
        if problem is not None:
            raise InvalidInput(Env.COLD_STORAGE_CLASS.value, problem, raw["cold_storage_class"])
    s3_options = None
    if raw["store_uri"] is not None and raw["store_uri"].startswith(("s3://", "gs://")):
        from ckptdrain.store.s3_options import S3Options

        s3_options = S3Options.from_env({  # validated here, at start, naming the variable
            name.value: raw[key] or "" for name, key in (
                (Env.S3_SSE, "s3_sse"), (Env.S3_SSE_KMS_KEY_ID, "s3_sse_kms_key_id"),
                (Env.S3_CA_BUNDLE, "s3_ca_bundle"), (Env.S3_ADDRESSING, "s3_addressing"))})
    work = raw["work_dir"]
    result = raw["restore_result"]
    return AgentConfig(
        work_dir=work,
        trainer_work_dir=Path(raw["trainer_work_dir"]) if raw["trainer_work_dir"] else work,
        local_dir=raw["local_dir"],
        local_keep=raw["local_keep"],
        local_capacity=raw["local_capacity"],
        work_group=raw["work_group"],
        global_keep=raw["global_keep"],
        interval_s=raw["interval"],
        global_every=raw["global_every"],
        overlap=raw["overlap"],
        store_uri=raw["store_uri"],
        s3_endpoint=raw["s3_endpoint"],
        region=raw["region"],
        writer=_writer(raw["writer_id"], raw["writers"]),
        writer_ranked=raw["writer_id"].strip().isdigit(),
        writers=raw["writers"],
        share_file=Path(raw["share_file"]) if raw["share_file"] else None,
        default_rate=raw["default_rate"] or FALLBACK_RATE,
        grace_s=grace,
        safety_margin_s=margin,
        metrics_port=raw["metrics_port"],
        restore=raw["restore"],
        restore_prefer=raw["restore_prefer"],
        restore_result=Path(result) if result else work / "restore.json",
        restore_retry_deadline_s=raw["restore_retry_deadline"],
        restore_agree_timeout_s=raw["restore_agree_timeout"],
        restore_direct_io=raw["restore_direct_io"],
        restore_skip=raw["restore_mode"],
        part_size=part_size,
        concurrency=raw["concurrency"],
        stall_timeout_s=raw["stall_timeout"],
        s3_options=s3_options,
        policy=raw["policy"],
        pod_name=raw["pod_name"],
        namespace=raw["namespace"],
        node_name=raw["node_name"],
        pod_uid=raw["pod_uid"],
        cold_storage_class=raw["cold_storage_class"],
        cold_after=raw["cold_after"],
        role=raw["role"],
        readers=raw["readers"],
        restore_reshard=raw["restore_reshard"],
        earlier_stores=raw["earlier_stores"],
    )


def in_cluster(cfg: AgentConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Running in a pod the operator injected (so there is an API server to tell)?"""
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST") and cfg.policy and cfg.namespace
                and cfg.pod_name)
