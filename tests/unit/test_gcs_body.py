"""store/gcs_body.py: the gs:// upload body: the object's metadata and bytes as one
multipart/related body, the same again after a rewind (a retry sends it
whole), and the bytes of the stream's window only."""

from __future__ import annotations

import email.parser
import io
import json

from ckptdrain.store.gcs_body import RelatedBody
from ckptdrain.store.s3_bodies import PacedBody, WindowBody


def _parts(body: bytes, content_type: str) -> list[bytes]:
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    return [part.get_payload(decode=True) for part in message.get_payload()]


def test_metadata_then_bytes_and_a_rewind_sends_the_same_again() -> None:
    paced: list[int] = []
    body = RelatedBody({"name": "p/k", "crc32c": "AAAAAA=="}, PacedBody(b"x" * 100_000,
                                                                       paced.append))
    first = b"".join(iter(lambda: body.read(8192), b""))
    assert len(first) == 100_000 + body.extra()
    meta, data = _parts(first, body.content_type)
    assert json.loads(meta) == {"name": "p/k", "crc32c": "AAAAAA=="}
    assert data == b"x" * 100_000
    body.seek(0)
    assert body.read(-1) + b"".join(iter(lambda: body.read(1 << 20), b"")) == first
    assert sum(paced) == 200_000  # the resent bytes are paced again


def test_only_the_window_of_the_stream_is_sent() -> None:
    stream = io.BytesIO(b"head" + b"d" * 10 + b"tail")
    stream.seek(4)
    body = RelatedBody({"name": "k"}, WindowBody(stream, 10, strict=True))
    _, data = _parts(b"".join(iter(lambda: body.read(3), b"")), body.content_type)
    assert data == b"d" * 10
