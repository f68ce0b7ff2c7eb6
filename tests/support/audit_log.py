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
#: The size at which the apiserver rotates its log (the log backend's default).
ROTATE_AT_MB = 100


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
            "--audit-log-mode=blocking",
            # Rotation, said rather than left to the backend's defaults: at
            # 100 MB the log is renamed to audit-<time>.log and a new one
            # begun, and every rotated file is kept (0), so that the
            # readers below, which read them too, lose no event.
            f"--audit-log-maxsize={ROTATE_AT_MB}", "--audit-log-maxbackup=0"]


def _files(workdir: Path) -> list[Path]:
    """The log's rotated files, oldest first (their names hold the time of
    rotation), then the one being written."""
    stem, suffix = LOG_NAME.rsplit(".", 1)
    return [*sorted(workdir.glob(f"{stem}-*.{suffix}")), workdir / LOG_NAME]


def _contents(workdir: Path) -> list[bytes]:
    """What each of the log's files holds so far, in order. A file renamed
    away between listing and reading (the log rotating) or not yet made is
    not there yet: a later read finds what it held."""
    contents = []
    for path in _files(workdir):
        try:
            contents.append(path.read_bytes())
        except FileNotFoundError:
            continue
    return contents


def _whole_lines(workdir: Path) -> list[bytes]:
    """Every whole line written so far, in order. The last line of the file
    being written may be half written (even cut inside a character): it is
    left for a later read."""
    lines: list[bytes] = []
    for data in _contents(workdir):
        *whole, _ = data.split(b"\n")
        lines += [line for line in whole if line]
    return lines


def events(workdir: Path) -> list[dict[str, Any]]:
    """Every event the apiserver running in `workdir` has written so far."""
    return [json.loads(line) for line in _whole_lines(workdir)]


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
    `pods/log` for `pods`), and not a dry run (a test's probe of what the
    apiserver would answer is not the attempt it checks)."""
    ref = event.get("objectRef") or {}
    return (event.get("verb") == verb and ref.get("resource") == resource
            and "dryRun=" not in event.get("requestURI", "")
            and ref.get("namespace") == namespace
            and ref.get("subresource", "") == subresource
            and (name is None or ref.get("name") == name))


def holds(workdir: Path, value: str) -> bool:
    """Whether the log has `value` anywhere, a half-written last line
    included, as written or base64-encoded (as a Secret's data is sent and
    answered)."""
    wanted = (value.encode(), base64.b64encode(value.encode()))
    return any(w in data for data in _contents(workdir) for w in wanted)
