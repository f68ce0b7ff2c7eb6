"""The store identity a CheckpointClass gives its policies' pods
(`spec.identity`): read from the class, and made into the namespace's
WebIdentity (s3:// stores) or Google service account (gs:// stores). Pure,
no Kubernetes.

The same shape and meaning as an entry of the chart's `agent.identities`
(operator/tenant_identities.py): an AWS role that restore and the agent
assume with a projected ServiceAccount token of the given audience and
lifetime (admission/tenant_identity.py). `{namespace}` may stand in the
role's path or name, so one class gives each namespace its own role, whose
trust policy accepts only that namespace's tokens:

    identity:
      awsRoleArn: arn:aws:iam::111122223333:role/ckpt-{namespace}

For a policy of the class it wins over the chart's mapping of the
policy's namespace; a credentialsSecretRef (the policy's, or else the
class's: policy/class_credentials.py) wins over both.

For gs:// stores, `googleServiceAccount` names the Google service account
restore and the agent impersonate with the pod's own Google identity (GKE
Workload Identity; store/gcs_auth.py). `{namespace}` may stand in its
account id, before the @, so each namespace gets its own account:

    identity:
      googleServiceAccount: ckpt-{namespace}@my-project.iam.gserviceaccount.com

A class may set both: each applies to the stores of its cloud only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import tenant_identities
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.tenant_identities import ROLE_ARN, WebIdentity

FIELD = "spec.identity"
NAMESPACE_PLACEHOLDER = "{namespace}"
#: What stands for a namespace when a role ARN is checked as the class has
#: it (the shortest namespace: the longest is checked at each policy).
_SAMPLE_NAMESPACE = "a"
_ROLE = ":role/"
GOOGLE_KEY = "googleServiceAccount"
GOOGLE_FIELD = f"{FIELD}.{GOOGLE_KEY}"
#: A user-managed service account's email: its id, then its project's id
#: (each 6-30 of [a-z0-9-], a letter first, no '-' last).
_PROJECT = r"[a-z][-a-z0-9]{4,28}[a-z0-9]"
GOOGLE_EMAIL = re.compile(rf"([^@]+)@{_PROJECT}\.iam\.gserviceaccount\.com", re.ASCII)
ACCOUNT_ID = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)
#: An account id as a class writes it: [a-z0-9-] and {namespace}, a letter
#: or the placeholder first, no '-' last (a namespace never ends in one; the
#: namespace itself is checked at each policy).
_ACCOUNT_TEMPLATE = re.compile(
    r"([a-z]|\{namespace\})(([-a-z0-9]|\{namespace\})*([a-z0-9]|\{namespace\}))?", re.ASCII)
MIN_ACCOUNT_ID, MAX_ACCOUNT_ID = 6, 30
_GOOGLE_EXPECTED = ("a Google service account email, <account id>@<project id>.iam."
                    "gserviceaccount.com, whose account id (6-30 lowercase letters, digits "
                    "and '-', a letter first, no '-' last) may hold {namespace}")


def read_identity(raw: object, problems: list[InvalidInput]) -> WebIdentity | None:
    """The class's identity as written ({namespace} kept), or None when
    unset; a problem naming the field otherwise."""
    if raw is None:
        return None
    if isinstance(raw, Mapping) and GOOGLE_KEY in raw:
        raw = {k: v for k, v in raw.items() if k != GOOGLE_KEY}
        if not raw:
            return None  # a Google service account alone
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


def read_google(raw: object, problems: list[InvalidInput]) -> str | None:
    """The class's Google service account as written ({namespace} kept),
    or None when unset; a problem naming the field otherwise. Refused when
    no namespace could make its account id 6-30 characters."""
    email = raw.get(GOOGLE_KEY) if isinstance(raw, Mapping) else None
    if email is None:
        return None
    match = GOOGLE_EMAIL.fullmatch(email) if isinstance(email, str) else None
    if match is None or not _ACCOUNT_TEMPLATE.fullmatch(match[1]):
        problems.append(InvalidInput(GOOGLE_FIELD, _GOOGLE_EXPECTED, email))
        return None
    template = match[1]
    fixed = len(template.replace(NAMESPACE_PLACEHOLDER, ""))
    shortest = fixed + template.count(NAMESPACE_PLACEHOLDER)  # one-letter namespaces
    if shortest > MAX_ACCOUNT_ID or (NAMESPACE_PLACEHOLDER not in template
                                     and fixed < MIN_ACCOUNT_ID):
        problems.append(InvalidInput(GOOGLE_FIELD, f"an account id that can be "
                                     f"{MIN_ACCOUNT_ID}-{MAX_ACCOUNT_ID} characters (Google's "
                                     "limit) with a namespace in its {namespace}", email))
        return None
    return email


def google_for_namespace(template: str, namespace: str, class_name: str
                         ) -> tuple[str | None, InvalidInput | None]:
    """The class's Google service account for a policy of `namespace`,
    {namespace} replaced; or the problem, naming the field, class and
    namespace, when that makes an account id Google does not allow."""
    account, _, domain = template.partition("@")
    resolved = account.replace(NAMESPACE_PLACEHOLDER, namespace)
    if NAMESPACE_PLACEHOLDER in account and not namespace:
        return None, InvalidInput("metadata.namespace", f"a namespace for the "
                                  f"{NAMESPACE_PLACEHOLDER} in {GOOGLE_FIELD} of "
                                  f"CheckpointClass {class_name}", namespace)
    if not ACCOUNT_ID.fullmatch(resolved):
        return None, InvalidInput(
            GOOGLE_FIELD, f"a service account id for namespace {namespace} that Google allows "
            f"({MIN_ACCOUNT_ID}-{MAX_ACCOUNT_ID} lowercase letters, digits and '-', a letter "
            f"first, no '-' last), what CheckpointClass {class_name} makes of {template}",
            f"{resolved}@{domain}")
    return f"{resolved}@{domain}", None


def applied(config: OperatorConfig, namespace: str, uri: str, class_name: str,
            identity: WebIdentity | None, google: str | None
            ) -> tuple[OperatorConfig, InvalidInput | None]:
    """`config` with the class's identity for a policy of `namespace` whose
    store is `uri`: its AWS role in place of the chart's mapping for an
    s3:// store, its Google service account for a gs:// one, nothing
    otherwise; or the problem with that identity for this namespace."""
    if google is not None and uri.startswith("gs://"):
        account, problem = google_for_namespace(google, namespace, class_name)
        return (config, problem) if account is None else (
            replace(config, google_accounts=((namespace, account),)), None)
    if identity is None or not uri.startswith("s3://"):
        return config, None
    role, problem = for_namespace(identity, namespace, class_name)
    if role is None:
        return config, problem
    # The only entry: the class's wins for its policies over the chart's.
    return replace(config, identities=((namespace, role),)), None
