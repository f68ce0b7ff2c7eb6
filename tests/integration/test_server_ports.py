"""The test servers survive losing a port between choosing and binding it.

Any client in the session can be given a just-chosen port as its local
port; the server must then start again on fresh ports, not fail the test
that needed it (a CI run once failed this way)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import tests.support.s3servers as s3servers
from tests.support.ports import free_port


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize("start", [s3servers.start_seaweedfs, s3servers.start_minio],
                         ids=["seaweedfs", "minio"])
def test_a_server_whose_port_was_taken_starts_on_fresh_ports(
    start: Callable[[Path], AbstractContextManager[s3servers.S3Server]],
    busy_port: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[int] = []

    def taken_first() -> int:
        port = busy_port if not handed else free_port()
        handed.append(port)
        return port

    monkeypatch.setattr(s3servers, "free_port", taken_first)
    with start(tmp_path) as server:
        assert f":{busy_port}" not in server.endpoint_url
        bucket = server.create_bucket()
        server.client().put_object(Bucket=bucket, Key="k", Body=b"v")
        assert server.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    assert handed[0] == busy_port and len(handed) > 2


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports)


def test_an_error_that_is_not_a_lost_port_is_not_retried(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[int] = []

    def broken(_tmp: Path) -> AbstractContextManager[s3servers.S3Server]:
        starts.append(1)
        raise RuntimeError("seaweedfs exited with 1 while starting: bad flag")

    monkeypatch.setattr(s3servers, "_seaweedfs_once", broken)
    with pytest.raises(RuntimeError, match="bad flag"), s3servers.start_seaweedfs(tmp_path):
        pass
    assert starts == [1]
