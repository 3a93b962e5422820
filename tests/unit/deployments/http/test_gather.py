"""Gathering (`deployments.http.native.gather`), its rule alone (a fake clock), and through the
native front over real sockets (no Ray): the front's requests of a model that already has
a full batch in flight wait to fill a block, and go on when a block is full, when the
work in flight falls below a batch, when the oldest has waited the model's delay, or when
the server stops; every request still gets its own answer."""

from __future__ import annotations

import asyncio
import math
import struct
import time

import pytest

from deployments.http.native import blocks
from deployments.http.native.front import available
from deployments.http.native.gather import Gather
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.served import Served, read_response
from tests.unit.deployments.http.test_front import _learnt, binary


def test_nothing_waits_below_a_full_batch_in_flight_nor_with_no_delay():
    g = Gather(batch=64, delay_s=0.002)
    assert not g.holds()
    g.sent(63)
    assert not g.holds()
    g.sent(1)
    assert g.holds()
    assert not Gather(batch=64, delay_s=0.0, inflight=640).holds()


def test_what_waits_is_taken_in_order_and_the_oldest_sets_the_due_time():
    g = Gather(batch=4, delay_s=0.5, inflight=4)
    assert g.hold(0, "a", 2, now=10.0) == 2 and g.due_s == 10.5
    assert g.hold(1, "x", 1, now=10.2) == 1 and g.due_s == 10.5
    assert g.hold(0, "b", 3, now=10.3) == 5 and g.waiting == 6
    assert g.take(0) == [(0, ["a", "b"])] and g.due_s == 10.5  # plan 1 still waits
    assert g.take() == [(1, ["x"])] and g.due_s == math.inf and g.waiting == 0
    assert g.take() == [] and g.take(7) == []
    g.answered(4)
    assert not g.holds()


needs_front = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                 "(needs a C compiler): run `make setup` with gcc installed")


async def _gathering(delay_s: float):
    """A front whose backend gathers `square` with `delay_s`, its plan learnt, and a log of
    the items of each block submitted."""
    s = Served(front=True)
    s.backend.gather_s = lambda model: delay_s if model.name == "square" else 0.0
    await s.__aenter__()
    await asyncio.to_thread(_learnt, s)
    submit, sizes = s.app._submit, []

    def logged(model, request, received_s=None, requests=1):
        sizes.append(request.batch_size)
        return submit(model, request, received_s, requests)

    s.app._submit = logged
    return s, sizes


async def _send(s: Served, values: range) -> list:
    """One request [v, 2] per connection (a connection queues a few at most); their
    readers (each holding its writer: a writer collected closes its connection)."""
    readers = []
    for v in values:
        r, w = await s.connect()
        w.write(binary([float(v), 2.0]))
        r.writer = w
        readers.append(r)
    return readers


def _squares(answers, first: int) -> None:
    for i, a in enumerate(answers, first):
        assert a.status == 200 and struct.unpack("<2f", a.body[-8:]) == (i * i, 4.0)


@needs_front
def test_arrivals_wait_while_a_full_batch_is_in_flight_and_go_when_it_comes_back():
    async def main():
        s, sizes = await _gathering(delay_s=30.0)  # only the batch's return sends them
        try:
            s.backend.step.clear()  # the model holds every batch until the test lets go
            readers = await _send(s, range(32))  # 64 items
            await until(lambda: sum(sizes) == 64, "the first full batch submitted", 30)
            readers += await _send(s, range(32, 37))
            book = s.server.book
            await until(lambda: book.gathers["square"].waiting == 5, "five waiting", 30)
            await asyncio.sleep(0.05)
            waited = list(sizes)
            s.backend.step.set()
            answers = [await read_response(r) for r in readers]
            return waited, sizes, answers
        finally:
            await s.__aexit__(None, None, None)

    waited, sizes, answers = run(main(), 60)
    assert sum(waited) == 64  # the five held while the batch ran
    assert sizes[-1] == 10 and sum(sizes) == 74  # then one block of all five
    _squares(answers, 0)


class _Clock:
    """`time` as `deployments.http.native.blocks` sees it: `monotonic()` is the test's `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@needs_front
def test_a_full_block_goes_at_once_and_the_rest_waits_for_the_delay(monkeypatch):
    """The rest goes when the gathering's clock reaches the oldest's due time, and not
    before: the clock is the test's, and the loop's timer is fired by hand as it would be
    (its real due time is an hour away)."""
    delay_s = 3600.0
    clock = _Clock()
    monkeypatch.setattr(blocks, "time", clock)

    async def main():
        clock.now = asyncio.get_running_loop().time()  # the loop's timers, at the same scale
        s, sizes = await _gathering(delay_s=delay_s)
        try:
            s.backend.step.clear()
            readers = await _send(s, range(32))
            await until(lambda: sum(sizes) == 64, "the first full batch submitted", 30)
            first = len(sizes)
            readers += await _send(s, range(32, 72))  # 1.25 blocks
            book = s.server.book
            g = book.gathers["square"]
            await until(lambda: sum(sizes) == 128 and g.waiting == 8,
                        "the second full block submitted and the rest held", 30)
            early = sizes[first:]
            held_at, due_s, timer_s = clock.now, g.due_s, book._timers["square"].when()
            clock.now = due_s - 0.01  # the timer fires a little early: nothing goes yet
            book._due("square")
            before = list(sizes[first:]), g.waiting
            clock.now = due_s
            book._due("square")  # as its timer would, at the due time
            at_due = list(sizes[first:]), g.waiting, g.due_s
            s.backend.step.set()
            answers = [await read_response(r) for r in readers]
            return early, due_s - held_at, timer_s - due_s, before, at_due, answers
        finally:
            await s.__aexit__(None, None, None)

    early, wait_s, timer_late_s, before, at_due, answers = run(main(), 60)
    assert early == [64]  # a full block at once, while the rest waits
    assert wait_s == pytest.approx(delay_s)  # the oldest's due time: held at + delay_s
    assert timer_late_s == 0.0  # the loop's timer is set for it
    assert before == ([64], 8)  # not before it
    assert at_due == ([64, 16], 0, math.inf)  # then the rest, and nothing waits
    _squares(answers, 0)


@needs_front
def test_stopping_sends_what_waits_and_answers_it():
    async def main():
        s, sizes = await _gathering(delay_s=30.0)
        s.backend.step.clear()
        readers = await _send(s, range(32))
        await until(lambda: sum(sizes) == 64, "the first full batch submitted", 30)
        r2, w2 = await s.connect()
        w2.write(binary([7.0, 2.0]) + binary([8.0, 2.0]))
        await until(lambda: s.server.book.gathers["square"].waiting == 2, "two waiting", 30)
        held = list(sizes)
        stopping = asyncio.ensure_future(s.server.stop(30.0))  # stop: what waits is sent
        await until(lambda: sum(sizes) == 68, "what waited sent at the stop", 30)
        s.backend.step.set()  # ... and answered, the batch before it too
        await stopping
        first = [await read_response(r) for r in readers]
        return held, sizes, first, [await read_response(r2) for _ in range(2)]

    held, sizes, first, answers = run(main(), 60)
    assert sum(held) == 64  # the two waited until the stop
    assert sum(sizes) == 68 and sizes[-1] == 4
    _squares(first, 0)
    _squares(answers, 7)


@needs_front
def test_clients_that_hang_up_while_held_leave_the_others_their_answers():
    """Pipelined bursts while a batch is in flight, half of the clients resetting their
    connection while their requests wait to fill a block: the others get their own
    answers, and nothing is left waiting or in flight."""
    import socket as sockets

    async def main():
        s, sizes = await _gathering(delay_s=30.0)  # held until the batch comes back
        try:
            s.backend.step.clear()
            first = await _send(s, range(32))  # a full batch in flight: the rest are held
            await until(lambda: sum(sizes) == 64, "the first full batch submitted", 30)
            kept, gone = [], []
            for c in range(20):
                r, w = await s.connect()
                w.write(b"".join(binary([float(c), 2.0]) for _ in range(3)))
                (gone if c % 2 else kept).append((c, r, w))
            await until(lambda: s.server.book.gathers["square"].waiting > 0, "some held", 30)
            for _, _, w in gone:  # reset, not a polite close
                sock = w.get_extra_info("socket")
                sock.setsockopt(sockets.SOL_SOCKET, sockets.SO_LINGER, struct.pack("ii", 1, 0))
                w.transport.abort()
            s.backend.step.set()
            answers = [await read_response(r) for r in first]
            mine = [(c, [await read_response(r) for _ in range(3)]) for c, r, _ in kept]
            book = s.server.book
            await until(lambda: book.pending == 0 and book.gathers["square"].waiting == 0,
                        "nothing held or in flight", 30)
            return answers, mine
        finally:
            await s.__aexit__(None, None, None)

    answers, mine = run(main(), 60)
    _squares(answers, 0)
    for c, rs in mine:
        assert all(r.status == 200 and struct.unpack("<2f", r.body[-8:]) == (c * c, 4.0)
                   for r in rs)


@needs_front
def test_a_plan_the_front_cannot_learn_is_logged_and_the_python_server_keeps_serving(caplog):
    """Learning a plan fails (here: the backend's gathering answer raises): the answer that
    taught it is already out, the failure is logged once, and the next requests of that
    kind are still answered, by the Python server, none queued by the front."""
    def broken(model):
        raise AttributeError("no placement")

    async def main():
        async with Served(front=True) as s:
            s.backend.gather_s = broken
            with caplog.at_level("ERROR", logger="deployments.http"):
                await asyncio.to_thread(_learnt, s)
                await asyncio.to_thread(_learnt, s)
            assert s.server.stats()["fast"] == 0
            return [r.getMessage() for r in caplog.records]

    messages = run(main())
    assert sum("could not learn a plan" in m for m in messages) == 1, messages
