"""The S3 endpoint check, and a canary password at every entry point that takes an endpoint.

The processes run for real (`python -m ckptdrain ...`): a traceback, a log line,
an events file or a restore result carrying the password would show here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.store import open_store
from ckptdrain.store.endpoint import parse_endpoint, redact_endpoint

CANARY = "CanaryPassw0rd-7f3a"
WITH_PASSWORD = [f"http://user:{CANARY}@bad_host:9000",
                 f"http://user:{CANARY}@127.0.0.1:1", f"user:{CANARY}@127.0.0.1:9000"]


@pytest.mark.parametrize("value", ["http://127.0.0.1:9000", "https://storage.googleapis.com",
                                   "http://[::1]:9000", "http://minio.ns.svc:9000/",
                                   " http://minio:9000 "])
def test_accepts_http_urls(value: str) -> None:
    assert parse_endpoint("f", value) == value.strip().rstrip("/")


@pytest.mark.parametrize("value", ["notaurl", "ftp://minio:9000", "http://bad_host:9000",
                                   "http://minio:99999", "http://minio:0", "http://minio:",
                                   "http://", "http://minio:9000/?x=1", "http://mi nio:9000",
                                   "http://-minio:9000", "", *WITH_PASSWORD])
def test_refuses_anything_else_naming_the_field_without_the_password(value: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_endpoint("--endpoint-url", value)
    assert caught.value.field == "--endpoint-url"
    assert CANARY not in str(caught.value)


def test_redaction_keeps_the_host() -> None:
    assert redact_endpoint(f"http://u:{CANARY}@h:9000/p") == "http://***@h:9000/p"
    assert redact_endpoint(f"u:{CANARY}@h") == "***@h"
    assert redact_endpoint("http://h:9000/a@b") == "http://h:9000/a@b"


def test_open_store_checks_explicit_and_environment_endpoints(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    with pytest.raises(InvalidInput, match="--endpoint-url"):
        open_store("s3://bucket", endpoint_url=WITH_PASSWORD[0], endpoint_field="--endpoint-url")
    monkeypatch.setenv("AWS_ENDPOINT_URL", WITH_PASSWORD[0])
    with pytest.raises(InvalidInput, match="AWS_ENDPOINT_URL") as caught:
        open_store("s3://bucket")
    assert CANARY not in str(caught.value)


# -- every entry point, as a process -------------------------------------------------


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "CKPTDRAIN_"))}
    env.update(AWS_ACCESS_KEY_ID="AKIDCANARY", AWS_SECRET_ACCESS_KEY=CANARY,
               AWS_EC2_METADATA_DISABLED="true", CKPTDRAIN_METRICS_PORT="0",
               CKPTDRAIN_WORK_DIR=str(tmp_path / "work"),
               CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local"),
               CKPTDRAIN_STORE_URI="s3://bucket/run", **extra)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptdrain", *argv], env=env,
                          capture_output=True, text=True, timeout=120)


def _assert_no_canary(proc: subprocess.CompletedProcess[str], *files: Path) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert CANARY not in proc.stdout + proc.stderr
    for path in files:
        if path.exists():
            assert CANARY not in path.read_text(errors="replace"), path


def _cli_cases(tmp_path: Path) -> dict[str, list[str]]:
    src = tmp_path / "step-1"
    src.mkdir(exist_ok=True)
    (src / "a").write_bytes(b"x" * 100)
    return {"push": ["push", str(src), "s3://bucket/run"],
            "pull": ["pull", "s3://bucket/run", str(tmp_path / "dest")],
            "ls": ["ls", "s3://bucket/run"],
            "verify": ["verify", "s3://bucket/run"],
            "verify-dir": ["verify", str(src), "--against", "s3://bucket/run"]}


@pytest.mark.parametrize("command", ["push", "pull", "ls", "verify", "verify-dir"])
@pytest.mark.parametrize("where", ["flag", "CKPTDRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL"])
def test_cli_never_prints_the_endpoint_password(tmp_path: Path, command: str, where: str
                                                ) -> None:
    argv = _cli_cases(tmp_path)[command]
    endpoint = WITH_PASSWORD[0]
    if where == "flag":
        proc = _run([*argv, "--endpoint-url", endpoint], _env(tmp_path))
    else:
        proc = _run(argv, _env(tmp_path, **{where: endpoint}))
    _assert_no_canary(proc)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert ("--endpoint-url" if where == "flag" else where) in proc.stderr
    assert "***@bad_host:9000" in proc.stderr


@pytest.mark.parametrize("where", ["CKPTDRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL"])
def test_restore_never_writes_the_endpoint_password(tmp_path: Path, where: str) -> None:
    result = tmp_path / "work" / "restore.json"
    proc = _run(["restore"], _env(tmp_path, **{where: WITH_PASSWORD[1]}))
    _assert_no_canary(proc, result)
    assert where in proc.stderr + proc.stdout
    if where == "CKPTDRAIN_S3_ENDPOINT":
        assert proc.returncode == 2  # the configuration itself is refused
    else:
        # Found when the store is opened: the global tier is unusable, and
        # with nothing local that is not a fresh start.
        assert proc.returncode == 3
        assert '"fresh_start": false' in result.read_text()


@pytest.mark.parametrize("where", ["CKPTDRAIN_S3_ENDPOINT", "AWS_ENDPOINT_URL"])
def test_agent_never_logs_the_endpoint_password(tmp_path: Path, where: str) -> None:
    events = tmp_path / "events.jsonl"
    proc = _run(["agent", "--events", str(events)], _env(tmp_path, **{where: WITH_PASSWORD[0]}))
    _assert_no_canary(proc, events)
    assert proc.returncode == 2
    assert where in proc.stderr
