"""A replica whose engine connection ended asks whether it is still wanted
(`deployments.replica.wanted`), on a fake clock: it leaves once the GCS holds it DEAD, stops
asking once an engine is connected again, asks again when the GCS cannot be read, and runs
one round of asking at a time however many connections end. The replica's end of a direct
connection (`ThreadedLinkServer`) starts the asking when a caller that sent the token goes,
on real sockets: never for a stray connection, nor for the server's own close."""

from __future__ import annotations

import socket
import threading

from deployments.replica.link_server import ThreadedLinkServer
from deployments.replica.wanted import WAITS_S, WantedCheck
from tests.conftest import HANG_S, wait_until


class Gcs:
    """Answers 'dead?' from a script of answers (an Exception instance is raised)."""

    def __init__(self, *answers) -> None:
        self.answers, self.asked = list(answers), 0

    def __call__(self) -> bool:
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else False
        if isinstance(answer, Exception):
            raise answer
        return answer


def check(gcs, connected=lambda: False, **kw):
    slept, left = [], []
    return WantedCheck(gcs, connected, left.append, sleep=slept.append, background=False,
                       **kw), slept, left


def test_it_leaves_once_the_gcs_holds_it_dead_after_the_waits_so_far():
    wanted, slept, left = check(Gcs(False, False, True))
    wanted.connection_ended()
    assert slept == list(WAITS_S[:3]) and wanted.asked == 3
    assert len(left) == 1 and "DEAD" in left[0]


def test_a_replica_still_alive_is_asked_about_a_bounded_number_of_times_and_stays():
    wanted, slept, left = check(Gcs())
    wanted.connection_ended()
    assert wanted.asked == len(WAITS_S) and slept == list(WAITS_S) and left == []


def test_an_engine_connected_again_ends_the_asking():
    state = {"connected": False}
    gcs = Gcs(False, True)  # would say dead at the second ask
    wanted, slept, left = check(gcs, lambda: state["connected"],
                                waits_s=(0.0, 1.0, 2.0))
    wanted.sleep = lambda s: (slept.append(s), state.update(connected=s >= 1.0))
    wanted.connection_ended()
    assert gcs.asked == 1 and left == [] and slept == [0.0, 1.0]


def test_an_unreadable_gcs_is_asked_again():
    wanted, _, left = check(Gcs(OSError("unreachable"), TimeoutError(), True))
    wanted.connection_ended()
    assert wanted.asked == 3 and len(left) == 1


def test_one_round_at_a_time_however_many_connections_end():
    release, started = threading.Event(), threading.Event()
    gcs = Gcs()

    def sleep(_s):
        started.set()
        assert release.wait(HANG_S)

    wanted = WantedCheck(gcs, lambda: False, lambda why: None, waits_s=(0.0, 0.0),
                         sleep=sleep)
    wanted.connection_ended()
    assert started.wait(HANG_S)
    for _ in range(5):
        wanted.connection_ended()  # a round runs: none started
    release.set()
    _join("replica-wanted")
    assert gcs.asked == 2
    wanted.connection_ended()  # the round is over: a new one starts
    _join("replica-wanted")
    assert gcs.asked == 4


def _join(name: str, before: frozenset = frozenset()) -> None:
    """Wait for the threads called `name` that were not running at `before`."""
    def joined(t: threading.Thread) -> bool:
        try:
            t.join(HANG_S)
        except RuntimeError:  # listed while its start() still runs: not joinable yet
            return False
        return True

    for t in threading.enumerate():
        if t.name == name and t not in before:
            wait_until(lambda t=t: joined(t), HANG_S, 0.01, f"thread {name} to start")
            assert not t.is_alive(), f"thread {name} still runs"


def _ended_connections(server: ThreadedLinkServer, send: bytes) -> None:
    host, port, _ = server.address("127.0.0.1")
    before = frozenset(threading.enumerate())
    with socket.create_connection((host, port), timeout=HANG_S) as sock:
        sock.sendall(send)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(HANG_S)
        assert sock.recv(1) == b""  # the server ended it (its reader started before)
    _join("link", before)  # its reader is done: whatever it ran at the end has run


def test_the_link_server_starts_the_asking_only_when_a_caller_that_sent_the_token_goes():
    ended = []
    server = ThreadedLinkServer(lambda items: items, workers=1,
                                on_ended=lambda: ended.append(1))
    try:
        token = server.address("127.0.0.1")[2]
        _ended_connections(server, b"x" * len(token))  # a stray: wrong token
        _ended_connections(server, b"")  # nothing sent
        assert ended == []
        _ended_connections(server, token)  # an engine that went
        assert ended == [1]
    finally:
        server.close()


def test_the_servers_own_close_does_not_start_the_asking():
    ended = []
    server = ThreadedLinkServer(lambda items: items, workers=1,
                                on_ended=lambda: ended.append(1))
    host, port, token = server.address("127.0.0.1")
    before = frozenset(threading.enumerate())
    sock = socket.create_connection((host, port), timeout=HANG_S)
    try:
        sock.sendall(token)
        wait_until(lambda: server.connections, HANG_S, 0.01, "the server to accept")
        server.close()
        sock.settimeout(HANG_S)
        assert sock.recv(1) == b""  # the server ended it
        _join("link", before)
    finally:
        sock.close()
    assert ended == []
