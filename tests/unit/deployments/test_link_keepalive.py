"""The direct connection's keepalive (`deployments.wire.keepalive`, `deployments.wire.link`): the
heartbeat as a state machine on a fake clock; a `Link` over a fake transport, driven by
`check(now)` (no timer, no sleep); the actor's side answering pings without running
anything; and over a real loopback socket, a peer that stops answering (as a stopped
process: its kernel still acknowledges) taken for lost, and a replica busy with a long
batch still answering pings."""

from __future__ import annotations

import asyncio
import pickle
import socket
import threading

import pytest

from deployments.replica.link_server import ThreadedLinkServer
from deployments.wire.keepalive import Heartbeat, Keepalive, Verdict, tcp_keepalive
from deployments.wire.link import (
    HEAD,
    PING,
    PONG,
    REPLY,
    Link,
    LinkLost,
    LinkServer,
    _frame,
)
from tests.conftest import arun as run
from tests.conftest import until

K = Keepalive(ping_s=0.5, dead_s=2.0)


# -- the heartbeat alone ----------------------------------------------------------------
def test_a_peer_that_stops_answering_is_lost_after_dead_s_of_silence_with_a_call_open():
    hb = Heartbeat(K, now=0.0)
    verdicts = {t: hb.check(t, outstanding=True) for t in (0.25, 0.5, 0.75, 1.0, 1.75)}
    assert verdicts == {0.25: Verdict.QUIET, 0.5: Verdict.PING, 0.75: Verdict.QUIET,
                        1.0: Verdict.QUIET, 1.75: Verdict.QUIET}  # one ping, not one a tick
    assert hb.check(1.99, outstanding=True) is Verdict.QUIET
    assert hb.check(2.0, outstanding=True) is Verdict.LOST
    assert "2.0 s" in hb.why(2.0) and "ping unanswered" in hb.why(2.0)


def test_a_healthy_idle_link_is_never_lost():
    """Nothing open for an hour of the fake clock, the peer answering each ping."""
    hb = Heartbeat(K, now=0.0)
    pings = 0
    t = 0.0
    while t < 3600.0:
        t += 0.25
        verdict = hb.check(t, outstanding=False)
        assert verdict is not Verdict.LOST
        if verdict is Verdict.PING:
            pings += 1
            hb.answered(t + 0.001)  # its pong, a millisecond later
    assert 3600 / 0.75 <= pings <= 3600 / 0.5  # a ping once idle for ping_s


def test_an_idle_link_whose_ping_goes_unanswered_is_lost_too():
    hb = Heartbeat(K, now=0.0)
    assert hb.check(0.5, outstanding=False) is Verdict.PING
    assert hb.check(1.9, outstanding=False) is Verdict.QUIET
    assert hb.check(2.0, outstanding=False) is Verdict.LOST


def test_answers_flowing_need_no_ping_and_keep_a_busy_link_alive():
    hb = Heartbeat(K, now=0.0)
    for i in range(1, 400):  # an answer every 0.1 s for 40 s, a check every 0.1 s
        hb.heard(i * 0.1)
        assert hb.check(i * 0.1 + 0.05, outstanding=True) is Verdict.QUIET


def test_a_large_frame_leaving_the_send_buffer_is_not_silence():
    """The peer's kernel taking bytes off this side's send buffer: its host is up."""
    hb = Heartbeat(K, now=0.0)
    buffered = 10_000_000
    verdicts = []
    for i in range(1, 40):  # 10 s of fake time: the buffer drains, no byte comes back
        buffered -= 200_000
        verdicts.append(hb.check(i * 0.25, outstanding=True, buffered=buffered))
    assert Verdict.LOST not in verdicts
    # ...until it stops draining
    assert hb.check(12.0, outstanding=True, buffered=buffered) is Verdict.LOST


def test_tcp_keepalive_options_are_set_on_a_tcp_socket():
    sock = socket.socket()
    try:
        tcp_keepalive(sock, K)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
    finally:
        sock.close()
    tcp_keepalive(None, K)  # no socket (a test's transport): nothing to do


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="Unix sockets")
def test_a_unix_socket_gets_no_tcp_options():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        tcp_keepalive(a, K)  # a link on one node: nothing set, nothing raised
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    finally:
        a.close()
        b.close()


# -- a Link on a fake transport ---------------------------------------------------------
class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default=None):
        return default

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def frames(self) -> list[tuple[int, int, bytes]]:
        out = []
        for data in self.written:
            n, cid, kind = HEAD.unpack_from(data)
            out.append((cid, kind, data[HEAD.size:HEAD.size + n]))
        return out


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fake_link() -> tuple[Link, FakeTransport, Clock, list[str]]:
    clock, lost = Clock(), []
    link = Link(K, on_lost=lost.append, clock=clock)
    transport = FakeTransport()
    link.connection_made(transport)
    return link, transport, clock, lost


def test_a_silent_peer_fails_every_open_call_with_link_lost_and_is_aborted():
    async def main():
        link, transport, clock, lost = _fake_link()
        calls = [link.call(("batch", i)) for i in range(3)]
        clock.now += 0.5
        link.check(clock.now)
        assert transport.frames()[-1] == (0, PING, b"")  # a ping carries no work
        clock.now += 1.4
        link.check(clock.now)
        assert not any(c.done() for c in calls) and not transport.aborted
        clock.now += 0.1  # dead_s since the last byte heard
        link.check(clock.now)
        results = await asyncio.gather(*calls, return_exceptions=True)
        late = await asyncio.gather(link.call(("batch", 9)), return_exceptions=True)
        return results + late, transport, lost, link

    results, transport, lost, link = run(main())
    assert all(isinstance(r, LinkLost) for r in results)
    assert "nothing heard" in str(results[0]) and transport.aborted and link.closed
    assert len(lost) == 1 and "link_dead_s=2" in lost[0]
    link.frame(1, REPLY, pickle.dumps("late"))  # a late answer: nobody is left to get it


def test_a_pong_or_an_answer_keeps_the_link_and_its_calls_open():
    async def main():
        link, transport, clock, lost = _fake_link()
        call = link.call(("batch",))
        for _ in range(20):  # 10 s of a long batch, a pong each time a ping goes out
            clock.now += 0.5
            link.check(clock.now)
            if transport.frames()[-1][1] == PING:
                link.data_received(_frame(0, PONG, b""))
        assert not call.done() and not lost
        link.data_received(_frame(1, REPLY, pickle.dumps("done")))
        return await call, transport

    answer, transport = run(main())
    pings = [f for f in transport.frames() if f[1] == PING]
    assert answer == "done" and 9 <= len(pings) <= 20 and not transport.aborted


def test_a_link_closed_by_its_caller_does_not_report_a_loss():
    async def main():
        link, _, _, lost = _fake_link()
        link.close()
        link.connection_lost(None)
        return lost

    assert run(main()) == []


def test_a_peer_that_hangs_up_reports_the_loss():
    async def main():
        link, _, _, lost = _fake_link()
        call = link.call(("batch",))
        link.connection_lost(ConnectionResetError("reset"))
        return await asyncio.gather(call, return_exceptions=True), lost

    (error,), lost = run(main())
    assert isinstance(error, LinkLost) and len(lost) == 1 and "reset" in lost[0]


# -- the actor's side -------------------------------------------------------------------
def test_the_actor_answers_a_ping_with_a_pong_and_runs_nothing():
    ran: list = []

    async def infer(*args):
        ran.append(args)

    async def cancel(*args):
        ran.append(args)

    async def main():
        server = LinkServer(infer, cancel, K)
        conn = server._connection()
        transport = FakeTransport()
        conn.connection_made(transport)
        conn.data_received(server.token + _frame(7, PING, b""))
        await asyncio.sleep(0)
        conn.connection_lost(None)
        return transport

    transport = run(main())
    assert transport.frames() == [(7, PONG, b"")] and ran == []


def test_a_caller_dropped_with_its_dialer_closes_its_connection():
    """A `RaybatchClient` drops a route (and its dialer) after a lost actor: the
    connection, which pings, must not stay open as long as the process."""
    import gc

    from deployments.wire.dialer import Dialer

    class Actor:
        def __init__(self, server):
            self.server = server

        class _Address:
            def __init__(self, server):
                self.server = server

            async def remote(self, node):
                return await self.server.address("127.0.0.1")

        @property
        def link_address(self):
            return self._Address(self.server)

    async def main():
        async def infer(*args):
            return args

        async def cancel(*args):
            return 0

        server = LinkServer(infer, cancel, K)
        dialers = [Dialer("the batching actor", K)]
        dialers[0].dial(Actor(server))
        await until(lambda: dialers[0].live() is not None, "the link open")
        link = dialers[0].link
        dialers.clear()
        gc.collect()
        closed = link.closed
        server.close()
        return closed

    assert run(main())


# -- over a real loopback socket --------------------------------------------------------
def test_a_peer_that_takes_bytes_but_never_answers_is_taken_for_lost():
    """As a process that was stopped (SIGSTOP) or a host cut off: no FIN, no RST, no answer;
    here its kernel even acknowledges. The link is driven with explicit times."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()

    async def main():
        clock, lost = Clock(), []
        _, link = await asyncio.get_running_loop().create_connection(
            lambda: Link(K, lost.append, clock), "127.0.0.1", port)
        call = link.call(("batch",))
        await until(lambda: accepted, "the connection accepted")
        for _ in range(4):
            clock.now += 0.5
            link.check(clock.now)
        return await asyncio.gather(call, return_exceptions=True), lost

    try:
        (error,), lost = run(main())
    finally:
        listener.close()
        for s in accepted:
            s.close()
    assert isinstance(error, LinkLost) and len(lost) == 1


def test_a_replica_busy_with_a_long_batch_still_answers_pings():
    """One call slot (a CPU replica): the batch runs on the thread that read it, and the
    caller hears the replica alive meanwhile (its pings answered by the pulse); then the
    batch's answer comes."""
    gate = threading.Event()

    def slow(items):
        gate.wait(10)
        return [2 * x for x in items]

    async def main():
        server = ThreadedLinkServer(slow, workers=1, keepalive=K)
        host, port, token = server.address("127.0.0.1")
        link = await Link.open_to(host, port, token, keepalive=K)
        batch = link.call([1, 2])
        for _ in range(3):  # pings while the batch runs, each answered
            link.check(link.heartbeat.heard_s + K.ping_s)
            await until(lambda: link.heartbeat.ping_sent_s is None, "the pong")
        assert not batch.done() and not link.closed
        gate.set()
        answer = await batch
        link.close()
        server.close()
        return answer

    assert run(main()) == [2, 4]


def test_a_replicas_call_thread_reads_each_call_and_writes_its_answer():
    """`ThreadedLinkServer`: the model's errors and an answer that does not pickle come
    back as errors of their call; a frame that is not a call's arguments ends the
    connection, running nothing."""
    import socket as socketlib

    from batching.errors import WorkerDied
    from deployments.wire.link import HEAD, INFER

    ran: list = []

    def fn(x):
        ran.append(x)
        if x == "bad":
            raise ValueError("the model broke")
        return (lambda: None) if x == "unpicklable" else 2 * x

    async def main():
        server = ThreadedLinkServer(fn, workers=1, keepalive=K)
        host, port, token = server.address("127.0.0.1")
        link = await Link.open_to(host, port, token, keepalive=K)
        answers = await asyncio.gather(link.call(21), link.call("bad"),
                                       link.call("unpicklable"), return_exceptions=True)
        link.close()
        sock = socketlib.create_connection((host, port), timeout=5)
        sock.sendall(token + HEAD.pack(4, 1, INFER) + b"junk")
        closed = await asyncio.to_thread(sock.recv, 100)
        sock.close()
        server.close()
        return answers, closed

    answers, closed = run(main())
    assert answers[0] == 42
    assert isinstance(answers[1], ValueError) and "broke" in str(answers[1])
    assert isinstance(answers[2], WorkerDied) and "could not be sent back" in str(answers[2])
    assert closed == b"" and ran == [21, "bad", "unpicklable"]
