"""The refusal example of docs/api-versions.md ("What a refusal says"): its
v1beta1 policy and what a create of it is told at each version. The docs
test checks it against the operator's own checks; the cluster test
(tests/cluster/test_version_refusals.py) against a real apiserver."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO

PAGE = REPO / "docs" / "api-versions.md"
SECTION = "## What a refusal says"


@dataclass(frozen=True)
class RefusalExample:
    policy: dict[str, Any]  # at v1beta1, as the page shows it
    at_v1beta1: str  # what a create at v1beta1 is told
    at_v1alpha1: str  # and the same policy at v1alpha1


def _bare_blocks(text: str) -> list[str]:
    """The fenced blocks of `text` without a language (text, not code)."""
    found: list[str] = []
    lang: str | None = None  # the open block's, None outside one
    body: list[str] = []
    for line in text.splitlines():
        fence = re.fullmatch(r"```([A-Za-z0-9_+-]*)", line.strip())
        if fence and lang is None:
            lang, body = fence[1], []
        elif fence:
            if lang == "":
                found.append("\n".join(body))
            lang = None
        elif lang is not None:
            body.append(line)
    return found


def refusal_example() -> RefusalExample:
    text = PAGE.read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + len(SECTION))]
    (policy,) = [b for b in blocks.parse(PAGE)
                 if b.lang == "yaml" and b.note.startswith("refused") and b.kind == "fragment"]
    told = _bare_blocks(section)
    assert len(told) == 2, told
    return RefusalExample(yaml.safe_load(policy.text), told[0], told[1])
