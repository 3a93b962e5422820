"""The own HTTP server against hostile and broken clients, bytes on real sockets (no Ray).

The table (`hostile_cases`) pins what each malformed, oversized, pipelined or cut-off input
gets; the tests below it hold the server's resource bounds: a client that never reads its
answers, slowloris heads, connection caps, lingering error closes, and a pipelined burst
of synchronous errors (which once recursed and leaked the in-flight count). What they
assert is the server's own state (its connections, their buffers, its counts), never how
fast it answered: a wait is bounded only so that a broken server fails instead of hanging.
"""

from __future__ import annotations

import socket
import time

import pytest

from deployments.http.native.front import available
from tests.conftest import wait_until
from tests.unit.deployments.http.hostile_cases import BODY, CASES, INFER, LIVE, OK_INFER
from tests.unit.deployments.http.wire import ServerThread, exchange, request


@pytest.fixture(scope="module", params=["python", "front"], autouse=True)
def server_kind(request):
    """Every test twice: the Python server alone, and behind the native front (whose
    thread holds the sockets and hands these clients to the same Python server)."""
    if request.param == "front" and not available():
        pytest.skip("the native front is not compiled (needs a C compiler): run `make "
                    "setup` with gcc installed")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("RAYBATCH_TEST_FRONT", "1" if request.param == "front" else "0")
        yield request.param


@pytest.fixture(scope="module")
def servers(server_kind):
    with ServerThread("echo") as echo, ServerThread("oip") as oip:
        yield {"echo": echo, "oip": oip}


@pytest.mark.parametrize(("app", "data", "statuses", "end"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input(servers, app, data, statuses, end):
    server = servers[app]
    sock = server.connect(timeout_s=10)
    try:
        got = exchange(sock, data, half_close=end == "eof",
                       count=None if end == "eof" else len(statuses), timeout_s=10)
        finals = [s for s in got.statuses if s >= 200]
        assert finals == statuses, (finals[:10], got.rest[:200])
        for r in got.responses:
            assert r.status < 500, r
            if r.status >= 400:
                assert set(r.json()) == {"error"} and r.json()["error"]
        if end == "eof":
            assert got.closed and not got.reset, got
        elif end == "open":
            after = exchange(sock, LIVE if app == "oip" else request("GET", "/after"),
                             half_close=False, count=1)
            assert after.statuses == [200], after
        else:
            rest = exchange(sock, b"", half_close=False, timeout_s=5)
            assert rest.closed and not rest.reset and not rest.responses, rest
    finally:
        sock.close()
    if app == "oip":  # every request the app took has ended
        wait_for(lambda: server.call(lambda: server.app.inflight) == 0, "nothing in flight")


def wait_for(check, what: str):
    """`check()`'s first truthy value; fails after 60 s (a bound on waiting, not a speed)."""
    return wait_until(check, timeout_s=60, every_s=0.02, what=what)


def at_eof(sock: socket.socket) -> bool:
    """Has the server closed `sock` (its FIN is there to read)? Does not wait."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False


def test_the_suite_is_large_and_covers_every_class():
    prefixes = {c[0].split("-")[0] for c in CASES}
    assert len(CASES) >= 150, len(CASES)
    assert {"line", "host", "cl", "te", "hdr", "pipe", "expect", "upgrade", "oip",
            "ctl"} <= prefixes


def test_a_client_that_never_reads_is_not_read_either(server_kind):
    """Pipelined infer requests pushed by a client that reads nothing: the server stops
    reading once its answers back up, so what it holds for the connection stays bounded
    however much is pushed (its RSS is measured by `benchmarks.http.front_hostile`, in a
    process of its own). The mark is small and the server's socket buffer too, so a few
    hundred answers reach that state whatever the kernel's buffer tuning and however
    little CPU a busy machine gives the server (with the kernel's own send buffer grown
    to megabytes, tens of thousands were needed)."""
    if server_kind == "front":
        pytest.skip("the front's own bounds: test_front.py, held to its buffer counts")
    block = OK_INFER * (65536 // len(OK_INFER))
    mark = 64 * 2**10

    def held():
        """The connection's state, once it reads no more for good: reading paused because
        its unsent answers passed the mark (the client reads none, so that lasts)."""
        conns = list(server.server.connections)
        if len(conns) != 1 or not (conns[0].paused_reading and conns[0].write_paused):
            return None
        conn = conns[0]
        return len(conn.inbuf), len(conn.cycles), conn.transport.get_write_buffer_size()

    def small_send_buffer() -> bool:
        conns = list(server.server.connections)
        if len(conns) != 1:
            return False
        conns[0].transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return True

    with ServerThread("oip", max_unsent_bytes=mark) as server:
        sock = server.connect()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        give_up = time.monotonic() + 60  # only bounds a server that never settles
        while not server.call(small_send_buffer):
            assert time.monotonic() < give_up, "the server never took the connection"
            time.sleep(0.01)
        sock.setblocking(False)
        pushed, state = 0, None
        while pushed < 64 * 2**20 and state is None:
            try:  # a partial send goes on where it stopped: the stream stays whole
                pushed += sock.send(block[pushed % len(block):])
            except BlockingIOError:  # full: because the server stopped, or is behind?
                state = server.call(held)
                if state is None:
                    if time.monotonic() > give_up:
                        pytest.fail(f"the server did not stop reading in 60 s ({pushed} "
                                    "bytes taken)")
                    time.sleep(0.01)
        sock.close()
    assert state is not None and pushed < 64 * 2**20, pushed  # it stopped reading
    unparsed, parsed, unsent = state
    assert unparsed <= 2**20 and parsed <= 16 + 4096 // 100 + 1, (unparsed, parsed)
    assert unsent <= mark + 64 * 2**10, unsent


def test_slowloris_heads_get_408_and_do_not_delay_others(server_kind):
    """Heads sent a byte at a time: ordinary requests are answered while they trickle in,
    the bytes do not move when each head began (the header timeout counts from its first
    byte), and the sweep refuses each with 408 once that is longer ago than
    header_timeout_s. The sweep's own timer never refuses here (an hour): the test runs it
    as that timer would, with the timeout set to 0."""
    if server_kind == "front":
        _slowloris_behind_the_front()
        return
    with ServerThread("oip", header_timeout_s=3600.0, keep_alive_s=3600.0) as server:
        slow = [server.connect() for _ in range(200)]
        head = b"GET /v2/health/live HTTP/1.1\r\nhost: a\r\nx-a: "

        def heads() -> list:
            """Each head under way in the Python server: when it began, bytes taken."""
            return sorted((c.head_since, c.head_fed) for c in server.server.connections
                          if c.head_since is not None)

        for i in range(30):  # the heads never end: 30 bytes of a longer head line
            for s in slow:
                s.sendall(head[i:i + 1])
            if i == 0:  # (behind the front: once it hands the slow heads over)
                under_way = wait_for(lambda: (h := server.call(heads)) and len(h) == 200 and h,
                                     "200 heads under way")
                began = [t for t, _ in under_way]
            got = exchange(server.port, LIVE, count=1, timeout_s=30)
            assert got.statuses == [200], (i, got)  # answered while 200 heads trickle
        wait_for(lambda: [n for _, n in server.call(heads)] == [30] * 200,
                 "every byte of the 200 heads taken")
        assert [t for t, _ in server.call(heads)] == began  # the bytes reset no timer

        def sweep() -> None:
            server.server.header_timeout_s = 0.0
            server.server._sweep()

        server.call(sweep)  # as its timer would, once header_timeout_s has passed
        answers = [exchange(s, b"", half_close=False, timeout_s=30) for s in slow]
    assert all(a.statuses == [408] and a.closed for a in answers), answers[0]


def _slowloris_behind_the_front() -> None:
    """Behind the front a head arriving slowly stays the front's: ordinary requests are
    answered around 200 of them, and each is refused (408, then closed) once
    header_timeout_s has passed since its first byte while its bytes still trickle in (a
    timer the bytes reset would never refuse one here)."""
    with ServerThread("oip", header_timeout_s=2.0, keep_alive_s=3600.0) as server:
        slow = [server.connect() for _ in range(200)]
        head = b"GET /v2/health/live HTTP/1.1\r\nhost: a\r\nx-a: " + b"a" * 8000
        got = [b""] * len(slow)
        for i in range(len(head)):
            if all(b"\r\n\r\n" in g for g in got):
                break
            for k, s in enumerate(slow):
                try:
                    s.sendall(head[i:i + 1])
                    s.setblocking(False)
                    got[k] += s.recv(65536)
                except (BlockingIOError, ConnectionError):
                    pass  # nothing yet; or refused, and its lingering close is over
                finally:
                    s.setblocking(True)
            assert exchange(server.port, LIVE, count=1, timeout_s=30).statuses == [200], i
        stats = server.call(server.server.stats)
        for s in slow:
            s.close()
    assert all(g.startswith(b"HTTP/1.1 408 ") and b"connection: close" in g for g in got), \
        next(g for g in got if not g.startswith(b"HTTP/1.1 408 "))
    assert stats["streamed"] == 0 and stats["refusals"] == 0, stats


def test_past_max_connections_an_idle_one_makes_room_else_503():
    def open_connections() -> int:
        if server.front:
            return server.server.stats()["connections"]
        return len(server.server.connections)

    with ServerThread("oip", max_connections=4) as server:
        idle = [server.connect() for _ in range(4)]
        wait_for(lambda: server.call(open_connections) == 4, "the four idle accepted")
        assert exchange(server.port, LIVE, count=1).statuses == [200]  # one idle closed
        wait_for(lambda: any(at_eof(s) for s in idle), "an idle one closed to make room")
        server.call(lambda: server.backend.step.clear())  # infer requests now wait
        busy = [server.connect() for _ in range(4)]
        for s in busy:
            s.sendall(OK_INFER)
        wait_for(lambda: server.call(lambda: server.app.inflight) == 4, "four in flight")
        refused = exchange(server.port, LIVE)
        server.call(lambda: server.backend.step.set())
        answered = [exchange(s, b"", half_close=False, count=1) for s in busy]
    assert refused.statuses == [503] and refused.closed, refused
    assert all(a.statuses == [200] for a in answered)


def test_an_error_close_lingers_so_a_client_still_sending_reads_the_413():
    """A body over the limit gets 413 at once; the client, still sending, must read it
    rather than a reset (the server reads and drops the rest for a moment)."""
    with ServerThread("oip", limits={"max_body_bytes": 4096}) as server:
        sock = server.connect()
        sock.sendall(raw_head := request("POST", INFER, b"", content_length=str(2**20)))
        assert raw_head
        sent = 0
        try:
            while sent < 2**20:
                sent += sock.send(b"x" * 65536)
        except OSError:
            pass
        got = exchange(sock, b"", half_close=False, timeout_s=5)
        sock.close()
    assert got.statuses == [413] and not got.reset, got


def test_expect_100_continue_is_answered_at_once_in_either_header_order():
    """The 100 comes from the head alone: with the server's once-a-second sweep stopped,
    it still comes before the client sends the body."""
    with ServerThread("echo") as server:
        server.call(lambda: server.server._sweeper.cancel())  # no sweep from now on
        for head in (b"expect: 100-continue\r\ncontent-length: 5\r\n",
                     b"content-length: 5\r\nexpect: 100-continue\r\n"):
            sock = server.connect(timeout_s=30)  # bounds the wait only
            sock.sendall(b"POST /x HTTP/1.1\r\nhost: a\r\n" + head + b"\r\n")
            first = sock.recv(100)
            got = exchange(sock, b"hello", half_close=False, count=1, timeout_s=30)
            sock.close()
            assert first.startswith(b"HTTP/1.1 100 Continue"), first
            assert got.statuses == [200] and got.responses[0].json()["length"] == 5


def test_no_100_continue_to_an_http_10_client():
    with ServerThread("echo") as server:
        got = exchange(server.port, b"POST /x HTTP/1.0\r\nexpect: 100-continue\r\n"
                                    b"content-length: 5\r\n\r\nhello")
    assert [r.status for r in got.responses] == [200]


def test_trailers_never_change_the_request_headers():
    """An infer body in chunks whose trailer says the body is binary and gzipped: the
    trailer is dropped, so the body is read as the JSON it is."""
    with ServerThread("oip") as server:
        got = exchange(server.port, b"POST " + INFER.encode() + b" HTTP/1.1\r\nhost: a\r\n"
                       b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n"
                       b"inference-header-content-length: 3\r\ncontent-encoding: gzip\r\n"
                       b"\r\n" % (len(BODY), BODY), count=1)
    assert got.statuses == [200] and got.responses[0].json()["outputs"][0]["data"] == [9.0]


def test_a_pipelined_burst_of_errors_is_answered_whole_and_leaks_nothing():
    """One infer then 500 requests the quick lane refuses at once, in one write: 501
    answers in order (no recursion), and the in-flight count is back to 0."""
    with ServerThread("oip") as server:
        got = exchange(server.port, OK_INFER + request("POST", INFER, b"{") * 500)
        inflight = server.call(lambda: server.app.inflight)
        after = exchange(server.port, request("POST", INFER, BODY), count=1)
    assert got.statuses == [200] + [400] * 500 and got.closed
    assert inflight == 0 and after.statuses == [200]
    assert after.responses[0].json()["outputs"][0]["data"] == [9.0]


def test_requests_parsed_ahead_are_bounded_within_one_read(server_kind):
    """A 100 KB write of tiny pipelined requests: while the first is held, the server has
    parsed at most max_pipelined_requests plus one slice's worth of them (the front, which
    frames them itself, max_pipelined_requests)."""
    with ServerThread("oip", max_pipelined=16) as server:
        server.call(lambda: server.backend.step.clear())
        sock = server.connect()
        sock.sendall(OK_INFER + LIVE * (100_000 // len(LIVE)))
        wait_for(lambda: server.call(lambda: server.app.inflight) == 1, "the first held")

        def parsed_ahead() -> int:
            if server_kind == "front":  # requests framed and not yet answered
                return server.server.stats()["queued"]
            return max((len(c.cycles) for c in server.server.connections), default=0)

        # past max_pipelined waiting, parsing stops for good while the first is held; a
        # server that parses on shows more here, not less
        full = 16 if server_kind == "front" else 17
        parsed = wait_for(lambda: (n := server.call(parsed_ahead)) >= full and n,
                          "the pipeline filled to max_pipelined")
        server.call(lambda: server.backend.step.set())
        got = exchange(sock, b"", half_close=True, timeout_s=10)
        sock.close()
    assert parsed <= 16 + 4096 // len(LIVE) + 1, parsed
    assert got.statuses == [200] * (1 + 100_000 // len(LIVE))


