"""The operator's configuration: one object, from environment variables,
validated at start so that a bad deployment fails with one clear line.

Every field is documented once, here; the Helm chart's values map onto these
variables. For the policies of a CheckpointClass (operator/policy/classes.py)
the class's root, agent image, containers and bandwidth weight replace
allowed_root, image, containers and their namespace's weight.

Variables (field in parentheses):

- CKPTDRAIN_ALLOWED_ROOT (allowed_root): local tier paths must lie under it;
  default /mnt/ckptdrain.
- CKPTDRAIN_CLUSTER_BANDWIDTH (cluster_bandwidth): cap on the sum of all
  drains, e.g. 100GB/s; none by default.
- CKPTDRAIN_BANDWIDTH_WEIGHTS (bandwidth_weights): each namespace's weight
  under the cluster cap, "team-a=4,team-b=2" (whole numbers 1 to 1000);
  every other namespace weighs 1 (operator/policy/fair_share.py).
- CKPTDRAIN_IMAGE, CKPTDRAIN_IMAGE_PULL_POLICY: the agent/restore image (the
  operator's own) and its pull policy (IfNotPresent).
- CKPTDRAIN_AGENT_IMAGES (agent_images): "namespace/name" of the ConfigMap in
  which the operator records every agent image it has injected, so that the
  writers of a running workload keep theirs across an upgrade
  (admission/agent_pin.py); empty = no pinning: every pod gets CKPTDRAIN_IMAGE.
- CKPTDRAIN_AMBIENT_ENDPOINTS (ambient_endpoints): the S3 endpoints, besides
  AWS's own, that a policy without a credentials Secret may name: the pod's
  own identity is sent to them (store/ambient_endpoints.py); comma-separated
  `https://host[:port]` or `https://*.domain`; none by default.
- CKPTDRAIN_AGENT_IDENTITIES (identities): JSON, the AWS role each tenant
  namespace's ckptdrain containers (restore, the agent) reach the store as,
  with a projected token of their own, never the trainer's
  (operator/tenant_identities.py, admission/tenant_identity.py):
  {"team-a": {"awsRoleArn": "arn:aws:iam::111122223333:role/ckpt-team-a",
  "audience": "sts.amazonaws.com", "expirationSeconds": 3600}}; a namespace
  left out keeps the pod's own identity; none by default.
- CKPTDRAIN_AGENT_SERVICE_ACCOUNT: the agent's service account (informational).
- CKPTDRAIN_NAMESPACE (namespace): watch only this namespace; empty = all.
- CKPTDRAIN_WEBHOOK_HOST / _ADDR / _PORT: the hostname the apiserver uses to
  reach the webhook, the listen address (0.0.0.0) and port (9443; 0 = off).
- CKPTDRAIN_WEBHOOK_SECRET (webhook_secret): "namespace/name" of the Secret
  in which the operator keeps its own webhook CA and certificate, made and
  renewed in-process (the chart's default); empty = not managed.
- CKPTDRAIN_WEBHOOK_CONFIGS (webhook_configs): name of the Mutating and
  Validating webhook configurations whose caBundle the operator keeps equal
  to that Secret's CA (with CKPTDRAIN_WEBHOOK_SECRET).
- CKPTDRAIN_WEBHOOK_CERT / _KEY / _CA: PEM files (cert-manager's Secret,
  mounted); without them and without CKPTDRAIN_WEBHOOK_SECRET, a self-signed
  pair is made for development.
- CKPTDRAIN_WEBHOOK_CLIENT_CA (webhook_client_ca): a PEM bundle of the CAs
  whose client certificates the admission process accepts; set, an
  AdmissionReview is answered only to a client that presents one (the
  apiserver, configured with a kubeConfigFile per webhook), while the
  conversion path stays open (docs/install.md, "Locking down the webhook").
  Needs CKPTDRAIN_WEBHOOK_PROCESS=true; empty = no client certificate asked.
- CKPTDRAIN_WEBHOOK_MANAGED (webhook_managed): name of the webhook
  configurations the operator keeps up to date itself (development, tests);
  empty = the chart owns them.
- CKPTDRAIN_WEBHOOK_PROCESS (webhook_process): "true" (default) serves the
  webhooks from a process of their own (admission/process.py), so that an
  admission never waits for the operator's event loop; "false" serves them
  from the operator's process, as Kopf does.
- CKPTDRAIN_CONVERSION_PATH (conversion_path): the path the admission
  process answers the CRD's ConversionReviews at ("/convert"; the chart's
  webhook.conversionPath, which it also writes into the CRD).
- CKPTDRAIN_PEER_CA_NAMESPACE (peer_ca_namespace): the operator's own
  namespace, where it keeps each peer-tier policy's CA to renew its
  certificate (the chart sets it); empty = the peer tier reports
  CredentialsFailed.
- CKPTDRAIN_METRICS_PORT (9090) and CKPTDRAIN_HEALTH_PORT (8080, /healthz);
  0 disables either.
- CKPTDRAIN_PEERING (peering): Kopf peering name, so one replica is active.
- CKPTDRAIN_PEERING_PRIORITY: this replica's peering priority (the highest
  live one works); default random (apiserver/leadership.py).
- CKPTDRAIN_EXPIRED_TTL (expired_ttl_s): how long an Expired checkpoint record
  waits for its agent to delete the objects before the operator deletes the
  record; default 10m.
- CKPTDRAIN_WATCHDOG_PERIOD (watchdog_s): how often every policy's recovery
  point is checked for a stalled drain, and its pods counted; default 30s.
- CKPTDRAIN_STARTING_LIMIT (starting_limit_s): how long a scheduled injected
  pod may start (image pulls, restore) before the pod census counts it
  unprotected; default 10m.
- CKPTDRAIN_GRACE_MARGIN (grace_margin): share of the grace period a SIGTERM
  flush may use; default 80%.
- CKPTDRAIN_PREPARE_LOCAL_TIER (prepare_local_tier): "true" (default) injects
  the ckptdrain-prepare init container, which hands each policy's hostPath
  directory to the agent's uid; "false" injects nothing that runs as root (for
  policy engines that refuse root containers) and requires the node to provide
  <allowedRoot>/<namespace>/<policy> owned by uid 65532 beforehand. Either way
  the pod mounts a hostPath: its namespace must allow Pod Security "privileged".
- CKPTDRAIN_NODE_TIER (node_tier): how injected pods reach the node tier.
  "hostPath" (default here): the hostPath under CKPTDRAIN_ALLOWED_ROOT,
  prepared by ckptdrain-prepare as above. "csi" (the chart's default, which
  sets it): a CSI ephemeral inline volume of the ckptdrain CSI node driver
  (docs/csi-driver.md), which prepares ownership itself: no hostPath, no
  root container, so pods pass Pod Security "restricted";
  CKPTDRAIN_PREPARE_LOCAL_TIER is then unused. The operator run without the
  chart keeps hostPath: nothing but the chart installs the driver, and
  injecting volumes of an absent driver would leave every opted-in pod in
  ContainerCreating (`make demo` runs no operator at all).
- CKPTDRAIN_CSI_DRIVER (csi_driver): the CSI driver's name, as in its
  CSIDriver object; default node.ckptdrain.io.
- CKPTDRAIN_CSI_MIN_MOUNT_GROUP (csi_min_mount_group): the driver's own
  minimum fsGroup (its CKPTDRAIN_CSI_MIN_MOUNT_GROUP), default 1000: under
  "csi" admission refuses a pod whose fsGroup is below it, which the driver
  would refuse at mount time, leaving the pod in ContainerCreating.
- CKPTDRAIN_CSI_CAPACITY_NAMESPACE (csi_capacity_namespace): where the CSI
  drivers publish each node's free space (the release namespace; the chart
  sets it): under "csi" policy admission warns from it; empty = never read.
- CKPTDRAIN_CONTAINERS (containers): JSON, the resources of the injected
  containers and their QoS mode, {"qos": "MatchPod", "agent": {"requests":
  {...}, "limits": {...}, "guaranteed": {...}, "max": {...}}, "restore": ...,
  "peer": ..., "prepare": ...}; a container or a key of it left out keeps
  its defaults, a key given replaces that key's map; `max` bounds a policy's
  spec.resources (operator/containers.py).
- CKPTDRAIN_UNSELECTED_PODS (unselected_pods): what admission does with a pod
  labelled ckptdrain.io/inject=true that no CheckpointPolicy of its namespace
  selects: "Refuse" (default) refuses it, naming the label and the two ways
  out; "Flag" admits it bare. Either way the sweep flags any that run
  (admission/sweep.py: an Unselected Event on the pod and on its controller).
- CKPTDRAIN_PUBLISH_RECENCY (publish_recency): "true" (default) publishes
  each workload's checkpoint recency (annotation
  ckptdrain.io/checkpoint-recency) on the object that owns its training
  pods and on its Kueue Workload (operator/recency/publish.py); "false"
  writes nothing there.
- CKPTDRAIN_KUEUE_CONFIGMAP (kueue_config): "namespace/name" of Kueue's
  manager ConfigMap, read for its waitForPodsReady (operator/kueue/); ""
  (default) does not read it. Needs publish_recency (the same pass).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ckptdrain import units
from ckptdrain.contract.csi import DEFAULT_DRIVER_NAME, DEFAULT_MIN_MOUNT_GROUP
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import tenant_identities
from ckptdrain.operator.containers import DEFAULT_CONTAINERS, Containers, read_platform_json
from ckptdrain.store import ambient_endpoints

DEFAULT_IMAGE = "ckptdrain:dev"
#: The values of CKPTDRAIN_NODE_TIER.
NODE_TIER_HOSTPATH, NODE_TIER_CSI = "hostPath", "csi"
DEFAULT_CSI_DRIVER = DEFAULT_DRIVER_NAME
_CSI_DRIVER_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
#: The values of CKPTDRAIN_UNSELECTED_PODS.
UNSELECTED_REFUSE, UNSELECTED_FLAG = "Refuse", "Flag"


@dataclass(frozen=True)
class OperatorConfig:
    allowed_root: str = "/mnt/ckptdrain"
    cluster_bandwidth: float | None = None
    #: (namespace, weight) pairs: CKPTDRAIN_BANDWIDTH_WEIGHTS.
    bandwidth_weights: tuple[tuple[str, int], ...] = ()
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    agent_images: str = ""
    ambient_endpoints: tuple[tuple[str, str, int], ...] = ()
    identities: tenant_identities.Identities = ()
    #: (namespace, Google service account) pairs for gs:// stores: set only
    #: by a policy's class (spec.identity.googleServiceAccount), never from
    #: the environment (admission/tenant_identity.google_account).
    google_accounts: tuple[tuple[str, str], ...] = ()
    agent_service_account: str = "ckptdrain-agent"
    namespace: str = ""
    webhook_host: str = "127.0.0.1"
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_cert: str | None = None
    webhook_key: str | None = None
    webhook_ca: str | None = None
    webhook_client_ca: str | None = None
    webhook_managed: str = ""
    webhook_secret: str = ""
    webhook_configs: str = ""
    webhook_process: bool = True
    conversion_path: str = "convert"
    peer_ca_namespace: str = ""
    metrics_port: int = 9090
    health_port: int = 8080
    peering: str = "ckptdrain"
    expired_ttl_s: float = 600.0
    grace_margin: float = 0.8
    watchdog_s: float = 30.0
    #: How often policies whose class allows namespaces by label are judged
    #: again against their namespace's labels (class_events.py).
    namespace_recheck_s: float = 60.0
    #: How often the leader checks, once migrated, that the CheckpointPolicy
    #: CRD stores one version only (migration/run.py).
    storage_check_s: float = 300.0
    #: How long discovery must have shown the CRD's new storage version before
    #: the migration lists what to rewrite: the time every apiserver of the
    #: control plane is given to see the change (migration/plan.py).
    storage_settle_s: float = 60.0
    starting_limit_s: float = 600.0
    prepare_local_tier: bool = True
    node_tier: str = NODE_TIER_HOSTPATH
    csi_driver: str = DEFAULT_CSI_DRIVER
    csi_min_mount_group: int = DEFAULT_MIN_MOUNT_GROUP
    csi_capacity_namespace: str = ""
    containers: Containers = DEFAULT_CONTAINERS
    unselected_pods: str = UNSELECTED_REFUSE
    publish_recency: bool = True
    kueue_config: str = ""

    @property
    def csi(self) -> bool:
        """Whether injected pods get the CSI driver's volume (no hostPath)."""
        return self.node_tier == NODE_TIER_CSI


def _conversion_path(text: str) -> str:
    """The path as the admission server routes it: without its slashes."""
    path = text.strip().strip("/")
    if not text.strip().startswith("/") or not path or "?" in path:
        raise InvalidInput("CKPTDRAIN_CONVERSION_PATH", "an HTTP path such as /convert", text)
    return path


def _object_name(name: str, text: str) -> str:
    """"namespace/name", or "" (not set)."""
    value = text.strip()
    namespace, slash, rest = value.partition("/")
    if value and not (slash and namespace and rest and "/" not in rest):
        raise InvalidInput(name, "namespace/name, such as kueue-system/kueue-manager-config",
                           text)
    return value


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise InvalidInput(name, "true or false", text)
    return value == "true"


def _port(name: str, text: str) -> int:
    if not text.strip().isdigit() or int(text) > 65535:
        raise InvalidInput(name, "a port number 0-65535", text)
    return int(text)


def _root(name: str, text: str) -> str:
    if not text.startswith("/") or posixpath.normpath(text) in ("/", "//"):
        raise InvalidInput(name, "an absolute directory other than /", text)
    return posixpath.normpath(text)


def _object_ref(name: str, text: str) -> str:
    """A "namespace/name" reference, or "" for none."""
    if text and (text.count("/") != 1 or "" in text.split("/")):
        raise InvalidInput(name, "namespace/name", text)
    return text


def from_env(env: Mapping[str, str] | None = None) -> OperatorConfig:
    """Load and validate; raises InvalidInput naming the variable."""
    env = os.environ if env is None else env
    d = OperatorConfig()

    def get(name: str, default: str) -> str:
        return env.get(name, "") or default

    cap_text = get("CKPTDRAIN_CLUSTER_BANDWIDTH", "")
    cert, key = env.get("CKPTDRAIN_WEBHOOK_CERT") or None, env.get("CKPTDRAIN_WEBHOOK_KEY") or None
    if (cert is None) != (key is None):
        raise InvalidInput("CKPTDRAIN_WEBHOOK_CERT/CKPTDRAIN_WEBHOOK_KEY",
                           "both files or neither", "only one")
    for name, path in (("CKPTDRAIN_WEBHOOK_CERT", cert), ("CKPTDRAIN_WEBHOOK_KEY", key),
                       ("CKPTDRAIN_WEBHOOK_CA", env.get("CKPTDRAIN_WEBHOOK_CA") or None)):
        if path is not None and not os.path.isfile(path):
            raise InvalidInput(name, "a readable PEM file", path)
    client_ca = env.get("CKPTDRAIN_WEBHOOK_CLIENT_CA") or None
    if client_ca is not None and not os.path.isfile(client_ca):
        raise InvalidInput("CKPTDRAIN_WEBHOOK_CLIENT_CA", "a readable PEM file of CA "
                           "certificates", client_ca)
    webhook_process = _flag("CKPTDRAIN_WEBHOOK_PROCESS", get("CKPTDRAIN_WEBHOOK_PROCESS", "true"))
    if client_ca is not None and not webhook_process:
        # Kopf's own server (the operator's process) asks for no client certificate.
        raise InvalidInput("CKPTDRAIN_WEBHOOK_CLIENT_CA", "CKPTDRAIN_WEBHOOK_PROCESS=true "
                           "(only the admission process verifies client certificates)",
                           "CKPTDRAIN_WEBHOOK_PROCESS=false")
    secret = _object_ref("CKPTDRAIN_WEBHOOK_SECRET", get("CKPTDRAIN_WEBHOOK_SECRET", ""))
    if secret and cert is not None:
        raise InvalidInput("CKPTDRAIN_WEBHOOK_SECRET/CKPTDRAIN_WEBHOOK_CERT",
                           "one source of the webhook certificate", "both")
    pull = get("CKPTDRAIN_IMAGE_PULL_POLICY", d.image_pull_policy)
    if pull not in ("Always", "IfNotPresent", "Never"):
        raise InvalidInput("CKPTDRAIN_IMAGE_PULL_POLICY", "Always, IfNotPresent or Never", pull)
    unselected = get("CKPTDRAIN_UNSELECTED_PODS", d.unselected_pods)
    if unselected not in (UNSELECTED_REFUSE, UNSELECTED_FLAG):
        raise InvalidInput("CKPTDRAIN_UNSELECTED_PODS",
                           f"{UNSELECTED_REFUSE} or {UNSELECTED_FLAG}", unselected)
    node_tier = get("CKPTDRAIN_NODE_TIER", d.node_tier)
    if node_tier not in (NODE_TIER_HOSTPATH, NODE_TIER_CSI):
        raise InvalidInput("CKPTDRAIN_NODE_TIER", f"{NODE_TIER_HOSTPATH} or {NODE_TIER_CSI}",
                           node_tier)
    csi_driver = get("CKPTDRAIN_CSI_DRIVER", d.csi_driver)
    if not _CSI_DRIVER_NAME.fullmatch(csi_driver):
        raise InvalidInput("CKPTDRAIN_CSI_DRIVER", "a CSI driver name (a DNS-1123 subdomain "
                           "of at most 63 characters)", csi_driver)
    min_group = get("CKPTDRAIN_CSI_MIN_MOUNT_GROUP", str(d.csi_min_mount_group))
    if not min_group.isdigit() or int(min_group) < 1:
        raise InvalidInput("CKPTDRAIN_CSI_MIN_MOUNT_GROUP", "a group id of at least 1 (root's "
                           "group is never given the data)", min_group)
    return OperatorConfig(
        node_tier=node_tier, csi_driver=csi_driver, csi_min_mount_group=int(min_group),
        csi_capacity_namespace=get("CKPTDRAIN_CSI_CAPACITY_NAMESPACE", ""),
        allowed_root=_root("CKPTDRAIN_ALLOWED_ROOT", get("CKPTDRAIN_ALLOWED_ROOT",
                                                         d.allowed_root)),
        cluster_bandwidth=units.parse_rate("CKPTDRAIN_CLUSTER_BANDWIDTH", cap_text)
        if cap_text else None,
        bandwidth_weights=parse_weights(get("CKPTDRAIN_BANDWIDTH_WEIGHTS", "")),
        image=get("CKPTDRAIN_IMAGE", d.image),
        image_pull_policy=pull,
        agent_images=_object_ref("CKPTDRAIN_AGENT_IMAGES", get("CKPTDRAIN_AGENT_IMAGES", "")),
        ambient_endpoints=ambient_endpoints.parse_allowed(
            get("CKPTDRAIN_AMBIENT_ENDPOINTS", "")),
        identities=tenant_identities.parse(get(tenant_identities.VARIABLE, "")),
        agent_service_account=get("CKPTDRAIN_AGENT_SERVICE_ACCOUNT", d.agent_service_account),
        namespace=get("CKPTDRAIN_NAMESPACE", ""),
        webhook_host=get("CKPTDRAIN_WEBHOOK_HOST", d.webhook_host),
        webhook_addr=get("CKPTDRAIN_WEBHOOK_ADDR", d.webhook_addr),
        webhook_port=_port("CKPTDRAIN_WEBHOOK_PORT", get("CKPTDRAIN_WEBHOOK_PORT", "9443")),
        webhook_cert=cert, webhook_key=key,
        webhook_ca=env.get("CKPTDRAIN_WEBHOOK_CA") or None,
        webhook_managed=get("CKPTDRAIN_WEBHOOK_MANAGED", ""),
        webhook_secret=secret,
        webhook_configs=get("CKPTDRAIN_WEBHOOK_CONFIGS", ""),
        webhook_client_ca=client_ca,
        webhook_process=webhook_process,
        conversion_path=_conversion_path(get("CKPTDRAIN_CONVERSION_PATH", "/convert")),
        peer_ca_namespace=get("CKPTDRAIN_PEER_CA_NAMESPACE", ""),
        metrics_port=_port("CKPTDRAIN_METRICS_PORT", get("CKPTDRAIN_METRICS_PORT", "9090")),
        health_port=_port("CKPTDRAIN_HEALTH_PORT", get("CKPTDRAIN_HEALTH_PORT", "8080")),
        peering=get("CKPTDRAIN_PEERING", d.peering),
        prepare_local_tier=_flag("CKPTDRAIN_PREPARE_LOCAL_TIER",
                                 get("CKPTDRAIN_PREPARE_LOCAL_TIER", "true")),
        unselected_pods=unselected,
        publish_recency=_flag("CKPTDRAIN_PUBLISH_RECENCY",
                              get("CKPTDRAIN_PUBLISH_RECENCY", "true")),
        kueue_config=_object_name("CKPTDRAIN_KUEUE_CONFIGMAP",
                                  get("CKPTDRAIN_KUEUE_CONFIGMAP", "")),
        expired_ttl_s=units.parse_duration("CKPTDRAIN_EXPIRED_TTL",
                                           get("CKPTDRAIN_EXPIRED_TTL", "600"))
        if get("CKPTDRAIN_EXPIRED_TTL", "600") not in ("0", "0s") else 0.0,
        watchdog_s=units.parse_duration("CKPTDRAIN_WATCHDOG_PERIOD",
                                        get("CKPTDRAIN_WATCHDOG_PERIOD", "30s")),
        namespace_recheck_s=units.parse_duration(
            "CKPTDRAIN_NAMESPACE_RECHECK_PERIOD", get("CKPTDRAIN_NAMESPACE_RECHECK_PERIOD", "60s")),
        storage_check_s=units.parse_duration(
            "CKPTDRAIN_STORAGE_CHECK_PERIOD", get("CKPTDRAIN_STORAGE_CHECK_PERIOD", "5m")),
        storage_settle_s=units.parse_duration(
            "CKPTDRAIN_STORAGE_SETTLE", get("CKPTDRAIN_STORAGE_SETTLE", "1m")),
        starting_limit_s=units.parse_duration("CKPTDRAIN_STARTING_LIMIT",
                                              get("CKPTDRAIN_STARTING_LIMIT", "10m")),
        grace_margin=units.parse_fraction("CKPTDRAIN_GRACE_MARGIN",
                                          get("CKPTDRAIN_GRACE_MARGIN", "80%")),
        containers=read_platform_json("CKPTDRAIN_CONTAINERS", env["CKPTDRAIN_CONTAINERS"])
        if env.get("CKPTDRAIN_CONTAINERS", "").strip() else d.containers,
    )


#: The largest weight a namespace may have: enough for any policy between
#: teams, small enough that no weight makes the cluster scale's factor tiny.
MAX_WEIGHT = 1000
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_weights(text: str) -> tuple[tuple[str, int], ...]:
    """CKPTDRAIN_BANDWIDTH_WEIGHTS: "ns=weight,ns=weight" (empty: none)."""
    field = "CKPTDRAIN_BANDWIDTH_WEIGHTS"
    pairs: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, weight = (x.strip() for x in item.partition("="))
        if not sep or not _NAMESPACE.fullmatch(name):
            raise InvalidInput(field, "namespace=weight pairs separated by commas, "
                               "such as team-a=4,team-b=2", item)
        if not re.fullmatch(r"[0-9]{1,4}", weight) or not 1 <= int(weight) <= MAX_WEIGHT:
            raise InvalidInput(field, f"a whole number from 1 to {MAX_WEIGHT} for {name}",
                               weight)
        if name in pairs:
            raise InvalidInput(field, f"each namespace once ({name} is given twice)", text)
        pairs[name] = int(weight)
    return tuple(sorted(pairs.items()))
