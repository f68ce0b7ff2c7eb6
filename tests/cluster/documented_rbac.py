"""The RBAC rules as the docs write them, the one source the cluster tests
bind: docs/rbac.md (the operator's) and docs/rbac-agent.md (the agent's)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from operator_process import repo_root

OPERATOR_PAGE, AGENT_PAGE = "rbac.md", "rbac-agent.md"


def _blocks(page: str, after: str = "") -> list[str]:
    """The yaml blocks of docs/`page`, in order, from the heading `after` on."""
    text = (repo_root() / "docs" / page).read_text()
    return re.findall(r"```yaml\n(.*?)```", text[text.index(after):], re.S)


def _rules(block: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(block)["rules"])


def operator_rules(dev_mode: bool) -> list[dict[str, Any]]:
    """The operator's cluster rules (docs/rbac.md's first block); with
    `dev_mode`, also the managed-webhook rule the doc keeps commented out."""
    block = _blocks(OPERATOR_PAGE)[0]
    if dev_mode:
        block = re.sub(r"^  # (- apiGroups: \[admissionregistration|  (resources|verbs): )",
                       r"  \1", block, flags=re.M)
    return _rules(block)


def operator_section_rules(heading: str) -> list[dict[str, Any]]:
    """The rules of the first yaml block after `heading` in docs/rbac.md."""
    return _rules(_blocks(OPERATOR_PAGE, heading)[0])


def agent_rules() -> list[dict[str, Any]]:
    """The agent's Role in its training namespace (docs/rbac-agent.md)."""
    return _rules(_blocks(AGENT_PAGE, "## Agent and restore")[0])


def agent_node_lease_rules() -> list[dict[str, Any]]:
    """The agent's Role in kube-node-lease (docs/rbac-agent.md, the block after its Role)."""
    return _rules(_blocks(AGENT_PAGE, "## Agent and restore")[1])
