"""Talking to a partner agent: push a step (rate-limited, stoppable), list what
it holds for a writer, fetch a copy back (verified before it is published).

New connections per call: a partner that restarted or moved is simply
dialled again, and nothing is pooled across a SIGTERM. A fetch reads the
copy over FETCH_STREAMS connections at once (peer/parts.py); a partner too
old to serve parts is read as one stream.
"""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptdrain import cpus
from ckptdrain.errors import CkptdrainError, IntegrityError
from ckptdrain.manifest import WriterManifest
from ckptdrain.node import durable
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import DATA, LocalTier
from ckptdrain.peer import parts, protocol, stream
from ckptdrain.peer.tls import PeerCredentials
from ckptdrain.ratelimit import TokenBucket

StopCheck = Callable[[], bool]
TIMEOUT = 30.0
#: Connections a fetch reads a copy over (peer/parts.py): one per CPU it may
#: use, up to this many. On two cores, two streams measured 10% faster than
#: one and four 12% slower than one (every stream is a thread on both sides).
FETCH_STREAMS = 4


class PeerUnavailable(CkptdrainError):
    """The partner could not be reached or answered with an error."""


#: What a partner that went away or answers garbage raises in http.client
#: (BadStatusLine, IncompleteRead, LineTooLong are not OSErrors): each is a
#: PeerUnavailable, so restore falls back and the replicator retries.
_BROKEN = (OSError, http.client.HTTPException)


def _length(value: str | None) -> int:
    """Content-Length as a number (-1 when missing or not a plain number: it
    then matches no manifest, and the copy is refused)."""
    length = protocol.content_length((value or "").strip())
    return -1 if length is None else length


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
        credentials.client_context()  # fails now, not at the first connection
        self.timeout = timeout

    def _connect(self) -> http.client.HTTPSConnection:
        conn = _PeerConnection(self.host, self.port, self.credentials, timeout=self.timeout,
                               context=self.credentials.client_context())
        try:
            conn.connect()
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

            def send(chunk: memoryview) -> None:
                if should_stop is not None and should_stop():
                    raise CopyAborted("replication stopped")
                if bucket is not None and not bucket.acquire(len(chunk), should_stop):
                    raise CopyAborted("replication stopped")
                conn.send(chunk)

            stream.send_copy(tier.step_dir(step), manifest, data, send)
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
        """The manifest of the partner's copy of `writer`'s `step`."""
        manifest = self._ask_manifest(writer, step, writers)
        if manifest is None:  # a partner before `/manifest`: the copy stream's head
            conn, response = self._get(protocol.target_path(writer, step))
            try:
                manifest, _ = stream.read_manifest(response)  # type: ignore[arg-type]
            except _BROKEN as err:
                raise PeerUnavailable(f"peer {self.address}: {err}") from None
            finally:
                conn.close()
            _check_names(self.address, manifest, writer, step, writers)
        return manifest

    def _ask_manifest(self, writer: int, step: int, writers: int) -> WriterManifest | None:
        """The copy's manifest (`GET .../manifest`), None when the partner does
        not know the resource (a release before it); checked to be the one
        asked for."""
        conn = self._connect()
        try:
            conn.request("GET", protocol.manifest_path(writer, step))
            response = conn.getresponse()
            length = _length(response.getheader("Content-Length"))
            if response.status == 404 and b"no such resource" in response.read(4096):
                return None
            if response.status != 200 or not 0 < length <= protocol.MAX_MANIFEST_BYTES:
                raise PeerUnavailable(f"peer {self.address}: manifest of writer {writer} "
                                      f"step {step}: {response.status}, {length} bytes")
            data = response.read(length)
        except _BROKEN as err:
            raise PeerUnavailable(f"peer {self.address}: {err!r:.200}") from None
        finally:
            conn.close()
        if len(data) != length:
            raise PeerUnavailable(f"peer {self.address}: manifest ended early")
        manifest = WriterManifest.from_json(data)
        _check_names(self.address, manifest, writer, step, writers)
        return manifest

    def fetch_step(self, writer: int, step: int, tmp: Path, final: Path, *,
                   writers: int, expected: WriterManifest | None = None) -> WriterManifest:
        """Fetch the partner's copy of `writer`'s `step` into `final` (a step
        directory laid out like the local tier's), every byte verified against
        the manifest before it is published. With `expected`, the copy must
        also have the same content (e.g. this writer's committed global
        manifest). Raises IntegrityError on a bad copy, PeerUnavailable when
        the partner cannot serve it."""
        manifest = self._ask_manifest(writer, step, writers)
        if manifest is None:
            return self._fetch_stream(writer, step, tmp, final, writers=writers,
                                      expected=expected)
        if expected is not None and not manifest.same_content(expected):
            raise IntegrityError(f"peer copy of writer {writer} step {step} differs "
                                 "from the committed manifest")
        self._fetch_parts(manifest, tmp, final)
        return manifest

    def _fetch_parts(self, manifest: WriterManifest, tmp: Path, final: Path) -> None:
        """Every file of `manifest` over FETCH_STREAMS connections (peer/parts.py),
        verified against the manifest, then `tmp` published as `final`."""
        shutil.rmtree(tmp, ignore_errors=True)
        data = tmp / DATA
        data.mkdir(parents=True)
        try:
            try:
                targets = parts.read_parts(self._connect, self.address, manifest, data,
                                           min(FETCH_STREAMS, cpus.usable_cpus()))
            except (parts.PartUnavailable, *_BROKEN) as err:
                raise PeerUnavailable(f"peer {self.address}: {err!r:.200}") from None
            for target in targets:
                durable.fsync_file(target)
            stream.publish_copy(tmp, stream.data_dirs(data, targets), manifest.to_json(), final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _fetch_stream(self, writer: int, step: int, tmp: Path, final: Path, *,
                      writers: int, expected: WriterManifest | None) -> WriterManifest:
        """The whole copy stream over one connection (a partner before parts)."""
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


class _PeerConnection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the partner's certificate names this
    policy on every connect, the silent reconnect of a kept-alive connection
    the partner closed included."""

    def __init__(self, host: str, port: int, credentials: PeerCredentials,
                 **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self.credentials = credentials

    def connect(self) -> None:
        super().connect()
        self.credentials.check_peer(self.sock)  # type: ignore[arg-type]


def _check_names(address: str, manifest: WriterManifest, writer: int, step: int,
                 writers: int) -> None:
    if (manifest.writer, manifest.step, manifest.writers) != (writer, step, writers):
        raise IntegrityError(f"peer {address} answered writer {manifest.writer} step "
                             f"{manifest.step} of {manifest.writers} writers for writer "
                             f"{writer} step {step} of {writers}")
