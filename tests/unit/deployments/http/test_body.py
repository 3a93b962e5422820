"""The body reader: whole bodies in one piece or many, refused while reading when too
large, stopped when they stall, and never read on past the limit."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from deployments.http.oip.body import read_body
from deployments.http.oip.errors import BodyTimeout, ClientGone
from deployments.protocol import PayloadTooLarge
from tests.conftest import arun as run


class Feed:
    """An ASGI `receive` over given pieces; counts what was taken. `None` stalls."""

    def __init__(self, pieces, then_disconnect: bool = False) -> None:
        self.pieces = iter(pieces)
        self.pending = next(self.pieces, StopIteration)
        self.taken = 0
        self.then_disconnect = then_disconnect

    async def __call__(self) -> dict:
        if self.pending is None:
            await asyncio.Event().wait()  # stalls forever
        if self.pending is StopIteration:
            return {"type": "http.disconnect"}
        piece, self.pending = self.pending, next(self.pieces, StopIteration)
        self.taken += 1
        more = self.pending is not StopIteration or self.then_disconnect
        return {"type": "http.request", "body": piece, "more_body": more}


def read(feed, limit=100, timeout_s=5.0, declared=None):
    return run(read_body(feed, limit, timeout_s, declared))


def test_one_piece_comes_back_as_it_came():
    piece = b'{"a": 1}'
    assert read(Feed([piece])) is piece


def test_chunked_pieces_are_joined():
    assert read(Feed([b"ab", b"", b"cd", b"e"])) == b"abcde"


def test_an_empty_body():
    assert read(Feed([b""])) == b""


def test_a_body_of_exactly_the_limit_is_accepted():
    assert read(Feed([b"x" * 60, b"y" * 40]), limit=100) == b"x" * 60 + b"y" * 40


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    feed = Feed([b"x" * 10])
    with pytest.raises(PayloadTooLarge, match=r"is 101 bytes \(Content-Length\), more than "
                                              r"this server's limit of 100"):
        read(feed, declared=101)
    assert feed.taken == 0


def test_a_chunked_body_is_refused_at_the_piece_that_passes_the_limit():
    feed = Feed([b"x" * 40] * 10)
    with pytest.raises(PayloadTooLarge) as info:
        read(feed)
    assert info.value.http_status == 413 and "more than 100 bytes" in str(info.value)
    assert feed.taken == 3  # 120 bytes read of the 400 sent; the rest never


def test_a_body_that_never_ends_is_refused_without_reading_on():
    feed = Feed(itertools.repeat(b"x" * 1024))
    with pytest.raises(PayloadTooLarge):
        read(feed, limit=64 * 1024)
    assert feed.taken == 65


def test_a_body_that_stalls_is_a_408():
    feed = Feed([b"x" * 10, None])
    with pytest.raises(BodyTimeout) as info:
        read(feed, timeout_s=0.05)
    assert info.value.http_status == 408 and "stalled" in str(info.value)


def test_a_body_of_which_nothing_arrives_says_the_request_may_have_been_resent():
    # Serve's proxy resends a request whose ingress replica died without its body
    # (benchmarks/results/2026-11-23-http-cpu/reliability.md): the 408 says so, and what to do.
    feed = Feed([None])
    with pytest.raises(BodyTimeout) as info:
        read(feed, timeout_s=0.05)
    assert "none of it arrived" in str(info.value) and "send it again" in str(info.value)
    part = Feed([b"x" * 10, None])
    with pytest.raises(BodyTimeout) as info:
        read(part, timeout_s=0.05)
    assert "no bytes for" in str(info.value) and "resent" not in str(info.value)


class _ClockedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock the test moves: its timers (the reader's stall check
    among them) fire by `now`, not by how fast the machine is."""

    now = 1000.0

    def time(self) -> float:
        return self.now


@pytest.mark.parametrize("gaps_s, stalls", [([0.03] * 4, False), ([0.03, 0.06], True)],
                         ids=["within", "past"])
def test_the_timeout_counts_from_the_last_piece(gaps_s, stalls):
    """Pieces `gaps_s` apart on the loop's clock, a 0.05 s stall timeout: four 0.03 s gaps
    (0.12 s in all) are read whole; a 0.06 s gap after the first piece is a stall."""
    async def slow_pieces():
        loop = asyncio.get_running_loop()
        feed, gaps = Feed([b"a", b"b", b"c", b"d"]), iter(gaps_s)

        async def receive():
            loop.now += next(gaps)
            for _ in range(3):  # the reader's timer runs now if it is due
                await asyncio.sleep(0)
            return await feed()

        return await read_body(receive, 100, 0.05)

    with asyncio.Runner(loop_factory=_ClockedLoop) as runner:
        if stalls:
            with pytest.raises(BodyTimeout, match=r"no bytes for 0\.05 s"):
                runner.run(slow_pieces())
        else:
            assert runner.run(slow_pieces()) == b"abcd"


def test_a_client_that_hangs_up_mid_body():
    with pytest.raises(ClientGone):
        read(Feed([b"abc"], then_disconnect=True))
