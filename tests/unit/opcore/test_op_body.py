"""A review's body's deadline, pace and reading (admission/body.py), with
a fake socket and clock: no server."""

from __future__ import annotations

import pytest

from ckptdrain.operator.admission import body
from ckptdrain.operator.admission.body import MiB


class Stream:
    """`pieces` as a socket's reads would return them, each read moving the
    clock on by `step_s`; a piece that is None times out."""

    def __init__(self, pieces: list[bytes | None], now: float = 0.0, step_s: float = 0.0) -> None:
        self.pieces, self.now, self.step_s = list(pieces), now, step_s
        self.asked: list[tuple[int, float]] = []  # (at_most, timeout_s) of each read

    def clock(self) -> float:
        return self.now

    def receive(self, at_most: int, timeout_s: float) -> bytes:
        self.asked.append((at_most, timeout_s))
        self.now += self.step_s
        piece = self.pieces.pop(0) if self.pieces else b""
        if piece is None:
            raise TimeoutError
        return piece


def test_a_conversion_at_the_cap_is_given_longer_than_an_admission_waits() -> None:
    """16 MiB at the least pace: 3 s and 16 s, past the 10 s an admission
    is given by default, within the 30 s a conversion is."""
    assert body.due(100.0, 16 * MiB, 130.0) == (119.0, False)
    assert 119.0 - 100.0 > 10.0


def test_a_body_is_due_no_later_than_its_review() -> None:
    assert body.due(100.0, 4 * MiB, 105.0) == (105.0, True)
    assert body.due(100.0, MiB, 104.0) == (104.0, True)  # as late either way: the review's
    assert body.due(100.0, 1000, 130.0) == (100.0 + body.BODY_S + 1000 / MiB, False)


def test_a_body_falls_behind_once_short_of_the_least_pace() -> None:
    assert body.behind_at(10.0, 0) == 10.0 + body.BEHIND_S
    assert body.behind_at(10.0, MiB // 2) == 10.5 + body.BEHIND_S


def test_a_body_is_read_in_pieces_each_told() -> None:
    stream, came = Stream([b"ab", b"cde", b"f"], step_s=0.5), []
    assert body.read(stream.receive, 6, 10.0, came.append, stream.clock) == b"abcdef"
    assert came == [2, 5, 6]
    # Each read asks for what is left, given what is left of the deadline.
    assert stream.asked == [(6, 10.0), (4, 9.5), (1, 9.0)]


def test_a_stream_ending_short_of_its_length_is_said_so() -> None:
    stream = Stream([b"abc", b""])
    with pytest.raises(ValueError, match="ended 3 bytes before its Content-Length"):
        body.read(stream.receive, 6, 10.0, lambda _: None, stream.clock)


def test_a_body_not_in_by_its_deadline_is_late_with_what_came() -> None:
    stream = Stream([b"abc", None])
    with pytest.raises(body.Late) as late:
        body.read(stream.receive, 6, 10.0, lambda _: None, stream.clock)
    assert late.value.received == 3


def test_bytes_already_in_past_the_deadline_are_read() -> None:
    """Its thread held up past the deadline (another holding the
    interpreter lock), what had arrived is still read, without waiting."""
    stream = Stream([b"abc", b"def"], now=10.0 + body.LAST_LOOK_S / 2)
    assert body.read(stream.receive, 6, 10.0, lambda _: None, stream.clock) == b"abcdef"
    assert [timeout for _, timeout in stream.asked] == [body.NO_WAIT_S] * 2


def test_past_the_last_look_nothing_more_is_read() -> None:
    stream = Stream([b"abc", b"def"], now=10.0, step_s=2 * body.LAST_LOOK_S)
    with pytest.raises(body.Late) as late:
        body.read(stream.receive, 6, 10.0, lambda _: None, stream.clock)
    assert late.value.received == 3


def test_a_late_body_is_told_what_was_due_by_when_and_why() -> None:
    assert body.late(1000, 10, 3.001, False) == (
        "body: expected its 1000 bytes within 3 s of its headers (its deadline: 3 s, "
        "and 1 s a MiB), got 10")
    assert body.late(MiB, 0, 2.5, True, waited=True) == (
        f"body: expected its {MiB} bytes within 2.5 s of its taking a body's slot "
        "(the review's deadline), got 0")
