"""The cluster side: the operator process, its admission webhooks and its passes.

Each sub-package is one thing the operator does for the user; the listing reads
as the architecture. Lower rooms never import higher ones (tests/unit/test_layering.py
holds these rules as a test):

    config.py, metrics.py,     the base every room may import: one validated config,
    coalesce.py, heap.py,      the Prometheus metrics, one pass per burst, heap trim,
    containers.py,             the injected containers' resources (platform, policy),
    tenant_identities.py       each tenant namespace's store identity (platform)
    apiserver/                 the admission process's connection, reads and watched
                               views; the operator's writes outside Kopf; which
                               replica may write (leadership); policies read and
                               written at v1beta1, seen at v1alpha1 (policy_edge)
    policy/                    a CheckpointPolicy as API, pure: the spec read and
                               checked, its sizing share of the cluster cap, its status
    tls/                       the webhook's own CA and serving certificate
    bandwidth/                 every policy's joint budget, published to its agents
    records/                   checkpoint records, retention, restores, the drain watchdog
    goodput/                   runtime goodput into the status, metrics and a report
    peers/                     the peer tier's cluster side: pairs, Secrets, ConfigMap
    recency/                   each workload's newest surviving step per failure
                               domain, published on it and its Kueue Workload
    migration/                 the storage version migration of CheckpointPolicies
                               after an upgrade: rewrite each, then trim the CRD's
                               storedVersions (the leader only)
    admission/                 which pods and policies are admitted with what: the
                               webhooks, the pod patch, writer identity, and the sweeps
                               for bare pods and overlapping policies
    handlers.py, main.py,      the wiring, importable by no room: Kopf's handlers,
    command.py                 the process's start, `ckptdrain operator`

Like every cluster-side module, none of these imports the node side (node/, agent/,
restore/, peer/, dcp/): the two sides meet in contract/.
"""
