"""The admission process as the hostile-payload tests serve it
(test_webhook_payloads.py, test_webhook_concurrency.py): started as the
operator starts it, over TLS on a port of its own, with a real apiserver
behind it and policies that select the sample's pods; and what every
answer to a case of the sample must be."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import webhook_payloads as payloads
import webhook_probe as probe
import webhook_unread
import webhook_valid
from cluster_helpers import INJECT, policy

from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import ConversionServer
from support.ports import free_port

#: The sample's pods; the pods of webhook_unread.py (a policy with
#: placement, so that a pod's tolerations and node affinity are merged
#: into); a third policy's for the checks after the sample (no rank of it
#: is claimed by the sample).
FUZZ = {"app": "fuzz", **INJECT}
UNREAD = {"app": "unread", **INJECT}
SANE = {"app": "sane", **INJECT}
PLACEMENT = {"tolerations": [{"key": "example.com/checkpointing", "operator": "Exists"}],
             "nodeAffinity": {"matchExpressions": [
                 {"key": "example.com/gpu", "operator": "In", "values": ["h100"]}]}}


@dataclass
class Served:
    server: ConversionServer
    context: ssl.SSLContext
    log: Path
    namespace: str
    ca_pem: bytes

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def send(self, case: payloads.Case) -> probe.Answer:
        return probe.send(self.server.port, self.context, case)


@pytest.fixture
def served(cluster: Cluster, crds: None, namespace: str, apply: Callable[..., Any],
           tmp_path: Path) -> Iterator[Served]:
    """The admission process on a port of its own, its log kept, with
    policies in `namespace` selecting FUZZ, UNREAD and SANE pods."""
    apply(policy("fuzz"))
    apply(policy("unread", placement=PLACEMENT))
    apply(policy("sane"))
    ca = apiserver.make_ca(tmp_path, "fuzz-ca")
    cert, key = apiserver.make_cert(tmp_path, "fuzz-webhook", ca)
    log = tmp_path / "admission.log"
    server = ConversionServer(cluster, cert, key, free_port(), log=log)
    server.start()
    try:
        yield Served(server, ssl.create_default_context(cafile=str(ca[0])), log, namespace,
                     Path(ca[0]).read_bytes())
    finally:
        server.stop()


def sample(served: Served) -> list[payloads.Case]:
    """The whole sample, in its order: the valid cases, the hostile corpus,
    and each field of a real pod set to each wrong JSON type."""
    corpus = payloads.Corpus(served.namespace, FUZZ)
    return [*webhook_valid.valid_cases(corpus), *corpus.cases(),
            *webhook_unread.cases(iter(corpus.uid, None), served.namespace, UNREAD)]


def problems(case: payloads.Case, answer: probe.Answer) -> list[str]:
    """What is wrong with `answer` to `case`, each naming the case."""
    found = probe.problems(case, answer)
    if case.changed is not None and answer.status:
        found += webhook_unread.unread_problems(case, answer.status, answer.body)
    where = f"{case.kind} at {case.path} (uid {str(case.uid)[:40]!r}"
    where += f", {case.changed})" if case.changed else ")"
    return [f"{where}: {p}" for p in found]


def injected(served: Served, name: str) -> dict[str, Any]:
    """The answer to a valid review of a SANE pod (a dry run: no rank kept)."""
    review = payloads.admission(f"sane-{name}", served.namespace,
                                payloads.pod(served.namespace, SANE))
    review["request"]["dryRun"] = True
    case = payloads.Case("sane", payloads.POD_PATH, json.dumps(review).encode(),
                         uid=f"sane-{name}")
    answer = served.send(case)
    assert answer.status == 200, answer
    assert probe.problems(case, answer) == []
    response = json.loads(answer.body)["response"]
    assert response["allowed"] and "patch" in response, response
    return response


def assert_alive_and_clean(served: Served) -> None:
    """The process is alive, injects a valid pod as before, and its log
    holds neither the planted secret nor a traceback."""
    assert served.server.proc is not None and served.server.proc.poll() is None, \
        "the admission process died"
    injected(served, "after")
    log = served.log.read_text(errors="replace")
    assert payloads.MARKER not in log, "the planted secret is in the admission log"
    assert "Traceback" not in log, log[log.index("Traceback") - 400:][:3000]
