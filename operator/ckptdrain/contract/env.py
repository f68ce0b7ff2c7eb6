"""The environment of the injected containers: the webhook sets these, the
node side reads them. One list (docs/pod-contract.md says what each means;
`node/config.FIELDS` parses and documents each setting once). Pure."""

from __future__ import annotations

from enum import StrEnum


class Env(StrEnum):
    # Who this pod is (downward API and the policy).
    POLICY = "CKPTDRAIN_POLICY"
    POD_NAME = "CKPTDRAIN_POD_NAME"
    POD_UID = "CKPTDRAIN_POD_UID"
    NAMESPACE = "CKPTDRAIN_NAMESPACE"
    NODE_NAME = "CKPTDRAIN_NODE_NAME"
    WRITER_ID = "CKPTDRAIN_WRITER_ID"
    WRITERS = "CKPTDRAIN_WRITERS"
    #: `writer` or `reader`; a reader's WRITER_ID is the shard it reads.
    ROLE = "CKPTDRAIN_ROLE"
    #: `true` when readers restore the job's checkpoints beside its writers.
    READERS = "CKPTDRAIN_READERS"
    #: This process among the pod's processes that save as its one writer
    #: (torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE when unset; 0 of 1 by default).
    LOCAL_RANK = "CKPTDRAIN_LOCAL_RANK"
    LOCAL_PROCESSES = "CKPTDRAIN_LOCAL_PROCESSES"
    # The global tier. Credentials are read by the S3 client itself.
    STORE_URI = "CKPTDRAIN_STORE_URI"
    S3_ENDPOINT = "CKPTDRAIN_S3_ENDPOINT"
    REGION = "AWS_REGION"
    S3_SSE = "CKPTDRAIN_S3_SSE"
    S3_SSE_KMS_KEY_ID = "CKPTDRAIN_S3_SSE_KMS_KEY_ID"
    S3_CA_BUNDLE = "CKPTDRAIN_S3_CA_BUNDLE"
    S3_ADDRESSING = "CKPTDRAIN_S3_ADDRESSING"
    COLD_STORAGE_CLASS = "CKPTDRAIN_COLD_STORAGE_CLASS"
    COLD_AFTER = "CKPTDRAIN_COLD_AFTER"
    ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
    SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
    #: The Google service account restore and the agent impersonate for a
    #: gs:// store (the class's spec.identity.googleServiceAccount).
    GOOGLE_SERVICE_ACCOUNT = "CKPTDRAIN_GOOGLE_SERVICE_ACCOUNT"
    # The tiers and the policy's knobs.
    WORK_DIR = "CKPTDRAIN_WORK_DIR"
    #: The work dir as the trainer mounts it, where that is not WORK_DIR
    #: (restore and the agent reach it through the local tier's volume).
    TRAINER_WORK_DIR = "CKPTDRAIN_TRAINER_WORK_DIR"
    #: The trainer's per-pod work dir in the local tier's volume,
    #: `work-<writer>-$(CKPTDRAIN_POD_UID)`: what its subPathExpr mounts.
    WORK_NAME = "CKPTDRAIN_WORK_NAME"
    #: The group restore gives that per-pod work dir: the pod's fsGroup.
    WORK_GROUP = "CKPTDRAIN_WORK_GROUP"
    LOCAL_DIR = "CKPTDRAIN_LOCAL_DIR"
    LOCAL_KEEP = "CKPTDRAIN_LOCAL_KEEP"
    LOCAL_CAPACITY = "CKPTDRAIN_LOCAL_CAPACITY"
    GLOBAL_KEEP = "CKPTDRAIN_GLOBAL_KEEP"
    INTERVAL = "CKPTDRAIN_INTERVAL"
    GLOBAL_EVERY = "CKPTDRAIN_GLOBAL_EVERY"
    OVERLAP = "CKPTDRAIN_OVERLAP"
    SHARE_FILE = "CKPTDRAIN_SHARE_FILE"
    DEFAULT_RATE = "CKPTDRAIN_DEFAULT_RATE"
    GRACE_SECONDS = "CKPTDRAIN_GRACE_SECONDS"
    SAFETY_MARGIN = "CKPTDRAIN_SAFETY_MARGIN"
    METRICS_PORT = "CKPTDRAIN_METRICS_PORT"
    PART_SIZE = "CKPTDRAIN_PART_SIZE"
    CONCURRENCY = "CKPTDRAIN_CONCURRENCY"
    STALL_TIMEOUT = "CKPTDRAIN_STALL_TIMEOUT"
    # The peer tier (docs/peer-tier.md); off unless PEER_CREDENTIALS is set.
    PEER_CREDENTIALS = "CKPTDRAIN_PEER_CREDENTIALS"
    PEERS_FILE = "CKPTDRAIN_PEERS_FILE"
    PEER_PORT = "CKPTDRAIN_PEER_PORT"
    PEER_KEEP = "CKPTDRAIN_PEER_KEEP"
    PEER_CAPACITY = "CKPTDRAIN_PEER_CAPACITY"
    # Restore, and what the trainer reads of it.
    RESTORE = "CKPTDRAIN_RESTORE"
    RESTORE_PREFER = "CKPTDRAIN_RESTORE_PREFER"
    RESTORE_RESULT = "CKPTDRAIN_RESTORE_RESULT"
    RESTORE_RETRY_DEADLINE = "CKPTDRAIN_RESTORE_RETRY_DEADLINE"
    RESTORE_DIRECT_IO = "CKPTDRAIN_RESTORE_DIRECT_IO"
    #: What restore does with a newest step saved by another writer count.
    RESTORE_RESHARD = "CKPTDRAIN_RESTORE_RESHARD"
    RESTORE_AGREE_TIMEOUT = "CKPTDRAIN_RESTORE_AGREE_TIMEOUT"
    #: The pod's `ckptdrain.io/restore` annotation (downward API; empty when absent).
    RESTORE_MODE = "CKPTDRAIN_RESTORE_MODE"
    #: Where the policy's checkpoints were before its store moved
    #: (contract/earlier_stores.py): restore's alone.
    EARLIER_STORES = "CKPTDRAIN_EARLIER_STORES"


#: Set for the trainer (by its launcher, or torchrun's LOCAL_RANK /
#: LOCAL_WORLD_SIZE stand in) and read by its client only, never injected.
TRAINER_ONLY = frozenset({Env.LOCAL_RANK, Env.LOCAL_PROCESSES})

#: Injected for kubelet (the work dir's subPathExpr) and the root prepare
#: program, which read it; never by the node config or the client.
MOUNT_ONLY = frozenset({Env.WORK_NAME})

#: Read by the stores' credential chains (the S3 client's, store/gcs_auth.py),
#: never by ckptdrain's own config.
CREDENTIALS = frozenset({Env.ACCESS_KEY_ID, Env.SECRET_ACCESS_KEY, Env.GOOGLE_SERVICE_ACCOUNT})
