"""The peer tier's cluster side (docs/peer-tier.md): who pairs with whom and the recovery
point on node loss (placement.py, pure), the per-policy CA and certificates (certs.py),
their objects in the API (kube.py), and the pass that keeps them and the status
(sync.py). What the webhook adds to a pod for it is policy/peer_tier.py.

May import: the operator's base, apiserver/, policy/, records/ and tls/.
"""
