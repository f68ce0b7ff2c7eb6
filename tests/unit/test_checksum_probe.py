"""The S3 checksum probe: what each answer means, and that it never fails a write."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from ckptdrain import checksum
from ckptdrain.errors import StoreAccessDenied, StoreUnreachable
from ckptdrain.store.s3_checksum_probe import PROBE_DIR, probe_key, server_checks_crc32c


def _refused(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"}}, "PutObject")


class Server:
    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, []

    def __call__(self, op: str, **kw: Any) -> Any:
        self.calls.append((op, kw))
        # As the store's _call: a ClientError of a handled code comes back.
        if isinstance(self.answer, Exception) and not isinstance(self.answer, ClientError) \
                and op == "put_object":
            raise self.answer
        return self.answer if op == "put_object" else {}


def test_a_refusal_for_the_checksum_means_it_is_checked() -> None:
    server = Server(_refused("XAmzContentChecksumMismatch"))
    assert server_checks_crc32c(server, "p/k", "ep", {"ServerSideEncryption": "aws:kms"})
    _, kw = server.calls[0]
    # The probe is sent as real writes are (encryption asked for), with a wrong CRC32C.
    assert kw["ServerSideEncryption"] == "aws:kms"
    assert kw["ChecksumCRC32C"] != checksum.to_b64(checksum.crc32c(kw["Body"]))
    assert [c[0] for c in server.calls] == ["put_object"]


def test_a_stored_probe_means_it_is_not_checked_and_is_deleted() -> None:
    server = Server({"ETag": "x"})
    assert server_checks_crc32c(server, "p/k", "ep") is False
    assert [c[0] for c in server.calls] == ["put_object", "delete_object"]


def test_any_other_answer_is_unknown_never_a_failure() -> None:
    assert server_checks_crc32c(Server(StoreAccessDenied("denied")), "p/k", "ep") is None


def test_no_answer_fails_the_write_as_it_would_anyway() -> None:
    with pytest.raises(StoreUnreachable):
        server_checks_crc32c(Server(StoreUnreachable("SlowDown")), "p/k", "ep")


def test_the_probe_key_is_reserved() -> None:
    key = probe_key("runs/a")
    assert key.startswith(f"runs/a/{PROBE_DIR}/") and probe_key("").startswith(PROBE_DIR)
