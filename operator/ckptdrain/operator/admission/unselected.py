"""Opted-in pods that no CheckpointPolicy selects: what admission answers
and what the sweep says about them. Pure: no Kubernetes, no clock.

A pod labelled `ckptdrain.io/inject=true` asks to be checkpointed. When no
policy of its namespace selects it (the policy was deleted, or its selector
has a typo), it would start without restore and never be drained, and an
admission warning alone reaches nobody when a controller creates the pod.
So admission refuses it (CKPTDRAIN_UNSELECTED_PODS=Refuse, the default) and
the pod's controller keeps retrying, its failures visible on the workload;
with Flag it is admitted bare. Whatever runs anyway (Flag, a webhook that
failed open, a policy deleted after the pod started) the sweep flags with
an `Unselected` Event on the pod and on its controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract import api
from ckptdrain.operator.config import UNSELECTED_REFUSE, OperatorConfig
from ckptdrain.operator.policy import spec as pol

#: The reason of the Warning Events the sweep posts.
REASON = "Unselected"


def _fix(namespace: str) -> str:
    return (f"create a CheckpointPolicy in {namespace} whose spec.selector matches the "
            f"pod's labels, or remove the label {api.LABEL_INJECT} to run the pod "
            "without checkpoints")


def refuses(cfg: OperatorConfig) -> bool:
    """Whether admission refuses such a pod (else it admits it bare)."""
    return cfg.unselected_pods == UNSELECTED_REFUSE


def selected_by_none(labels: Mapping[str, str],
                     selectors: Iterable[Mapping[str, Any] | None]) -> bool:
    """No selector of the namespace's policies matches the pod's labels."""
    return not any(pol.selector_matches(s or {}, dict(labels)) for s in selectors)


def refusal(namespace: str, pod: str) -> str:
    """Admission's answer under Refuse: what is wrong and the two ways out."""
    return (f"metadata.labels: no CheckpointPolicy in {namespace} selects this pod ({pod}), "
            f"but it is labelled {api.LABEL_INJECT}=true, which asks for checkpoints; "
            + _fix(namespace))


def admission_warning(namespace: str) -> str:
    """Admission's warning under Flag: the pod is admitted bare."""
    return (f"ckptdrain: no CheckpointPolicy in {namespace} selects this pod; not injected: "
            "it starts without restore and is never checkpointed; "
            + _fix(namespace))


def pod_event(namespace: str) -> str:
    """The Event on the pod."""
    return (f"labelled {api.LABEL_INJECT}=true, but no CheckpointPolicy in {namespace} "
            "selects it: it runs without restore and is never checkpointed. "
            f"To fix: {_fix(namespace)}; then delete the pod, so that its controller "
            "recreates it through admission.")


def owner_event(namespace: str, pod: str) -> str:
    """The Event on the pod's controller (a Job, a ReplicaSet, ...)."""
    return (f"pod {pod} is labelled {api.LABEL_INJECT}=true, but no CheckpointPolicy in "
            f"{namespace} selects it: it runs without restore and is never checkpointed. "
            "Create a CheckpointPolicy whose spec.selector matches the pod template's "
            f"labels, or remove {api.LABEL_INJECT} from the template.")
