"""The store identity a CheckpointClass gives its policies' pods
(`spec.identity`): read from the class, and made into the namespace's
WebIdentity. Pure, no Kubernetes.

The same shape and meaning as an entry of the chart's `agent.identities`
(operator/tenant_identities.py): an AWS role that restore and the agent
assume with a projected ServiceAccount token of the given audience and
lifetime (admission/tenant_identity.py). `{namespace}` may stand in the
role's path or name, so one class gives each namespace its own role, whose
trust policy accepts only that namespace's tokens:

    identity:
      awsRoleArn: arn:aws:iam::111122223333:role/ckpt-{namespace}

For a policy of the class it wins over the chart's mapping of the
policy's namespace; a policy's credentialsSecretRef wins over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import tenant_identities
from ckptdrain.operator.tenant_identities import ROLE_ARN, WebIdentity

FIELD = "spec.identity"
NAMESPACE_PLACEHOLDER = "{namespace}"
#: What stands for a namespace when a role ARN is checked as the class has
#: it (the shortest namespace: the longest is checked at each policy).
_SAMPLE_NAMESPACE = "a"
_ROLE = ":role/"


def read_identity(raw: object, problems: list[InvalidInput]) -> WebIdentity | None:
    """The class's identity as written ({namespace} kept), or None when
    unset; a problem naming the field otherwise."""
    if raw is None:
        return None
    arn = raw.get("awsRoleArn") if isinstance(raw, Mapping) else None
    # Checked as the chart's entries are, with a namespace in its place.
    sample = ({**raw, "awsRoleArn": arn.replace(NAMESPACE_PLACEHOLDER, _SAMPLE_NAMESPACE)}
              if isinstance(raw, Mapping) and isinstance(arn, str) else raw)
    try:
        entry = tenant_identities.read_entry(FIELD, sample)
    except InvalidInput as error:
        problems.append(InvalidInput(error.field, error.expected, arn)
                        if error.field == f"{FIELD}.awsRoleArn" else error)
        return None
    assert isinstance(arn, str)
    # Any other placeholder, or a brace, fails the ARN's pattern above; in
    # the partition ({namespace} → "a") it would pass it.
    if NAMESPACE_PLACEHOLDER in arn.partition(_ROLE)[0]:
        problems.append(InvalidInput(f"{FIELD}.awsRoleArn", "{namespace} only in the role's "
                                     "path or name", arn))
        return None
    return replace(entry, role_arn=arn)


def for_namespace(identity: WebIdentity, namespace: str, class_name: str
                  ) -> tuple[WebIdentity | None, InvalidInput | None]:
    """The class's identity for a policy of `namespace`, {namespace}
    replaced; or the problem, naming the field and class, when the role
    that makes is not one IAM allows (a role name over 64 characters)."""
    arn = identity.role_arn.replace(NAMESPACE_PLACEHOLDER, namespace)
    if NAMESPACE_PLACEHOLDER in identity.role_arn and not namespace:
        return None, InvalidInput("metadata.namespace", f"a namespace for the "
                                  f"{NAMESPACE_PLACEHOLDER} in {FIELD}.awsRoleArn of "
                                  f"CheckpointClass {class_name}", namespace)
    if not ROLE_ARN.fullmatch(arn):
        return None, InvalidInput(
            f"{FIELD}.awsRoleArn", f"a role ARN for namespace {namespace} that IAM allows "
            f"(a role name of at most 64 characters), what CheckpointClass {class_name} makes "
            f"of {identity.role_arn}", arn)
    return WebIdentity(arn, identity.audience, identity.expiration_s), None
