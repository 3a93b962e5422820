"""Silence on a direct connection is checked before it is believed (`deployments.wire.link`):
bytes already waiting in the caller's receive queue count as heard (its own loop was late
to read them), and a caller given `confirm` (the coalescer's, to a batching actor) asks
Ray before it takes a silent actor for lost: one Ray says lives on (busy, or starved for
CPU) keeps its connection and its open calls; one Ray cannot answer for, or says is
gone, is lost with what Ray said. The `Link` is driven by `check(now)` on a fake clock;
the coalescer's case runs over a loopback socket against an actor that holds its pongs.
"""

from __future__ import annotations

import asyncio
import pickle
import socket

from batching.errors import WorkerDied
from deployments.ingress.coalesce import Coalescer
from deployments.wire.bundles import entries
from deployments.wire.keepalive import Keepalive
from deployments.wire.link import PING, PONG, REPLY, Link, LinkLost, LinkServer, _frame, _Served
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.test_link_keepalive import Clock, FakeTransport

K = Keepalive(ping_s=0.5, dead_s=2.0)


class SocketTransport(FakeTransport):
    """A fake transport whose socket is real: what the caller has not read yet is in it."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def get_extra_info(self, name: str, default=None):
        return self.sock if name == "socket" else default


def _link(confirm=None, transport=None):
    clock, lost = Clock(), []
    link = Link(K, on_lost=lost.append, clock=clock, confirm=confirm)
    transport = transport or FakeTransport()
    link.connection_made(transport)
    return link, transport, clock, lost


def _silence(link: Link, clock: Clock, seconds: float = 2.0) -> None:
    """`seconds` of the fake clock with nothing heard, the heartbeat ticking every 0.25 s."""
    for _ in range(int(seconds / 0.25)):
        clock.now += 0.25
        link.check(clock.now)


def test_bytes_waiting_unread_are_heard_and_once_read_silence_counts_again():
    mine, peer = socket.socketpair()
    try:
        async def main():
            link, transport, clock, lost = _link(transport=SocketTransport(mine))
            call = link.call(("batch",))
            peer.sendall(_frame(0, PONG, b""))  # the peer answered; this loop did not read it
            _silence(link, clock)
            kept = not transport.aborted and not call.done() and not lost
            mine.recv(64)  # now read (as asyncio would have): silence from here is the peer's
            _silence(link, clock)
            return kept, await asyncio.gather(call, return_exceptions=True), lost

        kept, (error,), lost = run(main())
    finally:
        mine.close()
        peer.close()
    assert kept
    assert isinstance(error, LinkLost) and len(lost) == 1


def test_a_silent_actor_that_ray_says_lives_keeps_its_connection_and_its_calls():
    asked = []

    async def confirm():
        asked.append(True)
        return None  # it answered Ray

    async def main():
        link, transport, clock, lost = _link(confirm)
        call = link.call(("batch",))
        _silence(link, clock)
        await until(lambda: link.spared == 1, "Ray's answer")
        kept = not transport.aborted and not call.done() and not lost and not link.closed
        _silence(link, clock, 1.75)  # the silence starts over from Ray's answer
        once = len(asked)
        link.data_received(_frame(1, REPLY, pickle.dumps("late, but its own")))
        return kept, once, await call, transport

    kept, once, answer, transport = run(main())
    assert kept and once == 1 and answer == "late, but its own"
    assert [kind for _, kind, _ in transport.frames()].count(PING) == 2  # one per silence


def _ray_times_out_once_let():
    """A `confirm` that says Ray did not answer, once its gate is set."""
    gate = asyncio.Event()

    async def confirm():
        await gate.wait()
        return TimeoutError("no answer from Ray in 5 s")

    return gate, confirm


def test_a_silent_actor_ray_cannot_answer_for_is_lost_with_what_ray_said():
    async def main():
        gate, confirm = _ray_times_out_once_let()
        link, transport, clock, lost = _link(confirm)
        calls = [link.call(("batch", i)) for i in range(2)]
        _silence(link, clock)
        _silence(link, clock)  # still silent while Ray is asked: asked once, not each tick
        pending = not transport.aborted and not any(c.done() for c in calls)
        gate.set()
        return pending, await asyncio.gather(*calls, return_exceptions=True), lost, transport

    pending, errors, lost, transport = run(main())
    assert pending and transport.aborted and len(lost) == 1
    assert all(isinstance(e, LinkLost) and isinstance(e.ray_said, TimeoutError) for e in errors)
    assert "Ray said: TimeoutError" in str(errors[0]) and "nothing heard" in str(errors[0])


def test_an_answer_heard_while_ray_is_asked_keeps_the_connection():
    async def main():
        gate, confirm = _ray_times_out_once_let()
        link, transport, clock, lost = _link(confirm)
        call = link.call(("batch",))
        _silence(link, clock)
        clock.now += 0.1
        link.data_received(_frame(0, PONG, b""))  # the actor spoke after all
        gate.set()
        await until(lambda: link.spared == 1, "the answer from Ray")
        link.data_received(_frame(1, REPLY, pickle.dumps("done")))
        return await call, lost, transport

    answer, lost, transport = run(main())
    assert answer == "done" and not lost and not transport.aborted


# -- the coalescer's connection to a batching actor --------------------------------------
class _Muted(_Served):
    """The actor's side of a connection that leaves pings unanswered while `muted`."""

    muted = False

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        if kind == PING and type(self).muted:
            return
        super().frame(cid, kind, payload)


class QuietActor:
    """A batching actor whose loop goes quiet (no pong, no answer) while `gate` is shut;
    `ready` is what Ray says of it (counted)."""

    def __init__(self, ready_error: BaseException | None = None) -> None:
        self.gate = asyncio.Event()
        self.asked, self.ready_error = 0, ready_error
        self.server = LinkServer(self._infer, self._cancel, QUICK)
        self.server._connection = self._connection
        actor = self

        class _Call:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                return asyncio.ensure_future(self.fn(*args))

        self.link_address = _Call(lambda node: actor.server.address("127.0.0.1"))
        self.ready = _Call(self._ready)
        self.infer = _Call(self._infer)  # the Ray call, while the connection opens

    def _connection(self) -> _Served:
        conn = _Muted(self.server)
        self.server.connections.add(conn)
        return conn

    async def _infer(self, bundle, caller, sent, *model):
        await self.gate.wait()
        return [(e.key, [x * x for x in e.items], None) for e in entries(bundle)]

    async def _cancel(self, *args):
        return 0

    async def _ready(self):
        self.asked += 1
        if self.ready_error is not None:
            raise self.ready_error
        return True


QUICK = Keepalive(ping_s=0.02, dead_s=0.1)


def _quiet_batching_actor(ready_error: BaseException | None):
    """A request held at a batching actor that stops answering pings; what its caller got,
    how often Ray was asked, how many silences the connection was spared, and whether it
    had been closed before the actor went away."""
    async def main():
        actor = QuietActor(ready_error)
        c = Coalescer(lambda: actor, bundle_items=8, keepalive=QUICK)
        assert (await _answered(c, actor, 3.0)) == [9.0]  # the connection opens meanwhile
        await until(lambda: c._dialer.live() is not None, "the direct connection")
        link = c._dialer.live()
        _Muted.muted = True
        try:
            fut = c.submit([5.0], None, None)
            await until(lambda: actor.asked >= 1, "Ray asked about the silent actor")
            if ready_error is None:
                await until(lambda: link.spared >= 1, "the connection spared")
        finally:
            _Muted.muted = False
        actor.gate.set()
        outcome = (await asyncio.gather(fut, return_exceptions=True))[0]
        closed = link.closed
        actor.server.close()
        return outcome, actor.asked, link.spared, closed

    return run(main())


async def _answered(c: Coalescer, actor: QuietActor, x: float):
    actor.gate.set()
    answer = await c.submit([x], None, None)
    actor.gate.clear()
    return answer


def test_a_batching_actor_that_goes_quiet_but_answers_ray_still_answers_its_requests():
    outcome, asked, spared, closed = _quiet_batching_actor(None)
    assert outcome == [25.0] and asked >= 1 and spared >= 1 and not closed


def test_a_batching_actor_ray_says_is_gone_fails_its_requests_with_that_asking_once():
    outcome, asked, spared, closed = _quiet_batching_actor(RuntimeError("the actor died"))
    assert isinstance(outcome, WorkerDied) and "the actor died" in str(outcome)
    assert asked == 1 and closed and not spared  # the coalescer did not ask Ray again
