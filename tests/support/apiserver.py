"""A real etcd + kube-apiserver on 127.0.0.1, for tests (envtest-style).

Starts both from the cached builds (`make servers`), with certificates made by
`openssl` in a temporary directory, a service-account signing key, a static
admin token, RBAC authorization and the default admission plugins (mutating
and validating webhooks included). No kubelet, controller-manager or
scheduler: pods are stored, never run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port

K8S_VERSION = os.environ.get("K8S_VERSION", "v1.33.13")
CACHE = Path(os.environ.get("CKPTDRAIN_CACHE", Path.home() / ".cache" / "ckptdrain"))
ADMIN_TOKEN_USER = "ckptdrain-test-admin"


class MissingBinaries(RuntimeError):
    """The real servers are not built; `make servers` builds them."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kubectl: Path


def find_binaries() -> Binaries:
    """The cached builds, or MissingBinaries naming what to run."""
    k8s = CACHE / "k8s" / K8S_VERSION / "bin"
    etcd_cached = CACHE / "etcd" / "bin" / "etcd"
    etcd = etcd_cached if etcd_cached.exists() else Path(shutil.which("etcd") or etcd_cached)
    found = Binaries(etcd=etcd, kube_apiserver=k8s / "kube-apiserver", kubectl=k8s / "kubectl")
    missing = [str(p) for p in (found.etcd, found.kube_apiserver, found.kubectl)
               if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBinaries(
            "real Kubernetes test servers are missing: "
            + ", ".join(missing)
            + ". Build them once with `make servers` (e2e/cluster/build-k8s.sh and "
            "e2e/deps/etcd.sh)."
        )
    return found


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A throwaway CA: (cert, key)."""
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        str(key),
        "-out",
        str(crt),
        "-subj",
        f"/CN={name}",
        cwd=directory,
    )
    return crt, key


def make_cert(
    directory: Path,
    name: str,
    ca: tuple[Path, Path],
    *,
    sans: Sequence[str] = ("IP:127.0.0.1", "DNS:localhost"),
    subject: str | None = None,
) -> tuple[Path, Path]:
    """A certificate for `name` signed by `ca`, with the given SANs: (cert, key)."""
    key, csr, crt = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    ext.write_text(
        "subjectAltName=" + ",".join(sans) + "\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        subject or f"/CN={name}",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        str(crt),
        "-extfile",
        str(ext),
        cwd=directory,
    )
    return crt, key


@dataclass
class Cluster:
    """A running apiserver: where it is and how to talk to it as admin."""

    server: str
    ca_file: Path
    ca_key: Path
    token: str
    kubeconfig: Path
    workdir: Path
    binaries: Binaries
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    etcd_url: str = ""  # etcd's client URL (support/etcd_keys.py)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster."""
        return subprocess.run(
            [str(self.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            text=True,
            capture_output=True,
            check=check,
            timeout=timeout,
        )

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubeconfig_for(self, namespace: str, service_account: str,
                       bound_pod: tuple[str, str] | None = None) -> Path:
        """A kubeconfig acting as a service account (a TokenRequest token), for RBAC tests.
        With `bound_pod` (name, uid) the token is bound to that pod, as the one the
        kubelet mounts into it: requests then carry the pod's name in the user's extra."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod[0]}",
                 f"--bound-object-uid={bound_pod[1]}"] if bound_pod else []
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration=2h", *bound
        ).stdout.strip()
        suffix = f"-{bound_pod[0]}" if bound_pod else ""
        path = self.workdir / f"kubeconfig-{namespace}-{service_account}{suffix}"
        _write_kubeconfig(path, self.server, self.ca_file, token)
        return path


def _write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
    path.chmod(0o600)


def _wait_ready(cluster: Cluster, deadline_s: float, log: Path) -> None:
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    request = urllib.request.Request(
        cluster.server + "/readyz", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    deadline = time.monotonic() + deadline_s
    last = ""
    while time.monotonic() < deadline:
        for proc in cluster.processes:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{proc.args[0]} exited with {proc.returncode}; "
                    f"log tail:\n{log.read_text()[-3000:]}"
                )
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
        time.sleep(0.3)
    raise TimeoutError(
        f"kube-apiserver not ready after {deadline_s}s ({last}); "
        f"log tail:\n{log.read_text()[-3000:]}"
    )


def _start_etcd(binaries: Binaries, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    log = open(workdir / "etcd.log", "wb")  # noqa: SIM115 -- closed with the process
    proc = subprocess.Popen(
        [
            str(binaries.etcd),
            "--name",
            "test",
            "--data-dir",
            str(workdir / "etcd"),
            "--listen-client-urls",
            url,
            "--advertise-client-urls",
            url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"test=http://127.0.0.1:{peer}",
            "--listen-metrics-urls",
            f"http://127.0.0.1:{free_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, url


def start(workdir: Path, *, ready_timeout_s: float = 120,
          extra_args: Sequence[str] = ()) -> Cluster:
    """Start etcd and kube-apiserver under `workdir` (with `extra_args` on its
    command line); returns once /readyz is ok."""
    binaries = find_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    ca = make_ca(workdir)
    serving = make_cert(
        workdir, "apiserver", ca, sans=("IP:127.0.0.1", "DNS:localhost", "IP:10.96.0.1")
    )
    sa_key = workdir / "sa.key"
    _openssl("genrsa", "-out", str(sa_key), "2048", cwd=workdir)
    _openssl("rsa", "-in", str(sa_key), "-pubout", "-out", str(workdir / "sa.pub"), cwd=workdir)
    token = os.urandom(16).hex()
    (workdir / "tokens.csv").write_text(f'{token},{ADMIN_TOKEN_USER},1,"system:masters"\n')

    etcd, etcd_url = _start_etcd(binaries, workdir)
    port = free_port()
    log_path = workdir / "apiserver.log"
    log = open(log_path, "wb")  # noqa: SIM115 -- closed with the process
    apiserver = subprocess.Popen(
        [
            str(binaries.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={workdir / 'certs'}",
            f"--tls-cert-file={serving[0]}",
            f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={ca[0]}",
            f"--token-auth-file={workdir / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={workdir / 'sa.pub'}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC",
            # No controller-manager creates the `default` service account, so the
            # ServiceAccount admission plugin would refuse every pod.
            "--disable-admission-plugins=ServiceAccount",
            "--profiling=false",
            "--v=1",
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    kubeconfig = workdir / "kubeconfig"
    server = f"https://127.0.0.1:{port}"
    _write_kubeconfig(kubeconfig, server, ca[0], token)
    cluster = Cluster(
        server=server,
        ca_file=ca[0],
        ca_key=ca[1],
        token=token,
        kubeconfig=kubeconfig,
        workdir=workdir,
        binaries=binaries,
        processes=[etcd, apiserver], etcd_url=etcd_url,
    )
    try:
        _wait_ready(cluster, ready_timeout_s, log_path)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: Cluster, grace_s: float = 10) -> None:
    """Stop the apiserver, then etcd (each by its own process id)."""
    for proc in reversed(cluster.processes):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def running(workdir: Path | None = None, extra_args: Sequence[str] = ()) -> Iterator[Cluster]:
    """etcd + kube-apiserver for the duration of the block; cleaned up after."""
    owned = workdir is None
    base = Path(tempfile.mkdtemp(prefix="ckptdrain-apiserver-")) if owned else workdir
    assert base is not None
    cluster = start(base, extra_args=extra_args)
    try:
        yield cluster
    finally:
        stop(cluster)
        if owned:
            shutil.rmtree(base, ignore_errors=True)


def _established(crd: dict[str, object]) -> bool:
    status = crd.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in conditions or [])


def wait_established(cluster: Cluster, *names: str, timeout_s: float = 60) -> None:
    """Until each CRD named (none: every CRD) is Established. Polled, not
    `kubectl wait`: that fails at once on a CRD whose status has no conditions
    yet, as a large CRD's has while its rules compile."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cluster.kubectl("get", "crd", *names, "-o", "json", check=False)
        waiting: list[object] = list(names)
        if got.returncode == 0:
            doc = json.loads(got.stdout)
            found = doc.get("items", [doc])
            waiting = [c["metadata"]["name"] for c in found if not _established(c)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"CRDs not Established after {timeout_s}s: {waiting} "
                                 f"{got.stderr.strip()}")
        time.sleep(0.2)


def binaries_or_fail() -> Binaries:
    """find_binaries() for a test: missing binaries fail it (never a skip),
    naming what builds them."""
    import pytest

    try:
        return find_binaries()
    except MissingBinaries as error:
        pytest.fail(str(error), pytrace=False)


def crd_cluster(crds: Path, extra_args: Sequence[str] = ()) -> Iterator[Cluster]:
    """A fixture's body: a real etcd + kube-apiserver (`extra_args` on its command
    line) with the CRDs in `crds` (a file or a directory) applied and established.
    Missing binaries fail the test, naming what builds them."""
    binaries_or_fail()
    with running(extra_args=extra_args) as cluster:
        cluster.kubectl("apply", "--server-side", "-f", str(crds))
        wait_established(cluster)
        yield cluster
