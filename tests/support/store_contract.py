"""Test data and second handles for the store-contract tests, which run
against real stores (file://, SeaweedFS, MinIO, gs://)."""

from __future__ import annotations

import random
from pathlib import Path

from ckptdrain.store.base import Store
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def part_size(store: Store) -> int:
    """The smallest part the store takes, but at least 64 KiB of real data."""
    return max(store.min_part_size, 64 * 1024)


def reopen(store: Store, tmp_path: Path) -> Store:
    """A second, independent store object on the same data (a 'new process')."""
    if isinstance(store, LocalStore):
        return LocalStore(store.root)
    if isinstance(store, GcsStore):
        return GcsStore(store.bucket, store.prefix, endpoint_url=store._base, environ={})
    assert isinstance(store, S3Store)
    client = store._client
    creds = client._request_signer._credentials
    return S3Store(
        store.bucket,
        store.prefix,
        endpoint_url=client.meta.endpoint_url,
        region=client.meta.region_name,
        access_key=creds.access_key,
        secret_key=creds.secret_key,
    )
