"""The contract between the node side (agent, restore, trainer client) and the
cluster side (operator, webhook). Both import it; neither owns it. Pure.

- `api`: the API group and version, resource plurals and kinds, label and
  annotation keys, the one timestamp format, the restored-from value;
- `env`: the environment variables the webhook injects and the node side
  reads (docs/pod-contract.md);
- `record`: the `Checkpoint` record format, its states and each writer's claim;
- `drain`: the policy's drain settings both sides read (drain.stallTimeout);
- `policy_versions`: CheckpointPolicy in v1alpha1 and v1beta1, converted
  both ways (the CRD's conversion webhook answers with it);
- `goodput`: the goodput annotations each pod's agent and restore write and
  the operator reads (`ckptdrain.io/goodput`, `ckptdrain.io/restore-result`).

A change here changes both sides at once: docs/pod-contract.md says what a
deployed pair of operator and agent images expects of each other.
"""
