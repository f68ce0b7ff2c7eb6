"""The package's layers, as tests: who may import whom.

Inside the package (read from the source, every import statement, lazy ones
inside functions included):
- the core (top-level modules and contract/) imports nothing from store/,
  transfer/, agent/, node/, restore/, operator/ or demo/;
- store/ imports only the core;
- transfer/ imports only the stores and the core;
- the node side (node/, peer/, restore/, dcp/ in the trainer, agent/) never
  imports operator/, and operator/ never imports the node side: they meet in
  contract/; inside it, node/ < peer/ < restore/ < dcp/ < agent/ (NODE_ABOVE):
  no arrow runs back up, so the peer tier never reaches into the agent;
- the CSI driver (csi/), a privileged process of its own, imports only the
  core, and neither side imports it (what they share goes in contract/);
- the cloud and cluster SDKs, and gRPC, appear only at their edges;
- inside operator/, each room imports only the rooms below it (OPERATOR_ROOMS):
  the base (config, containers, metrics, coalesce, heap, tenant_identities)
  nothing; apiserver/ the base;
  policy/ the base; and so on up to the wiring (handlers, policy_reconcile, class_events,
  main, command), which no room imports.
The entry points (cli.py, __main__.py) may import anything.

And at run time, in a fresh interpreter: importing the pure core loads
nothing from Kubernetes, Kopf or boto.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "ckptdrain"
ENTRY_POINTS = {"cli", "__main__"}
SUBPACKAGES = {"contract", "store", "transfer", "node", "agent", "restore", "operator", "demo",
               "dcp", "peer", "csi"}
NODE_SIDE = {"node", "agent", "restore", "dcp", "peer"}
#: Inside the node side, the rooms each one stands below and must never import:
#: node/ is what they all share; the peer tier serves agent and restore; dcp/ reads
#: through restore's sources in the trainer; agent/ is the top, imported by none.
NODE_ABOVE = {
    "node": frozenset({"peer", "restore", "dcp", "agent"}),
    "peer": frozenset({"restore", "dcp", "agent"}),
    "restore": frozenset({"dcp", "agent"}),
    "dcp": frozenset({"agent"}),
    "agent": frozenset(),
}
OUTER = {"store", "transfer", "agent", "node", "restore", "operator", "demo", "dcp", "peer",
         "csi"}


@dataclass(frozen=True)
class Rule:
    who: str
    forbidden: frozenset[str]
    why: str


RULES = {
    "core": Rule("the core (top-level modules and contract/)", frozenset(OUTER),
                 "the core is pure and sits below every other layer"),
    "contract": Rule("the core (top-level modules and contract/)", frozenset(OUTER),
                     "the contract belongs to neither side"),
    "store": Rule("store/", frozenset(OUTER - {"store"}),
                  "the stores sit below the transfer engine and both sides"),
    "transfer": Rule("transfer/", frozenset(OUTER - {"store", "transfer"}),
                     "the transfer engine sits below both sides and knows only the stores"),
    **{side: Rule(f"the node side ({side}/)",
                  frozenset({"operator", "demo", "csi"} | NODE_ABOVE[side]),
                  "the node side never imports the cluster side, and a node room never"
                  " imports a room that stands on it")
       for side in NODE_SIDE},
    "operator": Rule("the cluster side (operator/)", frozenset(NODE_SIDE | {"csi"}),
                     "the cluster side never imports the node side; they meet in contract/"),
    "csi": Rule("the CSI driver (csi/)", frozenset(OUTER - {"csi"}),
                "the driver is a privileged process of its own and stands on the core alone"),
}
#: The cluster side's rooms (operator/ckptdrain/operator/__init__.py draws them) and the
#: rooms each may import besides itself. A module at the top of operator/ is in the
#: base or the wiring; a sub-package is a room of its own.
OPERATOR_BASE = {"config", "containers", "metrics", "coalesce", "heap", "tenant_identities"}
OPERATOR_WIRING = {"handlers", "policy_reconcile", "class_events", "main", "command"}
OPERATOR_ROOMS: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "apiserver": frozenset({"base"}),
    "policy": frozenset({"base"}),
    "tls": frozenset({"base", "apiserver"}),
    "bandwidth": frozenset({"base", "apiserver", "policy"}),
    "records": frozenset({"base", "apiserver", "policy"}),
    "goodput": frozenset({"base", "apiserver"}),
    "peers": frozenset({"base", "apiserver", "policy", "records", "tls"}),
    "admission": frozenset({"base", "apiserver", "policy", "tls"}),
    "recency": frozenset({"base", "apiserver"}),
    "migration": frozenset({"base", "apiserver"}),
    "kueue": frozenset({"base", "apiserver", "policy", "bandwidth", "admission", "recency"}),
    "wiring": frozenset({"base", "apiserver", "policy", "tls", "bandwidth", "records",
                         "goodput", "peers", "admission", "recency", "kueue",
                         "migration"}),
}
#: Third-party SDKs and the only places that may import them.
SDK_EDGES = {
    "kubernetes": ({"operator"}, {"kubeclient", "node/kube", "csi/policies"}),
    "grpc": ({"csi"}, set()),
    "kopf": ({"operator"}, set()),
    "boto3": ({"store", "demo"}, set()),
    "botocore": ({"store", "demo"}, set()),
}


def _name(path: str) -> str:
    """'store/s3.py' -> 'store/s3'; 'node/__init__.py' -> 'node'."""
    return path.removesuffix(".py").removesuffix("/__init__")


def _layer(name: str) -> str:
    first = name.split("/")[0]
    if first in SUBPACKAGES:
        return first
    return "entry" if first in ENTRY_POINTS else "core"


def _operator_room(name: str) -> str:
    """'operator/admission/rules' -> 'admission'; 'operator/config' -> 'base'."""
    parts = name.split("/")[1:]
    if len(parts) > 1:
        return parts[0]
    if not parts or parts[0] in OPERATOR_BASE:
        return "base"
    return "wiring" if parts[0] in OPERATOR_WIRING else parts[0]


def _targets(node: ast.AST, package: str, known: set[str]) -> list[str]:
    """The ckptdrain modules (as 'a/b') an import statement reaches, or third-party roots
    prefixed with '!'."""
    if isinstance(node, ast.Import):
        dotted = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split("/")[: len(package.split("/")) - node.level + 1]
            base = ".".join(["ckptdrain", *[p for p in parts if p], *([base] if base else [])])
        dotted = []
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            inside = candidate.removeprefix("ckptdrain.").replace(".", "/")
            dotted.append(candidate if inside in known else base)
    else:
        return []
    out = []
    for name in dotted:
        if name == "ckptdrain" or name.startswith("ckptdrain."):
            out.append(name.removeprefix("ckptdrain").lstrip(".").replace(".", "/"))
        else:
            out.append("!" + name.split(".")[0])
    return out


def violations(sources: dict[str, str]) -> list[str]:
    """Every import in `sources` ({path under ckptdrain/: text}) that breaks a rule,
    as one line naming the file, the line, the import and the rule."""
    known = {_name(path) for path in sources}
    found = []
    for path, text in sorted(sources.items()):
        name = _name(path)
        layer = _layer(name)
        package = name if path.endswith("__init__.py") else name.rpartition("/")[0]
        for node in ast.walk(ast.parse(text, path)):
            for target in sorted(set(_targets(node, package, known))):
                where = f"ckptdrain/{path}:{getattr(node, 'lineno', 0)}"
                if target.startswith("!"):
                    sdk = target[1:]
                    if sdk not in SDK_EDGES:
                        continue
                    layers, modules = SDK_EDGES[sdk]
                    if layer not in layers and name not in modules:
                        allowed = sorted({f"{x}/" for x in layers} | {f"{m}.py" for m in modules})
                        found.append(f"{where} imports {sdk}: only {', '.join(allowed)} may"
                                     f" (the {sdk} SDK stays at its edge)")
                    continue
                rule = RULES.get(layer)
                target_layer = _layer(target) if target else "core"
                if rule is not None and target_layer in rule.forbidden:
                    banned = ", ".join(f"{x}/" for x in sorted(rule.forbidden))
                    found.append(f"{where} imports ckptdrain.{target.replace('/', '.')}: "
                                 f"{rule.who} must import none of {banned} ({rule.why})")
                if layer == target_layer == "operator" and target != "operator":
                    room, theirs = _operator_room(name), _operator_room(target)
                    allowed = OPERATOR_ROOMS.get(room)
                    if allowed is None or theirs not in OPERATOR_ROOMS:
                        found.append(f"{where}: operator room {room!r} or {theirs!r} has no"
                                     " place in OPERATOR_ROOMS (a new room needs its rule)")
                    elif theirs != room and theirs not in allowed:
                        may = ", ".join(sorted(allowed)) or "nothing"
                        found.append(f"{where} imports ckptdrain.{target.replace('/', '.')}:"
                                     f" the operator's {room} room may import only {may}"
                                     " (a room stands on the rooms below it)")
    return found


def _package_sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_the_package_keeps_its_layers() -> None:
    problems = violations(_package_sources())
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_every_subpackage_has_a_layer() -> None:
    dirs = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert dirs == SUBPACKAGES, f"new or removed subpackages: {sorted(dirs ^ SUBPACKAGES)}"


@pytest.mark.parametrize(("path", "text", "expected"), [
    ("store/s3.py", "from ckptdrain.transfer import drain\n",
     "ckptdrain/store/s3.py:1 imports ckptdrain.transfer.drain: store/ must import none of"),
    ("agent/loop.py", "def f():\n    from ckptdrain.operator.records.aggregate import fold\n",
     "ckptdrain/agent/loop.py:2 imports ckptdrain.operator.records.aggregate: the node side"),
    ("operator/handlers.py", "from ckptdrain.node import steps\n",
     "imports ckptdrain.node.steps: the cluster side (operator/) must import none of agent/,"),
    ("paths.py", "import ckptdrain.store\n",
     "ckptdrain/paths.py:1 imports ckptdrain.store: the core (top-level modules and contract/)"),
    ("contract/env.py", "from ckptdrain import node\n", "imports ckptdrain.node: the core"),
    ("node/steps.py", "from ckptdrain.agent import loop\n",
     "ckptdrain/node/steps.py:1 imports ckptdrain.agent.loop: the node side (node/) must"
     " import none of agent/"),
    ("peer/server.py", "def f():\n    from ckptdrain.agent.drainworker import DrainWorker\n",
     "ckptdrain/peer/server.py:2 imports ckptdrain.agent.drainworker: the node side (peer/)"
     " must import none of agent/"),
    ("transfer/drain.py", "from ckptdrain.node import steps\n",
     "ckptdrain/transfer/drain.py:1 imports ckptdrain.node.steps: transfer/ must import none"),
    ("node/steps.py", "import kubernetes.client\n",
     "ckptdrain/node/steps.py:1 imports kubernetes: only csi/policies.py, kubeclient.py,"),
    ("csi/volumes.py", "from ckptdrain.node import steps\n",
     "ckptdrain/csi/volumes.py:1 imports ckptdrain.node.steps: the CSI driver (csi/) must"),
    ("agent/loop.py", "import grpc\n",
     "ckptdrain/agent/loop.py:1 imports grpc: only csi/ may"),
])
def test_a_broken_rule_is_named(path: str, text: str, expected: str) -> None:
    sources = {
        "store/__init__.py": "", "store/s3.py": "", "transfer/__init__.py": "",
        "transfer/drain.py": "", "operator/__init__.py": "", "operator/records/aggregate.py": "",
        "operator/handlers.py": "", "node/__init__.py": "", "node/steps.py": "",
        "agent/__init__.py": "", "agent/loop.py": "", "contract/__init__.py": "",
        "contract/env.py": "", "paths.py": "", path: text,
    }
    found = violations(sources)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(("path", "text", "expected"), [
    ("operator/policy/spec.py", "from ckptdrain.operator.peers import placement\n",
     "ckptdrain/operator/policy/spec.py:1 imports ckptdrain.operator.peers.placement: the"
     " operator's policy room may import only base"),
    ("operator/config.py", "from ckptdrain.operator.apiserver import kube\n",
     "the operator's base room may import only nothing"),
    ("operator/records/sync.py", "def f():\n    from ckptdrain.operator import handlers\n",
     "ckptdrain/operator/records/sync.py:2 imports ckptdrain.operator.handlers: the operator's"
     " records room may import only apiserver, base, policy"),
    ("operator/apiserver/kube.py", "from ckptdrain.operator.admission import rules\n",
     "the operator's apiserver room may import only base"),
    ("operator/newroom/x.py", "from ckptdrain.operator import config\n",
     "operator room 'newroom' or 'base' has no place in OPERATOR_ROOMS"),
])
def test_an_operator_room_reaching_up_is_named(path: str, text: str, expected: str) -> None:
    sources = {
        "operator/__init__.py": "", "operator/config.py": "", "operator/handlers.py": "",
        "operator/apiserver/__init__.py": "", "operator/apiserver/kube.py": "",
        "operator/admission/__init__.py": "", "operator/admission/rules.py": "",
        "operator/peers/__init__.py": "", "operator/peers/placement.py": "",
        "operator/records/__init__.py": "", "operator/records/sync.py": "",
        "operator/policy/__init__.py": "", "operator/policy/spec.py": "", path: text,
    }
    found = violations(sources)
    assert len(found) == 1 and expected in found[0], found


def test_every_operator_room_has_its_rule() -> None:
    """A new sub-package of operator/ must say where it stands before it can land."""
    rooms = {p.name for p in (PACKAGE / "operator").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(OPERATOR_ROOMS) - {"base", "wiring"}
    top = {p.stem for p in (PACKAGE / "operator").glob("*.py")} - {"__init__"}
    assert top == OPERATOR_BASE | OPERATOR_WIRING


def test_allowed_imports_pass() -> None:
    sources = {
        "cli.py": "from ckptdrain.transfer import drain\nfrom ckptdrain.operator import x\n",
        "agent/loop.py": "from ckptdrain.node import steps\nfrom ckptdrain.contract import api\n",
        "operator/apiserver/kube.py": "import kubernetes\nfrom ckptdrain import kubeclient\n",
        "node/steps.py": "", "contract/api.py": "", "kubeclient.py": "import kubernetes\n",
        "paths.py": "", "transfer/drain.py": "from ckptdrain.store import base\n",
        "store/base.py": "", "operator/x.py": "",
        "operator/policy/spec.py": "from ckptdrain.operator import config\n",
        "operator/admission/rules.py": ("from ckptdrain.operator.policy import spec\n"
                                        "from ckptdrain.operator.admission import injection\n"),
        "operator/admission/injection.py": "", "operator/config.py": "",
        "operator/handlers.py": "from ckptdrain.operator.admission import rules\n",
    }
    assert violations(sources) == []


# -- at run time: the pure core loads no cluster or cloud SDK ------------------------

PURE = ["ckptdrain.units", "ckptdrain.sizing", "ckptdrain.manifest", "ckptdrain.keys",
        "ckptdrain.paths", "ckptdrain.checksum", "ckptdrain.ratelimit", "ckptdrain.retention",
        "ckptdrain.localfs", "ckptdrain.client", "ckptdrain.kubeclient",
        "ckptdrain.contract.api", "ckptdrain.contract.env", "ckptdrain.contract.record",
        "ckptdrain.contract.goodput",
        "ckptdrain.transfer.journal", "ckptdrain.flags",
        "ckptdrain.store.endpoint", "ckptdrain.goodput", "ckptdrain.progress",
        "ckptdrain.goodput_report", "ckptdrain.restore_status",
        # The cluster side's pure room: a CheckpointPolicy read, sized and given a status.
        "ckptdrain.operator.policy.spec", "ckptdrain.operator.policy.fields",
        "ckptdrain.operator.policy.status", "ckptdrain.operator.policy.allocation",
        "ckptdrain.operator.policy.identity", "ckptdrain.operator.policy.peer_tier",
        "ckptdrain.operator.policy.storage_options"]
FORBIDDEN = ("kopf", "kubernetes", "boto3", "botocore", "s3transfer", "aiohttp")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return {m.split(".")[0] for m in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("module", PURE)
def test_pure_core_imports_no_cluster_or_cloud_sdk(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert not loaded & set(FORBIDDEN), f"{module} pulls in {sorted(loaded & set(FORBIDDEN))}"


def test_ckptdrain_size_never_imports_kopf_or_boto() -> None:
    code = ("import sys\nfrom ckptdrain import cli\n"
            "rc = cli.main(['size', '--parameters', '405B', '--interval', '15m', '--json'])\n"
            "assert rc == 0")
    loaded = _loaded_after(code)
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_the_probe_can_fail() -> None:
    assert "boto3" in _loaded_after("import boto3")
