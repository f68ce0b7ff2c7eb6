"""A response body from a plain TCP socket into a file, without passing
through this process (Linux splice(2): socket → pipe → the file's pages).

Read the usual way, every restored byte is copied twice by the CPU: from
the socket into a buffer, then from the buffer into the page cache. Spliced,
the socket's pages go into a pipe by reference and only the second copy is
left, and there is no buffer per range in flight to size, so ranges can be
whole parts (docs/benchmarks.md has the figures). A TLS socket cannot be
spliced (its bytes are decrypted in user space): callers read those.

The pipes are kept for the next range (two descriptors each, one per range
in flight); a pipe that a failure may have left holding bytes is closed,
never reused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import threading
from collections.abc import Iterator

from ckptdrain.localfs import pwrite_all

#: Bytes per splice: what the pipe is asked to hold (Linux lets a user grow
#: a pipe to 1 MiB, /proc/sys/fs/pipe-max-size, unless it is over its pipe
#: quota: then the pipe stays small, and splicing slower but right).
PIPE_BYTES = 1 << 20
#: What a kernel, a sandbox (seccomp) or a filesystem answers when it does
#: not splice: the bytes are then copied, for this range and from then on.
_REFUSALS = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM}

_idle: list[tuple[int, int]] = []
_idle_lock = threading.Lock()
_refused = False


class SocketFailed(Exception):
    """The socket's side failed (reset, closed under us, no byte for its
    timeout): the store's failure, unlike any OSError of the file's."""


class Refused(Exception):
    """Splicing is not supported here. The first `moved` bytes are in the
    file (the pipe emptied into it); the rest is still in the socket."""

    def __init__(self, moved: int, why: str) -> None:
        super().__init__(why)
        self.moved = moved


def available() -> bool:
    """Whether to splice at all: Linux, and nothing refused it yet."""
    return hasattr(os, "splice") and not _refused


def spliceable(sock: object) -> bool:
    """A plain TCP socket: not TLS (ssl.SSLSocket subclasses socket.socket)."""
    return available() and type(sock) is socket.socket


def _forget_idle_pipes() -> None:
    # A forked child must not share a pipe with its parent, nor wait on a
    # lock that a thread of the parent held at the fork.
    global _idle, _idle_lock
    for out, into in _idle:
        os.close(out)
        os.close(into)
    _idle, _idle_lock = [], threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_idle_pipes)


@contextlib.contextmanager
def _pipe() -> Iterator[tuple[int, int]]:
    with _idle_lock:
        pair = _idle.pop() if _idle else None
    if pair is None:
        pair = os.pipe()
        with contextlib.suppress(OSError):  # over its quota: a small pipe
            fcntl.fcntl(pair[1], fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    empty = False
    try:
        yield pair
        empty = True  # every byte spliced in went out
    finally:
        if empty:
            with _idle_lock:
                _idle.append(pair)
        else:
            os.close(pair[0])
            os.close(pair[1])


def _refuse(moved: int, err: OSError) -> Refused:
    global _refused
    _refused = True
    return Refused(moved, f"splice: {err.strerror}")


def socket_to_file(sock: socket.socket, fd: int, offset: int, count: int) -> int:
    """Move up to `count` bytes from `sock` into file `fd` at `offset`; return
    how many (fewer only when the peer closed). SocketFailed for the
    socket's failures, Refused where splicing is not supported, OSError as
    the file gives it (ENOSPC, EIO...)."""
    timeout = sock.gettimeout()
    ready = select.poll()
    ready.register(sock.fileno(), select.POLLIN)
    moved = 0
    with _pipe() as (out, into):
        while moved < count:
            try:
                n = os.splice(sock.fileno(), into, min(PIPE_BYTES, count - moved))
            except BlockingIOError:  # a socket with a timeout is non-blocking
                if not ready.poll(None if timeout is None else timeout * 1000):
                    raise SocketFailed(f"no byte for {timeout} s") from None
                continue
            except OSError as err:
                if err.errno in _REFUSALS:
                    raise _refuse(moved, err) from err
                raise SocketFailed(f"splice from the socket: {err.strerror}") from err
            if n == 0:
                break  # the peer closed
            done = 0
            while done < n:
                at = offset + moved + done
                try:
                    wrote = os.splice(out, fd, n - done, offset_dst=at)
                except OSError as err:
                    if err.errno not in _REFUSALS:
                        raise  # the file's: not the store's
                    pwrite_all(fd, _read_exactly(out, n - done), at)  # empties the pipe
                    raise _refuse(moved + n, err) from err
                if wrote == 0:
                    raise OSError(errno.EIO, f"splice into the file moved nothing at {at}")
                done += wrote
            moved += n
    return moved


def socket_copy_to_file(sock: socket.socket, fd: int, offset: int, count: int) -> int:
    """The rest of a body after Refused, copied: up to `count` bytes from
    `sock` into `fd` at `offset`, through a bounded buffer; how many (fewer
    only when the peer closed). Errors as socket_to_file."""
    buffer = memoryview(bytearray(min(count, PIPE_BYTES)))
    moved = 0
    while moved < count:
        try:
            n = sock.recv_into(buffer, min(len(buffer), count - moved))
        except OSError as err:  # timeouts included
            raise SocketFailed(f"receiving: {type(err).__name__}") from err
        if n == 0:
            break
        pwrite_all(fd, buffer[:n], offset + moved)
        moved += n
    return moved


def _read_exactly(fd: int, count: int) -> bytes:
    chunks = []
    while count:
        chunk = os.read(fd, count)
        if not chunk:
            raise OSError(errno.EIO, "the pipe held fewer bytes than spliced into it")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)
