"""A bound a refusal states can be pasted back into the field it names and
is accepted (policy/spec.py, policy/peer_tier.py): "at least" amounts are
rounded up, "at most" ones down, at either version's wording
(policy/version_messages.py)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, to_v1alpha1
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import version_messages as said

CFG = OperatorConfig(allowed_root="/mnt/ckptdrain")
#: The amount of a bound, as either version says it: "1.32 TB", "1.32T", "10.0 GB/s", "10G".
BOUND = re.compile(r"at (?:least|most) (?:one copy of a writer's checkpoint, "
                   r"|one checkpoint shard, |caps\.bandwidth \()?([0-9.]+(?: ?[A-Za-z]+(?:/s)?)?)")


def spec_at(version: str, parameters: int, bandwidth: int, **bounded: object
            ) -> dict[str, Any]:
    """A spec at `version` (v1alpha1: converted), `bounded` ({field: value})
    set into it."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "llama"}},
        "model": {"parameters": parameters, "bytesPerParameter": "12.5"},
        "writers": 2, "interval": "1h30m",
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2, "capacity": 10**16,
                      "memory": {"sizeLimit": 10**16}},
        "peerTier": {"enabled": True, "capacity": 10**16},
        "caps": {"bandwidth": bandwidth, "perDrainer": 1},
        "storage": {"uri": "s3://bucket/llama"}}
    for field, value in bounded.items():
        *parents, name = field.split(".")[1:]
        holder = spec
        for key in parents:
            holder = holder[key]
        holder[name] = value
    if version == V1ALPHA1:
        return to_v1alpha1({"apiVersion": V1BETA1, "spec": spec})["spec"]
    return spec


def told(problems: list[InvalidInput], version: str) -> dict[str, str]:
    """Each problem's field and the amount of its bound, as `version` says it."""
    out = {}
    for problem in problems:
        found = BOUND.search(said.in_version(problem, version).expected)
        assert found, problem
        out[problem.field] = found[1]
    return out


@settings(max_examples=60, deadline=None)
@given(parameters=st.integers(min_value=10**9, max_value=10**12),
       bandwidth=st.integers(min_value=10**8, max_value=10**12))
def test_a_bound_pasted_from_a_refusal_is_accepted(parameters: int, bandwidth: int) -> None:
    # The sizes are judged only once every other field reads: one policy each.
    for too_far in ({"spec.localTier.capacity": 1, "spec.localTier.memory.sizeLimit": 1},
                    {"spec.peerTier.capacity": 1}, {"spec.caps.perDrainer": 10**13}):
        for version in (V1ALPHA1, V1BETA1):
            refused = pol.validate(spec_at(version, parameters, bandwidth, **too_far), CFG,
                                   "llama")
            bounds = told(refused, version)
            assert sorted(bounds) == sorted(too_far), refused
            pasted = pol.validate(spec_at(version, parameters, bandwidth, **bounds), CFG,
                                  "llama")
            assert pasted == [], (version, bounds, [str(p) for p in pasted])
