"""docs/checkpoint-classes.md's example does what the page says: the
class is the default, the policy naming no class gets it, its path is
under the class's root (and would be refused under the operator's own),
and the endpoint it leaves unset comes from the class's store. The
apiserver's dry run of the same objects is test_examples.py's."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO
from tests.docs.conftest import (
    classed_policy_problems,
    default_config,
    policy_problems,
    stored,
)

PAGE = REPO / "docs" / "checkpoint-classes.md"


def _objects() -> list[dict[str, Any]]:
    [block] = [b for b in blocks.parse(PAGE) if b.lang == "yaml" and b.kind == ""]
    return [d for d in yaml.safe_load_all(block.text) if d]


def _example() -> tuple[dict[str, Any], dict[str, Any]]:
    objects = _objects()
    [cls] = [o for o in objects if o["kind"] == "CheckpointClass"]
    [written] = [o for o in objects if o["kind"] == "CheckpointPolicy"]
    return cls, stored(written)


def test_the_example_policy_gets_the_default_class_and_its_store_settings() -> None:
    cls, policy = _example()
    assert cls["metadata"]["annotations"]["ckptdrain.io/is-default-class"] == "true"
    assert "checkpointClassName" not in policy["spec"]
    name, filled, problems = classed_policy_problems(
        policy["metadata"]["namespace"], policy["spec"], [cls], default_config(),
        policy["metadata"]["name"])
    assert (name, problems) == ("nvme-minio", [])
    assert filled["storage"]["endpoint"] == cls["spec"]["stores"][0]["endpoint"]
    assert filled["storage"]["addressingStyle"] == "path"
    # Without the class the operator's own root refuses the same path.
    assert any("localTier.path" in p for p in policy_problems(policy["spec"], default_config()))


def test_the_example_class_refuses_a_store_of_another_namespace() -> None:
    cls, policy = _example()
    other = copy.deepcopy(policy["spec"])
    other["storage"]["uri"] = "s3://checkpoints/ml-team-b/llama"
    _, _, problems = classed_policy_problems(policy["metadata"]["namespace"], other, [cls],
                                             default_config())
    assert problems and problems[0].startswith("spec.storage.uri:")
    assert "CheckpointClass nvme-minio" in problems[0]
