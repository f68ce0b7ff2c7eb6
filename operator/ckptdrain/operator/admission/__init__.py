"""Which pods are admitted, and with what: the rules shared by both servers (rules.py),
the pod patch (injection.py) and the environment it gives each container (pod_env.py),
the cloud identity carried over to our containers (cloud_identity.py) or the
namespace's own that the platform maps (tenant_identity.py); the admission
process (process.py, server.py) with its own views (policy_mirror.py, holder_mirror.py,
owner_cache.py), the CheckpointPolicy CRD's ConversionReviews it answers at /convert
(conversion.py), and its supervisor in the operator (supervisor.py); Kopf's registration
of the webhooks (webhook.py); and the sweep that makes an opted-in pod admitted bare
impossible to miss (sweep.py).

May import: the operator's base, apiserver/, policy/ and tls/.
"""
