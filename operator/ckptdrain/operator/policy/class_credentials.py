"""The credentials Secret a CheckpointClass names for its policies' s3://
stores (`spec.credentialsSecretRef`): read from the class, and filled into
a policy that names none. Pure, no Kubernetes.

The Secret lives in each policy's namespace, under the same name: the
platform puts a tenant's keys there, and every policy of the class that
leaves `spec.storage.credentialsSecretRef` unset gets them, exactly as if
it had named the Secret itself (its keys then reach restore and the agent
as `secretKeyRef`s, admission/pod_env.py). What signs a policy's store
requests, first that applies:

1. the policy's own `spec.storage.credentialsSecretRef`;
2. its class's `spec.credentialsSecretRef` (this module);
3. its class's `spec.identity.awsRoleArn` (policy/class_identity.py);
4. the chart's `agent.identities` entry for its namespace;
5. the pods' own identity.

A gs:// store takes no Secret (GCS uses the pods' Google identity): the
class's is left out of its policies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ckptdrain.errors import InvalidInput

FIELD = "spec.credentialsSecretRef"
KEYS = ("name", "accessKeyIdKey", "secretAccessKeyKey")
#: A Secret's name (a DNS subdomain) and a key of its data.
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}", re.ASCII)


def read_secret_ref(raw: object, problems: list[InvalidInput]) -> dict[str, str] | None:
    """The class's Secret reference as written (name, and the keys when
    given), or None when unset; a problem naming the field otherwise."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(InvalidInput(FIELD, "{name, accessKeyIdKey, secretAccessKeyKey}", raw))
        return None
    found = len(problems)
    for key in sorted(str(k) for k in raw if k not in KEYS):
        problems.append(InvalidInput(f"{FIELD}.{key}", f"one of {', '.join(KEYS)}", raw[key]))
    name = raw.get("name")
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        problems.append(InvalidInput(f"{FIELD}.name", "the name of a Secret in each policy's "
                                     "namespace (lowercase letters, digits, '-' and '.')", name))
    for key in KEYS[1:]:
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not SECRET_KEY.fullmatch(value)):
            problems.append(InvalidInput(f"{FIELD}.{key}", "a key of the Secret's data "
                                         "(letters, digits, '-', '_' and '.')", value))
    return None if len(problems) > found else {str(k): str(v) for k, v in raw.items()}


def with_secret(spec: Mapping[str, Any], ref: Mapping[str, str] | None) -> Mapping[str, Any]:
    """The policy's spec with the class's Secret in
    spec.storage.credentialsSecretRef: for an s3:// store naming none;
    `spec` itself otherwise."""
    storage = spec.get("storage")
    if ref is None or not isinstance(storage, Mapping) or "credentialsSecretRef" in storage:
        return spec
    uri = storage.get("uri")
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        return spec
    return {**spec, "storage": {**storage, "credentialsSecretRef": dict(ref)}}
