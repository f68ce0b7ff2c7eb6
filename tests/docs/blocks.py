"""The fenced code blocks of the README and docs/, and what each asks of the tests.

Every block with a language is run or checked by tests/docs. A block that
cannot run as it is says so in an HTML comment on the line before it:

    <!-- docs-test: skip REASON -->       not run (a python block is still
                                          compiled and checked for undefined
                                          names; "given: a b" names the ones
                                          the text leaves to the reader)
    <!-- docs-test: cluster -->           needs a cluster, a cloud account or
                                          Docker: not run; its helm and
                                          kubectl lines are checked against
                                          the examples (test_pairings.py)
    <!-- docs-test: s3 -->                a shell block run with a real S3
                                          server: AWS_ENDPOINT_URL and keys
                                          exported, each s3:// bucket it names
                                          created
    <!-- docs-test: fragment policy -->   part of a CheckpointPolicy spec:
                                          merged into a valid one, validated
    <!-- docs-test: fragment values -->   part of the chart's values: rendered
    <!-- docs-test: fragment gitops -->   Argo CD / Flux objects installing the
                                          chart: its name, values and what
                                          Argo CD ignores checked against a
                                          render (tests/docs/gitops.py)
    <!-- docs-test: fragment kueue -->    Kueue's objects (no Kueue CRDs in the
                                          test apiserver): each a named
                                          kueue.x-k8s.io object, the queues
                                          naming each other; the e2e applies
                                          them (e2e/scenario/kueue.py)
    <!-- docs-test: fragment REASON -->   YAML or JSON that is part of
                                          something else: parsed only

Unmarked: `python` runs, `sh`/`bash` run, `yaml` must be whole Kubernetes
objects (validated and applied in a server-side dry run), `json` parses.
Any other language unmarked fails. Bare fences (no language) are text, and
indented blocks are transcripts (`$ ckptdrain ...` with `...` for elided
output): neither is code to run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KINDS = ("skip", "cluster", "s3", "fragment")
RUNNABLE = ("python", "sh", "bash", "yaml", "json")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[A-Za-z0-9_+-]*)\s*$")
_MARK = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>[a-z0-9]+)\s*(?P<rest>.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str  # "" (unmarked) or one of KINDS
    note: str  # the rest of the marker: a reason, "policy", "values", "given: ..."

    @property
    def id(self) -> str:
        path = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{path}:{self.line}"

    def given(self) -> list[str]:
        """Names a skipped python block leaves to the reader ("given: a b")."""
        _, _, names = self.note.partition("given:")
        return names.split()


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def parse(path: Path) -> list[Block]:
    """The fenced blocks of `path` with a language, with their markers.
    A marker that names an unknown kind, or stands before no block, is an
    error (a typo would otherwise silently unmark a block)."""
    lines = path.read_text().split("\n")
    blocks: list[Block] = []
    i = 0
    pending: tuple[int, str, str] | None = None
    while i < len(lines):
        stripped = lines[i].strip()
        mark = _MARK.match(stripped)
        if mark:
            if mark["kind"] not in KINDS:
                raise ValueError(f"{path}:{i + 1}: unknown docs-test marker {mark['kind']!r}, "
                                 f"expected one of {', '.join(KINDS)}")
            pending = (i + 1, mark["kind"], mark["rest"])
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            if stripped and pending:
                raise ValueError(f"{path}:{pending[0]}: docs-test marker not followed by a "
                                 "fenced block")
            i += 1
            continue
        indent, ticks = fence["indent"], fence["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        if fence["lang"]:
            kind, note = (pending[1], pending[2]) if pending else ("", "")
            blocks.append(Block(path, i + 1, fence["lang"], "\n".join(body) + "\n", kind, note))
        elif pending:
            raise ValueError(f"{path}:{pending[0]}: docs-test marker before a block with no "
                             "language")
        pending = None
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in parse(path)]


def shell_lines(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, a quoted
    argument that spans lines (a jq program) kept whole, comments and blank
    lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out, pending = [], ""
    for line in joined.split("\n"):
        if pending:
            pending += "\n" + line
        elif line.strip() and not line.strip().startswith("#"):
            pending = line.strip()
        else:
            continue
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the command goes on
            continue
        out.append(pending)
        pending = ""
    if pending:
        out.append(pending)
    return out
