"""A CheckpointPolicy as the API states it. Pure: no Kubernetes, no network, no clock
it was not given.

spec.py reads and checks the spec, field by field through fields.py, with the parts it
delegates: storage_options.py, peer_tier.py (which also names the peer tier's objects),
identity.py for which rank a pod is, roles.py for whether it writes or only
reads; allocation.py sizes each
policy's share of the cluster cap; status.py builds the status (phase, conditions)
from them; history.py remembers the store prefixes the policy moved away from
(status.storage).

May import: the operator's base (config). Every room above reads policies through it.
"""
