"""Fixtures for integration tests: real S3 servers and a store of each kind.

`seaweedfs`, `minio` and `gcs` (fake-gcs-server, the GCS JSON API) start
once per session, and only if a test asks for them. `store` runs a test five
times, against file://, SeaweedFS, MinIO (reading without botocore's client
and through it) and gs://;
each run gets a key prefix of its own in a session bucket (or a fresh
directory), emptied afterwards. `s3area` gives S3-only tests the same.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests.support` lives at the repository root, which pytest does not put on
# sys.path by itself (tests/ is not a package).
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support.gcsserver import GcsServer, start_fake_gcs  # noqa: E402
from tests.support.s3servers import S3Server, start_minio, start_seaweedfs  # noqa: E402

from ckptdrain.store.base import Store  # noqa: E402
from ckptdrain.store.local import LocalStore  # noqa: E402

S3_SERVERS = ("seaweedfs", "minio")


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with start_seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with start_minio(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    with start_fake_gcs(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(params=S3_SERVERS)
def s3server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn (for tests that are about S3 only)."""
    server: S3Server = request.getfixturevalue(request.param)
    return server


@pytest.fixture(scope="session")
def _session_buckets() -> dict[str, str]:
    """One bucket per server for the session: creating one costs ~1 s on SeaweedFS."""
    return {}


@pytest.fixture
def s3area(s3server: S3Server, _session_buckets: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(bucket, prefix): a key prefix on `s3server` that is this test's alone, emptied after."""
    if s3server.name not in _session_buckets:
        _session_buckets[s3server.name] = s3server.create_bucket()
    bucket, prefix = _session_buckets[s3server.name], f"t-{uuid.uuid4().hex[:12]}"
    yield bucket, prefix
    s3server.delete_prefix(bucket, prefix + "/")


@pytest.fixture(params=("file", *S3_SERVERS, "minio-botocore-reads", "gcs"))
def store(
    request: pytest.FixtureRequest, tmp_path: Path, _session_buckets: dict[str, str]
) -> Iterator[Store]:
    """A real, empty store of each kind; S3 ones under a key prefix of their own.
    S3 stores read without botocore's client (s3_read_client.py); one MinIO
    store reads through botocore, so the contract holds for both."""
    if request.param == "file":
        yield LocalStore(tmp_path / "store")
        return
    name, _, reads = request.param.partition("-")
    server: S3Server | GcsServer = request.getfixturevalue(name)
    if server.name not in _session_buckets:
        _session_buckets[server.name] = server.create_bucket()
    bucket, prefix = _session_buckets[server.name], f"t-{uuid.uuid4().hex[:12]}"
    try:
        yield server.open_store(bucket, prefix, **(
            {"botocore_reads": True} if reads else {}))  # type: ignore[arg-type]
    finally:
        server.delete_prefix(bucket, prefix + "/")


@pytest.fixture
def store_server(request: pytest.FixtureRequest) -> S3Server | GcsServer | None:
    """The server behind this test's `store` (None for file://): what a
    `ckptdrain` subprocess needs to reach the same store."""
    name = request.node.callspec.params["store"].partition("-")[0]
    return None if name == "file" else request.getfixturevalue(name)  # type: ignore[no-any-return]
