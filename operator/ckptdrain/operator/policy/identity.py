"""Which writer a pod is: a stable global rank and, where the workload says
it, how many writers there are. Pure: the pod and its owners come in as
plain dicts (as the apiserver returns them); the webhook fetches the owners.

A rank must survive rescheduling (a replaced pod writes the same shard) and
be unique among the live pods of a policy. Every label read here is set by
the workload's own controller on each pod it creates, so a replacement
carries the same value. Sources, checked against each project:

- Indexed Job: `batch.kubernetes.io/job-completion-index`, an annotation
  since Kubernetes 1.21 (KEP-2214), also a label since 1.28 (KEP-4017).
  Writers: the Job's `spec.completions`.
- JobSet (kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go and
  the controller's labelAndAnnotateObject): every pod carries
  `jobset.sigs.k8s.io/jobset-name`, `.../replicatedjob-name`, `.../job-index`
  (the Job's index inside its replicated Job, restarting at 0 in each) and,
  since v0.6.0 (PR #650), `.../job-global-index` (0..N-1 over all Jobs, in
  spec order). Child Jobs are Indexed, so the pod also has the completion
  index. rank = (pods of every Job before this one) + completion index. With
  the JobSet's spec that sum is exact; without it (no read access) every Job
  is assumed as large as this pod's Job, which a duplicate or out-of-range
  rank then refuses loudly rather than letting two pods share a shard.
- Kubeflow Trainer v2 TrainJob runs on a JobSet (kubeflow/trainer runtimes):
  only the replicated Job named `node` trains; initializer Jobs are not
  writers and are not counted.
- Kubeflow training-operator PyTorchJob (pkg/apis/kubeflow.org/v1
  common_types.go): `training.kubeflow.org/replica-type` (`master`,
  `worker`, lower case) and `training.kubeflow.org/replica-index`. rank: the
  master is 0, worker i is i + (number of masters), as the operator's own
  RANK env. Writers: Master + Worker replicas of the PyTorchJob.
- LeaderWorkerSet (kubernetes-sigs/lws, docs "Labels, Annotations and
  Environment Variables"): labels `leaderworkerset.sigs.k8s.io/group-index`,
  `.../worker-index` (the leader is worker 0), annotation `.../size` (pods
  per group); workers carry the `.../leader-name` annotation. rank = group ×
  size + worker. Writers: size × the LWS's `spec.replicas`.
- Anything else: the policy's `identity.rankLabel` or
  `identity.rankAnnotation` names where the rank is; `writers` says how
  many. An explicit rule wins over detection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JOB_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
PYTORCH_TYPE = "training.kubeflow.org/replica-type"
PYTORCH_INDEX = "training.kubeflow.org/replica-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
LWS_LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
TRAINJOB_KIND = "TrainJob"
TRAINJOB_TRAINER = "node"

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    """The policy's explicit rule: where the rank is (one of the two)."""

    label: str | None = None
    annotation: str | None = None


@dataclass(frozen=True)
class Owners:
    """The workload objects above the pod, as far as the webhook could read them."""

    job: Obj | None = None
    jobset: Obj | None = None
    pytorchjob: Obj | None = None
    leaderworkerset: Obj | None = None


@dataclass(frozen=True)
class Identity:
    """`rank` None: the workload gives none (fine only with one writer).
    `writers` None: the workload does not say how many."""

    kind: str
    rank: int | None
    writers: int | None
    source: str


class RankMissing(ValueError):
    """A pod of a recognised workload lacks what gives its rank."""

    def __init__(self, kind: str, missing: str) -> None:
        super().__init__(missing)
        self.kind, self.missing = kind, missing


def _meta(pod: Obj, part: str) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get(part) or {}


def _index(value: object) -> int | None:
    """A non-negative whole number written as text, else None."""
    if isinstance(value, str) and value.isdigit() and value.isascii():
        return int(value)
    return None


def _read(pod: Obj, key: str, kind: str, *, annotation_too: bool = True) -> int:
    """The index under `key` (label first, then annotation); RankMissing otherwise."""
    raw = _meta(pod, "labels").get(key)
    if raw is None and annotation_too:
        raw = _meta(pod, "annotations").get(key)
    value = _index(raw)
    if value is None:
        what = "label or annotation" if annotation_too else "label"
        seen = "missing" if raw is None else f"not a whole number ({raw!r})"
        raise RankMissing(kind, f"{what} {key} is {seen}")
    return value


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def job_size(job: Obj | None) -> int | None:
    """Pods of an Indexed Job: its completions (each index one pod), else parallelism."""
    spec = (job or {}).get("spec") or {}
    return _positive(spec.get("completions")) or _positive(spec.get("parallelism"))


def _rjob_size(rjob: Obj) -> int | None:
    spec = ((rjob.get("template") or {}).get("spec")) or {}
    return job_size({"spec": spec})


def _trains_only_node(jobset: Obj | None) -> bool:
    owners = ((jobset or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == TRAINJOB_KIND for o in owners)


def _jobset(pod: Obj, owners: Owners) -> Identity:
    kind = "TrainJob" if _trains_only_node(owners.jobset) else "JobSet"
    completion = _read(pod, JOB_INDEX, kind)
    rjob_name = _meta(pod, "labels").get(JOBSET_RJOB) or _meta(pod, "annotations").get(
        JOBSET_RJOB)
    rjobs = ((owners.jobset or {}).get("spec") or {}).get("replicatedJobs")
    if isinstance(rjobs, list) and rjobs:
        counted = [r for r in rjobs if kind != "TrainJob" or r.get("name") == TRAINJOB_TRAINER]
        if rjob_name not in {r.get("name") for r in counted}:
            raise RankMissing(kind, f"label {JOBSET_RJOB} is {rjob_name!r}, not one of the "
                              "replicated Jobs that train "
                              f"({', '.join(str(r.get('name')) for r in counted)})")
        job_index = _read(pod, JOBSET_JOB_INDEX, kind)
        offset, total = 0, 0
        for r in counted:
            size, replicas = _rjob_size(r), _positive(r.get("replicas", 1))
            if size is None or replicas is None:
                raise RankMissing(kind, f"replicatedJobs[{r.get('name')}] has no "
                                  "completions/parallelism or replicas")
            if r.get("name") == rjob_name:
                offset = total + job_index * size
            total += replicas * size
        return Identity(kind, offset + completion, total,
                        f"{JOBSET_RJOB}={rjob_name} {JOBSET_JOB_INDEX}={job_index} "
                        f"{JOB_INDEX}={completion} (JobSet spec)")
    # Without the JobSet's spec: the global index and this Job's size.
    global_index = _read(pod, JOBSET_GLOBAL_INDEX, kind)
    size = job_size(owners.job)
    if size is None:
        raise RankMissing(kind, "the size of the pod's Job (spec.completions), which the "
                          "operator could not read")
    return Identity(kind, global_index * size + completion, None,
                    f"{JOBSET_GLOBAL_INDEX}={global_index} × {size} pods per Job + "
                    f"{JOB_INDEX}={completion} (every Job assumed {size} pods)")


def _pytorch(pod: Obj, owners: Owners) -> Identity:
    kind = "PyTorchJob"
    role = _meta(pod, "labels").get(PYTORCH_TYPE, "").lower()
    index = _read(pod, PYTORCH_INDEX, kind, annotation_too=False)
    specs = ((owners.pytorchjob or {}).get("spec") or {}).get("pytorchReplicaSpecs")
    replicas = {str(k).lower(): _positive((v or {}).get("replicas", 1)) or 0
                for k, v in specs.items()} if isinstance(specs, Mapping) else None
    if role == "master":
        rank = index
    elif role == "worker":
        if replicas is None:
            raise RankMissing(kind, "the PyTorchJob's replica counts (whether a Master "
                              "exists decides worker ranks), which the operator could not "
                              "read")
        rank = replicas.get("master", 0) + index
    else:
        raise RankMissing(kind, f"label {PYTORCH_TYPE} is {role!r}, expected master or worker")
    writers = None if replicas is None else replicas.get("master", 0) + replicas.get("worker", 0)
    return Identity(kind, rank, writers, f"{PYTORCH_TYPE}={role} {PYTORCH_INDEX}={index}")


def _ordinal(pod: Obj) -> int | None:
    """A StatefulSet pod's ordinal, the number after its name's last dash."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    return _index(name.rpartition("-")[2]) if "-" in name else None


def _lws_indexes(pod: Obj, kind: str) -> tuple[int, int]:
    """(group, worker). LWS's own pod webhook adds worker-index (and a
    leader's group-index) from the pod's StatefulSet ordinal, and ours may run
    before it (webhooks run in name order): where a label is still missing,
    read the ordinal the same way. A worker has the leader-name annotation."""
    labels = _meta(pod, "labels")
    leader = LWS_LEADER_NAME not in _meta(pod, "annotations")
    if LWS_GROUP not in labels and leader and _ordinal(pod) is not None:
        group = _ordinal(pod) or 0
    else:
        group = _read(pod, LWS_GROUP, kind, annotation_too=False)
    if LWS_WORKER in labels:
        worker = _read(pod, LWS_WORKER, kind, annotation_too=False)
    elif leader:
        worker = 0
    elif _ordinal(pod) is not None:
        worker = _ordinal(pod) or 0
    else:
        raise RankMissing(kind, f"label {LWS_WORKER} is missing (and the pod name has no "
                          "ordinal)")
    return group, worker


def _lws(pod: Obj, owners: Owners) -> Identity:
    kind = "LeaderWorkerSet"
    group, worker = _lws_indexes(pod, kind)
    size = _index(_meta(pod, "annotations").get(LWS_SIZE))
    if not size:
        raise RankMissing(kind, f"annotation {LWS_SIZE} is missing or not a positive number")
    if worker >= size:
        raise RankMissing(kind, f"label {LWS_WORKER}={worker} is not below the group size "
                          f"{size}")
    replicas = _positive(((owners.leaderworkerset or {}).get("spec") or {}).get("replicas"))
    return Identity(kind, group * size + worker, None if replicas is None else replicas * size,
                    f"{LWS_GROUP}={group} × {LWS_SIZE}={size} + {LWS_WORKER}={worker}")


def derive(pod: Obj, rule: Rule | None = None, owners: Owners = Owners()) -> Identity:
    """The pod's identity; RankMissing when its workload is recognised (or a
    rule is set) but the rank cannot be read."""
    labels = _meta(pod, "labels")
    if rule is not None and (rule.label or rule.annotation):
        key = rule.label or rule.annotation or ""
        rank = _read(pod, key, "policy identity", annotation_too=False) if rule.label else \
            _index(_meta(pod, "annotations").get(key))
        if rank is None:
            raise RankMissing("policy identity", f"annotation {key} is missing or not a "
                              "whole number")
        where = "label" if rule.label else "annotation"
        return Identity("policy identity", rank, None, f"{where} {key}={rank}")
    if LWS_NAME in labels:
        return _lws(pod, owners)
    if PYTORCH_TYPE in labels:
        return _pytorch(pod, owners)
    if JOBSET_NAME in labels or JOBSET_NAME in _meta(pod, "annotations"):
        return _jobset(pod, owners)
    if JOB_INDEX in labels or JOB_INDEX in _meta(pod, "annotations"):
        rank = _read(pod, JOB_INDEX, "Job")
        return Identity("Job", rank, job_size(owners.job), f"{JOB_INDEX}={rank}")
    return Identity(_owner_kind(pod), None, None, "no rank label")


def _owner_kind(pod: Obj) -> str:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    controller = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    return str(controller.get("kind")) if controller else "Pod"


def controller_of(obj: Obj) -> tuple[str, str, str, str | None] | None:
    """(apiVersion, kind, name, uid) of the object's controlling owner, if any."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            uid = owner.get("uid")
            return (str(owner.get("apiVersion")), str(owner.get("kind")),
                    str(owner.get("name")), str(uid) if uid else None)
    return None


def mismatch(identity: Identity, writers: int) -> str | None:
    """The workload's writer count when it differs from the policy's (reported, not trusted)."""
    if identity.writers is None or identity.writers == writers:
        return None
    return (f"spec.writers is {writers} but the {identity.kind} has {identity.writers} "
            f"pods that write")


def out_of_range(identity: Identity, writers: int) -> str | None:
    """Why the rank cannot be a writer of `writers` (the agent refuses it too)."""
    if identity.rank is None or identity.rank < writers:
        return None
    return (f"rank {identity.rank} ({identity.source}) is not below spec.writers "
            f"({writers})")
