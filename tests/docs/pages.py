"""What a page tells a user to run on a cluster, read from its `cluster` blocks
and its header links: the chart's install line, the namespaces it creates,
and each manifest it applies (into which namespace, with which edits).

The forms understood are the ones the docs use:

    kubectl create namespace NS
    helm install|upgrade RELEASE CHART [-n NS] [--create-namespace] [--wait]
        [-f VALUES]... [--set K=V]...
    helm upgrade RELEASE CHART --reset-then-reuse-values ...   (a change to
        a release installed before, not an install: only in a section of
        RUN_BY_THEIR_OWN_TEST, whose test runs it; anywhere else an error)
    kubectl apply [-n NS] -f FILE [-f FILE]...
    sed "s|OLD|NEW|" FILE | kubectl apply [-n NS] -f -
    Values: [`docs/examples/values-x.yaml`](...)   (a guide's header)
    Policy: [`docs/examples/policy-x.yaml`](...)

Any other `helm` or `kubectl apply` line is an error, so a new form gets
understood here before a page can use it.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tests.docs.blocks import REPO, Block, parse, shell_lines

_HEADER = re.compile(r"^(Values|Policy): \[`(?P<path>docs/examples/[^`]+)`\]", re.M)

#: Sections whose `helm upgrade --reset-then-reuse-values` lines change a
#: release installed before, run as written by their own test
#: (tests/chart/test_chart_node_tier_move.py reads its section from here).
RUN_BY_THEIR_OWN_TEST = {REPO / "docs" / "install.md": "### Moving from the hostPath mode"}


def section_of(path: Path, line: int) -> str | None:
    """The heading (as written) of the section holding 1-based `line`."""
    heading, fenced = None, False
    for text in path.read_text().split("\n")[:line - 1]:
        if text.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", text):
            heading = text
    return heading


@dataclass(frozen=True)
class Applied:
    """One manifest file applied by a page."""

    file: Path
    namespace: str | None  # -n, else each object's own
    replace: tuple[str, str] | None = None  # sed's s|OLD|NEW|

    def objects(self) -> list[dict[str, Any]]:
        text = self.file.read_text()
        if self.replace:
            text = text.replace(*self.replace)
        docs = [d for d in yaml.safe_load_all(text) if d]
        for d in docs:
            meta = d.setdefault("metadata", {})
            if self.namespace and meta.setdefault("namespace", self.namespace) != self.namespace:
                # kubectl refuses it: "the namespace from the provided object
                # does not match the namespace" given with -n.
                raise ValueError(f"{self.file}: {meta['name']} is in {meta['namespace']!r}, "
                                 f"applied with -n {self.namespace}")
        return docs


@dataclass
class Page:
    path: Path
    helm_args: list[str] | None = None  # values and --set of its helm install
    created: set[str] = field(default_factory=set)
    applied: list[Applied] = field(default_factory=list)
    header: list[Path] = field(default_factory=list)  # Values:/Policy: links

    @property
    def values_files(self) -> list[Path]:
        files = [p for p in self.header if p.name.startswith("values")]
        args = self.helm_args or []
        files += [REPO / a for flag, a in itertools.pairwise(args) if flag == "-f"]
        return files

    def policies(self) -> list[dict[str, Any]]:
        found = [d for a in self.applied for d in a.objects()
                 if d.get("kind") == "CheckpointPolicy"]
        for p in self.header:
            if not p.name.startswith("values"):
                found += [d for d in yaml.safe_load_all(p.read_text())
                          if d and d.get("kind") == "CheckpointPolicy"]
        return found

    def workloads(self) -> list[dict[str, Any]]:
        return [d for a in self.applied for d in a.objects()
                if d.get("kind") == "Job" and "ckptdrain.io/inject" in
                d["spec"]["template"].get("metadata", {}).get("labels", {})]


def _sed(expr: str) -> tuple[str, str]:
    m = re.fullmatch(r"s\|([^|]*)\|([^|]*)\|", expr)
    if not m:
        raise ValueError(f"sed expression {expr!r}: expected s|OLD|NEW|")
    return m[1], m[2]


def _apply(words: list[str], stdin: tuple[Path, tuple[str, str]] | None) -> list[Applied]:
    namespace, files = None, []
    i = 2
    while i < len(words):
        if words[i] in ("-n", "--namespace"):
            namespace = words[i + 1]
        elif words[i] == "-f":
            files.append(words[i + 1])
        else:
            raise ValueError(f"kubectl apply: unexpected {words[i]!r}")
        i += 2
    out = []
    for f in files:
        if f == "-":
            if stdin is None:
                raise ValueError("kubectl apply -f - without a sed pipe")
            out.append(Applied(stdin[0], namespace, stdin[1]))
        else:
            out.append(Applied(REPO / f, namespace))
    return out


def _helm(words: list[str]) -> list[str]:
    args, i = [], 4
    while i < len(words):
        w = words[i]
        if w in ("-n", "--namespace"):
            i += 2
        elif w in ("--create-namespace", "--wait"):
            i += 1
        elif w in ("-f", "--set", "--set-string"):
            args += [w, words[i + 1]]
            i += 2
        else:
            raise ValueError(f"helm {words[1]}: unexpected {w!r}")
    return args


def read(path: Path) -> Page:
    page = Page(path)
    page.header = [REPO / m["path"] for m in _HEADER.finditer(path.read_text())]
    for block in parse(path):
        if block.kind != "cluster":
            continue
        for line in shell_lines(block.text):
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|")
            lexer.whitespace_split = True
            words = list(lexer)
            if "|" in words:
                left, right = words[:words.index("|")], words[words.index("|") + 1:]
            else:
                left, right = words, []
            if left[:3] == ["kubectl", "create", "namespace"]:
                page.created.add(left[3])
            elif left[:2] == ["helm", "upgrade"] and ("--reset-then-reuse-values" in left
                                                     or "--reuse-values" in left):
                # A change to a release installed before, run by its own test.
                if section_of(path, block.line) != RUN_BY_THEIR_OWN_TEST.get(path):
                    raise ValueError(f"{block.id}: {line!r} changes a release installed "
                                     "before, in a section no test runs (expected one of "
                                     "RUN_BY_THEIR_OWN_TEST)")
                continue
            elif left[:1] == ["helm"] and left[1:2] in (["install"], ["upgrade"]):
                if page.helm_args is not None:
                    raise ValueError(f"{path}: two helm install lines")
                page.helm_args = _helm(left)
            elif left[:2] == ["helm", "template"] and right[:2] == ["kubectl", "apply"]:
                continue  # CRDs rendered for a release and applied: no release installed
            elif left[:1] == ["helm"]:
                raise ValueError(f"{path}: unknown helm line {line!r}")
            elif left[:2] == ["kubectl", "apply"]:
                page.applied += _apply(left, None)
            elif left[:1] == ["sed"] and right[:2] == ["kubectl", "apply"]:
                page.applied += _apply(right, (REPO / left[2], _sed(left[1])))
    return page


def pages() -> list[Page]:
    from tests.docs.blocks import documents
    return [read(p) for p in documents()]


def block_of(page: Page) -> list[Block]:
    return [b for b in parse(page.path) if b.kind == "cluster"]
