"""The admission process on its own, as the operator runs it, for tests
that need only its HTTPS server: the conversion webhook's own tests
(tests/cluster/conversion/), and apiservers that must take
CheckpointPolicies at v1alpha1 (most cluster tests write them so), which
the stored v1beta1 makes a conversion."""

from __future__ import annotations

import base64
import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .apiserver import Cluster, make_ca, make_cert, wait_established
from .ports import free_port

#: The local-tier root the admission process allows (as the operator tests').
ALLOWED_ROOT = "/mnt/ckptdrain"
POLICY_CRD = "checkpointpolicies.yaml"


class ConversionServer:
    """The admission process (`python -m ckptdrain.operator.admission.process`)
    as the operator runs it: our end of its standard input keeps it alive,
    its standard output says when it listens and what it answered."""

    def __init__(self, cluster: Cluster, cert: Path, key: Path, port: int,
                 ca_pem: bytes = b"", log: Path | None = None) -> None:
        self.cluster, self.cert, self.key, self.port = cluster, cert, key, port
        #: Where its standard error (its log) goes; None: nowhere.
        self.log = log
        #: The CA its certificate chains to: what a CRD's caBundle trusts.
        self.ca_pem = ca_pem
        self.url = f"https://127.0.0.1:{port}/convert"
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.reports: list[str] = []

    def start(self) -> None:
        env = {**self.cluster.env(), "CKPTDRAIN_ALLOWED_ROOT": ALLOWED_ROOT,
               "CKPTDRAIN_WEBHOOK_ADDR": "127.0.0.1", "CKPTDRAIN_WEBHOOK_HOST": "127.0.0.1",
               "CKPTDRAIN_WEBHOOK_PORT": str(self.port), "CKPTDRAIN_IMAGE": "ckptdrain:test"}
        with open(self.log or "/dev/null", "ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ckptdrain.operator.admission.process",
                 "--cert", str(self.cert), "--key", str(self.key)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                text=True, start_new_session=True)
        stdout = self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [self.lines.put(x.strip()) for x in stdout],
                         daemon=True).start()
        deadline = time.monotonic() + 60
        while self._next(deadline) != "ready":
            pass

    def _next(self, deadline: float) -> str:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the admission process exited {self.proc.returncode}")
        try:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("the admission process did not say it listens") from None
        if line.startswith("admitted "):
            self.reports.append(line)
        return line

    def conversions(self) -> int:
        """ConversionReviews it answered with Success so far."""
        while not self.lines.empty():
            self._next(time.monotonic() + 1)
        return sum(1 for r in self.reports if r.startswith("admitted conversion ok "))

    def settled(self, quiet_s: float = 1.0) -> int:
        """conversions() once none was reported for `quiet_s`: the
        apiserver converts on writes too (managed fields), and reports come
        a moment after their answers."""
        count, since = self.conversions(), time.monotonic()
        while time.monotonic() - since < quiet_s:
            time.sleep(0.1)
            if self.conversions() != count:
                count, since = self.conversions(), time.monotonic()
        return count

    def converting(self, crd: dict[str, Any]) -> dict[str, Any]:
        """`crd` (the CheckpointPolicy CRD) converting through this server."""
        return converting_to(crd, self.url, self.ca_pem)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # how it learns that the operator is gone
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def converting_to(crd: dict[str, Any], url: str, ca_pem: bytes) -> dict[str, Any]:
    """`crd` (the CheckpointPolicy CRD as shipped) with its conversion sent to
    `url`, trusting `ca_pem`: no Service here, as in the chart."""
    converting = json.loads(json.dumps(crd))
    converting["spec"]["conversion"]["webhook"]["clientConfig"] = {
        "url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    return converting


@contextmanager
def converting_crds(cluster: Cluster, crds: Iterable[Path]) -> Iterator[ConversionServer]:
    """The CRD files `crds` applied and Established, the
    CheckpointPolicy CRD converting through a ConversionServer that runs
    for the block: v1beta1 objects are then created, read and dry-run as
    on an installed operator. After it the policy CRD is as shipped again
    (by the same field manager), so a later install that sets the Service
    does not meet a URL left beside it."""
    workdir = Path(tempfile.mkdtemp(prefix="ckptdrain-conversion-"))
    try:
        ca = make_ca(workdir, "conversion-ca")
        cert, key = make_cert(workdir, "conversion", ca)
        port = free_port()
        server = ConversionServer(cluster, cert, key, port, ca[0].read_bytes())
        server.start()
        try:
            for path in crds:
                for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
                    if path.name == POLICY_CRD:
                        doc = server.converting(doc)
                    cluster.kubectl("apply", "--server-side", "-f", "-",
                                    input=json.dumps(doc))
            wait_established(cluster)
            yield server
        finally:
            for path in crds:
                if path.name == POLICY_CRD:
                    # A merge patch first: another manager may own the URL
                    # (a test's patch), and a URL beside a Service is invalid.
                    shipped = next(d for d in yaml.safe_load_all(path.read_text()) if d)
                    config = shipped["spec"]["conversion"]["webhook"]["clientConfig"]
                    cluster.kubectl("patch", "crd", shipped["metadata"]["name"],
                                    "--type=merge", "-p", json.dumps({"spec": {"conversion": {
                                        "webhook": {"clientConfig": {
                                            "url": None, "caBundle": None, **config}}}}}))
                    cluster.kubectl("apply", "--server-side", "-f", str(path))
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
