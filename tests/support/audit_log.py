"""The apiserver's audit log in the cluster tests: the policy docs/audit.md
recommends, exactly as the page shows it, the kube-apiserver flags that
write its log under the cluster's workdir, and the events read back."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tests.docs import blocks
from tests.docs.blocks import REPO

PAGE = REPO / "docs" / "audit.md"
#: The marker note of the page's policy block (`docs-test: fragment audit-policy ...`).
POLICY_NOTE = "audit-policy"
LOG_NAME = "audit.log"


def policy_text() -> str:
    """The audit Policy block of docs/audit.md, as written."""
    found = [b for b in blocks.parse(PAGE)
             if b.kind == "fragment" and b.note.split()[:1] == [POLICY_NOTE]]
    assert len(found) == 1, f"{PAGE}: expected one `fragment {POLICY_NOTE}` block, found " \
                            f"{len(found)}"
    return found[0].text


def apiserver_args(workdir: Path) -> list[str]:
    """kube-apiserver flags that run docs/audit.md's policy, its log in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(policy_text())
    return [f"--audit-policy-file={policy}", f"--audit-log-path={workdir / LOG_NAME}",
            # The log backend's default, said here because the readers rely
            # on it: each event is written as its request ends, not batched.
            "--audit-log-mode=blocking"]


def events(workdir: Path) -> list[dict[str, Any]]:
    """Every event the apiserver running in `workdir` has written so far."""
    path = workdir / LOG_NAME
    if not path.exists():
        return []
    # Whole lines only: the last may be half written while the apiserver writes it.
    *whole, _ = path.read_text().split("\n")
    return [json.loads(line) for line in whole if line]


def refusals(workdir: Path, username: str) -> list[dict[str, Any]]:
    """The requests of `username` the apiserver answered with a 4xx: one
    event each, at the stage its answer was complete."""
    return [e for e in events(workdir)
            if e.get("user", {}).get("username") == username
            and e.get("stage") == "ResponseComplete"
            and 400 <= e.get("responseStatus", {}).get("code", 0) < 500]


def refused(event: dict[str, Any], verb: str, resource: str, namespace: str,
            name: str | None = None, subresource: str = "") -> bool:
    """Whether `event` is the request `verb` on `resource` in `namespace`
    (`name`: that object; None: any, as a list or a create before the
    name is known), on its `subresource` ("": the object itself, not
    `pods/log` for `pods`)."""
    ref = event.get("objectRef") or {}
    return (event.get("verb") == verb and ref.get("resource") == resource
            and ref.get("namespace") == namespace
            and ref.get("subresource", "") == subresource
            and (name is None or ref.get("name") == name))


def holds(workdir: Path, value: str) -> bool:
    """Whether the log has `value` anywhere, as written or base64-encoded
    (as a Secret's data is sent and answered)."""
    path = workdir / LOG_NAME
    text = path.read_text() if path.exists() else ""
    return value in text or base64.b64encode(value.encode()).decode() in text
