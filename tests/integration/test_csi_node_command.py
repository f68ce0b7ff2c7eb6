"""`ckptdrain csi-node` as its DaemonSet runs it: a bad start ends in one
line before it listens; kubelet's refusal to register it ends it with 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest
from tests.support.csi_driver import NAME

from ckptdrain.csi import command, stubs
from ckptdrain.csi.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="the driver serves root-only sockets: Linux, as root (as its DaemonSet pod runs)")


def csi_node(base: Path, *flags: str, kubeconfig: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "ckptdrain", "csi-node", "--node-id", "node-a",
            "--root", str(base / "root"), "--pods-dir", str(base / "pods"),
            "--csi-socket", str(base / "plugins" / "csi.sock"),
            "--registration-socket", str(base / "registry" / f"{NAME}-reg.sock"),
            # No metrics port: another test's driver may hold the default.
            "--metrics-port", "0", *flags]


def command_env(base: Path) -> dict[str, str]:
    """This interpreter's imports; a kubeconfig naming an apiserver that is
    never called (no volume is published here)."""
    kubeconfig = base / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "never-used"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
            "KUBECONFIG": str(kubeconfig)}


def test_csi_node_command_refuses_a_bad_start_in_one_line(tmp_path: Path) -> None:
    env = command_env(tmp_path)
    (tmp_path / "real-pods").mkdir()
    (tmp_path / "pods").symlink_to(tmp_path / "real-pods")
    for argv, env_, says in (
            (csi_node(tmp_path), env, "--pods-dir"),
            (csi_node(tmp_path, "--node-id", ""), env, "--node-id"),
            (csi_node(tmp_path, "--name", "Node_CkptDrain"), env, "--name"),
            (csi_node(tmp_path, "--min-mount-group", "0"), env, "--min-mount-group"),
            (csi_node(tmp_path, "--reclaim-policy", "delete"), env,
             "--reclaim-policy: expected Delete or Retain"),
            (csi_node(tmp_path, "--reclaim-grace-period", "soon"), env,
             "--reclaim-grace-period: expected a duration"),
            (csi_node(tmp_path, "--scan-interval", "0s"), env, "--scan-interval"),
            (csi_node(tmp_path, "--metrics-port", "70000"), env, "--metrics-port"),
            (csi_node(tmp_path, "--capacity-namespace", "Not_A/Namespace"), env,
             "--capacity-namespace: expected a namespace name"),
            (csi_node(tmp_path, "--pod-name", "csi-x"), env,
             "--pod-uid: expected the driver's Pod uid"),
            (csi_node(tmp_path, "--pod-uid", "5f0c6d2e-8f3a-4b1e-9c1a-1b2c3d4e5f60"), env,
             "--pod-name: expected the driver's Pod name"),
            (csi_node(tmp_path, "--pods-dir", str(tmp_path / "real-pods")),
             {**env, "KUBECONFIG": str(tmp_path / "absent")}, "apiserver credentials: expected")):
        done = subprocess.run(argv, env=env_, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("ckptdrain csi-node: ") and says in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def test_csi_node_command_exits_non_zero_when_kubelet_refuses_it() -> None:
    base = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    registration = base / "registry" / f"{NAME}-reg.sock"
    proc = subprocess.Popen(csi_node(base), env=command_env(base), stderr=subprocess.PIPE,
                            text=True)
    try:
        with grpc.insecure_channel(f"unix://{registration}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            assert stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10).name == NAME
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=False, error="version 0.3 not supported"), timeout=10)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert "kubelet did not register node.ckptdrain.io: version 0.3 not supported" in stderr
        assert not registration.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base)


def test_a_checkout_without_stubs_is_told_to_run_make_venv(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The stubs are generated, never in git: as if e2e/deps/csi-stubs.sh never ran.
    monkeypatch.delitem(sys.modules, "ckptdrain.csi.server", raising=False)
    monkeypatch.delattr(stubs, "csi_pb2_grpc", raising=False)
    monkeypatch.setitem(sys.modules, "ckptdrain.csi.stubs.csi_pb2_grpc", None)
    assert command.run(argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert err.startswith("ckptdrain csi-node: no gRPC stubs (ckptdrain.csi.stubs.csi_pb2_grpc)")
    assert "run `make venv`" in err
