"""Talking to a partner agent: push a step (rate-limited, stoppable), list what
it holds for a writer, fetch a copy back (verified before it is published).

One connection per call: a partner that restarted or moved is simply dialled
again, and nothing is pooled across a SIGTERM.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckptdrain.errors import CkptdrainError, IntegrityError
from ckptdrain.manifest import WriterManifest
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import protocol, stream
from ckptdrain.peer.tls import PeerCredentials
from ckptdrain.ratelimit import TokenBucket

StopCheck = Callable[[], bool]
TIMEOUT = 30.0


class PeerUnavailable(CkptdrainError):
    """The partner could not be reached or answered with an error."""


#: What a partner that went away or answers garbage raises in http.client
#: (BadStatusLine, IncompleteRead, LineTooLong are not OSErrors): each is a
#: PeerUnavailable, so restore falls back and the replicator retries.
_BROKEN = (OSError, http.client.HTTPException)


def _length(value: str | None) -> int:
    """Content-Length as a number (-1 when missing or not a plain number: it
    then matches no manifest, and the copy is refused)."""
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else -1


@dataclass(frozen=True)
class Sent:
    step: int
    bytes: int
    new: bool


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) from `host:port` or `[v6]:port`."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PeerUnavailable(f"peer address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


class PeerClient:
    def __init__(self, address: str, credentials: PeerCredentials,
                 timeout: float = TIMEOUT) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.credentials = credentials
        self.context = credentials.client_context()
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                           context=self.context)
        try:
            conn.connect()
            self.credentials.check_peer(conn.sock)  # type: ignore[arg-type]
        except OSError as err:
            conn.close()
            raise PeerUnavailable(f"peer {self.address}: {err}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def send_step(self, tier: LocalTier, step: int, writer: int, *,
                  bucket: TokenBucket | None = None,
                  should_stop: StopCheck | None = None) -> Sent:
        """Push `tier`'s published `step` to the partner as `writer`'s copy.

        Raises CopyAborted when `should_stop` turns true (the partner never
        publishes the half-sent copy), PeerUnavailable on a refusal."""
        data, manifest = stream.read_copy(tier.step_dir(step))
        length = protocol.stream_length(manifest, len(data))
        conn = self._connect()
        try:
            conn.putrequest("PUT", protocol.target_path(writer, step))
            conn.putheader("Content-Type", "application/octet-stream")
            conn.putheader("Content-Length", str(length))
            conn.endheaders()
            for chunk in stream.copy_chunks(tier.step_dir(step), manifest, data):
                if should_stop is not None and should_stop():
                    raise CopyAborted("replication stopped")
                if bucket is not None and not bucket.acquire(len(chunk), should_stop):
                    raise CopyAborted("replication stopped")
                conn.send(chunk)
            response = conn.getresponse()
            text = response.read(4096).decode("utf-8", "replace").strip()
        except _BROKEN as err:
            raise PeerUnavailable(f"peer {self.address}: {err!r:.200}") from None
        finally:
            conn.close()
        if response.status not in (200, 201):
            raise PeerUnavailable(f"peer {self.address} refused writer {writer} step {step}: "
                                  f"{response.status} {text}")
        return Sent(step, length, response.status == 201)

    def _get(self, path: str) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        conn = self._connect()
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            if response.status != 200:
                text = response.read(4096).decode("utf-8", "replace").strip()
                raise PeerUnavailable(f"peer {self.address}: GET {path}: {response.status} "
                                      f"{text}")
        except _BROKEN as err:
            conn.close()
            raise PeerUnavailable(f"peer {self.address}: {err!r:.200}") from None
        except BaseException:
            conn.close()
            raise
        return conn, response

    def steps(self, writer: int) -> list[int]:
        """Steps the partner holds for `writer`, newest first."""
        conn, response = self._get(protocol.target_path(writer))
        try:
            doc = json.loads(response.read(1 << 20))
            steps = doc.get("steps") if isinstance(doc, dict) else None
            if not isinstance(steps, list) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
                raise PeerUnavailable(f"peer {self.address}: malformed step list")
            return sorted(steps, reverse=True)
        except (ValueError, RecursionError, *_BROKEN) as err:
            raise PeerUnavailable(f"peer {self.address}: malformed step list: "
                                  f"{err!r:.200}") from None
        finally:
            conn.close()

    def manifest(self, writer: int, step: int, *, writers: int) -> WriterManifest:
        """The manifest of the partner's copy of `writer`'s `step` (read from the
        head of its copy stream; the rest is not fetched)."""
        conn, response = self._get(protocol.target_path(writer, step))
        try:
            manifest, _ = stream.read_manifest(response)  # type: ignore[arg-type]
        except (OSError, http.client.HTTPException) as err:
            raise PeerUnavailable(f"peer {self.address}: {err}") from None
        finally:
            conn.close()
        if (manifest.writer, manifest.step, manifest.writers) != (writer, step, writers):
            raise IntegrityError(f"peer {self.address} answered writer {manifest.writer} step "
                                 f"{manifest.step} of {manifest.writers} writers for writer "
                                 f"{writer} step {step} of {writers}")
        return manifest

    def fetch_step(self, writer: int, step: int, tmp: Path, final: Path, *,
                   writers: int, expected: WriterManifest | None = None) -> WriterManifest:
        """Fetch the partner's copy of `writer`'s `step` into `final` (a step
        directory laid out like the local tier's), every byte verified against
        the manifest before it is published. With `expected`, the copy must
        also have the same content (e.g. this writer's committed global
        manifest). Raises IntegrityError on a bad copy, PeerUnavailable when
        the partner cannot serve it."""
        conn, response = self._get(protocol.target_path(writer, step))
        try:
            manifest, json_len = stream.read_manifest(response)  # type: ignore[arg-type]
            target = protocol.Target(writer, step)
            protocol.check_copy(manifest, target, writers,
                                _length(response.getheader("Content-Length")), json_len)
            if expected is not None and not manifest.same_content(expected):
                raise IntegrityError(f"peer copy of writer {writer} step {step} differs "
                                     "from the committed manifest")
            stream.write_copy(response, manifest, manifest.to_json(), tmp,  # type: ignore[arg-type]
                              final)
            return manifest
        except (OSError, http.client.HTTPException) as err:
            raise PeerUnavailable(f"peer {self.address}: {err}") from None
        finally:
            conn.close()
