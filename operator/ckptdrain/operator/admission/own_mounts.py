"""The pod's own containers never mount a volume ckptdrain injects.

Admission adds its volumes (`injection.volumes`: the node's local tier
`ckptdrain-local`, the work dir's `ckptdrain-work`, the bandwidth share,
restore's and the agent's `/tmp`, the storage options' and the peer tier's)
for restore, the agent and the trainer's work dir mount it makes itself.
A container of the tenant's mounting one of them directly would reach what
is not its own: `ckptdrain-local` without the webhook's `subPathExpr` is
every writer's local tier and work dir on the node, where it could swap a
symlink in for another pod's work dir. Such a pod is refused (422), naming
the mount; the trainer's work dir is mounted for it at `/ckptdrain/work`.

Pure: the pod and the names in, the first problem out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def problem(pod: Mapping[str, Any], injected: Collection[str]) -> str | None:
    """Why the pod may not be injected: a mount of one of the `injected`
    volume names in its own containers or init containers (None: none)."""
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            if not isinstance(container, Mapping):
                continue
            for j, mount in enumerate(container.get("volumeMounts") or []):
                name = mount.get("name") if isinstance(mount, Mapping) else None
                if name in injected:
                    return (f"spec.{kind}[{i}].volumeMounts[{j}]: mounts the volume {name}, "
                            "which ckptdrain adds for restore and the agent alone; expected no "
                            f"mount of {', '.join(sorted(injected))} in the pod's own "
                            "containers (the trainer's work dir is mounted for it at "
                            "/ckptdrain/work); remove the mount")
    return None
