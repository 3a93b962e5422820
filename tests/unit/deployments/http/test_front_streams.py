"""Requests the native front streams to Python (their head, then their body as it comes) and
input it refuses as it reads, over real sockets: the connection stays the front's whatever a
client sends, and a client sees what the Python server would have answered.

Each waits on the server's own state (the front's counters, the app's records), never on
how long something took.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from deployments.http.native.front import FrontServer, available
from tests.conftest import arun as run
from tests.unit.deployments.http.served import Served, read_response, request
from tests.unit.deployments.http.test_front import binary
from tests.unit.deployments.http.test_front_requests import both_servers, chunked, until

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

ECHO = "/v2/models/echo/infer"


def test_heads_the_framing_checks_refuse_are_answered_and_their_bodies_never_read():
    body = b"x" * 300_000  # past what the front would hold unread
    cases = [
        request("CONNECT", "127.0.0.1:443", body),  # 405
        request("POST", ECHO, body, {"expect": "something-else"}),  # 417
        request("POST", ECHO, body, version="1.0",
                headers={"transfer-encoding": "chunked"}) + b"5\r\nhello\r\n0\r\n\r\n",
        request("POST", ECHO, body).replace(b"host: 127.0.0.1\r\n",
                                            b"host: a\r\nhost: b\r\n"),  # two Hosts
        request("POST", ECHO, headers={"transfer-encoding": "gzip"}) + body,  # 400
        # a request answered first, then a refused one: its answer, then the refusal
        request("GET", "/v2/health/live") + request("CONNECT", "127.0.0.1:443"),
    ]
    python, front, stats = both_servers(cases)
    assert front == python
    assert [g.split(b" ", 2)[1] for g in python] == [b"405", b"417", b"400", b"400", b"400",
                                                    b"200"]
    assert python[-1].count(b"HTTP/1.1 405 ") == 1
    # each streamed (its head checked by Python first); none read on, none whole
    assert stats["streamed"] == 6 and stats["requests"] == 1 and stats["refusals"] == 0


def test_an_expect_100_continue_is_told_to_go_on_when_the_app_reads_and_then_served():
    raw = binary([3.0, 4.0])
    head, body = raw.split(b"\r\n\r\n", 1)
    head += b"\r\nexpect: 100-continue\r\n\r\n"

    async def main(front: bool):
        async with Served(front=front) as s:
            r, w = await s.connect()
            got = []
            for _ in range(2):  # the second time the front holds a plan for it
                w.write(head)  # and waits, as a client does, for the 100
                got.append(await r.readline())
                assert await r.readline() == b"\r\n"
                w.write(body)
                a = await read_response(r)
                got.append((a.status, a.body))
            w.write(raw)  # then a plain one on the same connection
            a = await read_response(r)
            got.append((a.status, a.body))
            w.close()
            return got, (s.server.stats() if front else {})

    python, _ = run(main(False))
    front, stats = run(main(True))
    assert front == python
    assert python[0] == b"HTTP/1.1 100 Continue\r\n" and python[1][0] == 200
    # both streamed (the app, not the quick lane, as on the Python server); the plain one
    # after them framed whole on the same connection
    assert stats["streamed"] == 2 and stats["requests"] == 1, stats


def test_a_streamed_body_is_read_ahead_of_the_app_within_a_bound_and_on_as_it_reads():
    gate = asyncio.Event()
    seen = []

    async def app(scope, receive, send):  # reads nothing until let go; then the whole body
        await gate.wait()
        digest, more = hashlib.sha256(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                raise AssertionError(message)
            digest.update(message["body"])
            more = message.get("more_body", False)
        seen.append(digest.hexdigest())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"64")]})
        await send({"type": "http.response.body", "body": digest.hexdigest().encode()})

    body = bytes(range(256)) * 16_384  # 4 MiB

    async def main():
        server = FrontServer(app, port=0, reuse_port=False)
        await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(request("POST", "/upload", body))
            await until(lambda: server.stats()["streaming"] == 1, "the body streamed")
            lines = server.exchanges.lines

            def held() -> int:  # what the front and Python hold of the body, unread
                return server.stats()["unparsed_bytes"] + sum(
                    line.streaming.unacked for line in lines.values() if line.streaming)

            # it stops reading: what it holds no longer grows
            for _ in range(3):
                before = held()
                await until(lambda b=before: server.stats()["loops"] > 0 and held() == b,
                            "the front waits")
                await asyncio.sleep(0.05)  # a moment more of the client's bytes, if read
            most = held()
            gate.set()
            answer = await read_response(r)
            w.close()
            # a head and a read of input, and a read ahead of the app's, at most
            bound = 2 * server.max_header_bytes + 5 * 1024 + 2 * 64 * 1024
            return most, bound, answer, server.stats()
        finally:
            await server.stop(1.0)

    most, bound, answer, stats = run(main(), 60)
    assert most <= bound, (most, bound)
    assert answer.status == 200 and answer.body.decode() == hashlib.sha256(body).hexdigest()
    assert stats["streamed"] == 1 and stats["streaming"] == 0, stats


def test_an_upgrade_is_answered_as_plain_http_without_its_body_then_the_connection_closes():
    cases = [request("POST", "/v2/models/square/infer", b'{"inputs": []}',
                     {"connection": "upgrade", "upgrade": "websocket"})
             + request("GET", "/v2/health/live")]
    python, front, stats = both_servers(cases)
    assert front == python
    assert python[0].count(b"HTTP/1.1 ") == 1 and b"connection: close" in python[0]
    assert b"zero-length" in python[0]  # read with no body, as httptools reads it
    assert stats["requests"] == 1 and stats["streamed"] == 0


def test_a_body_past_the_limit_is_refused_by_the_app_and_not_read_on():
    te = request("POST", "/v2/models/square/infer", headers={"transfer-encoding": "chunked"})
    cases = [request("POST", "/v2/models/square/infer", b"[" * 1_000_000),
             te + b"186a0\r\n" + b"[" * 100_000 + b"\r\n0\r\n\r\n"]
    python, front, stats = both_servers(cases, max_body_bytes=50_000)
    assert front == python
    assert [g.split(b" ", 2)[1] for g in python] == [b"413", b"413"]
    assert stats["streamed"] == 2, stats


def test_broken_chunks_are_refused_as_the_python_server_refuses_them():
    te = request("POST", "/v2/models/square/infer", headers={"transfer-encoding": "chunked"})
    cases = [
        te + b"5\r\nhelloXX0\r\n\r\n",  # no line end after the chunk
        te + b"zz\r\nhello\r\n0\r\n\r\n",  # not a size
        te + b"5\r\nhello\r\n0\r\n" + b"x-t: " + b"t" * 40_000 + b"\r\n\r\n",  # trailer: 431
        request("GET", "/v2/health/live") + te + b"5\r\nhel",  # cut short by the close
    ]
    python, front, stats = both_servers(cases)
    assert front == python
    assert [g.split(b" ", 2)[1] for g in python] == [b"400", b"400", b"431", b"200"]
    assert stats["refusals"] == 3, stats


def test_a_chunked_request_past_a_heads_bound_with_a_trailer_is_served_not_refused():
    # the trailer lies past the bound on a head; it is no part of one (the Python server
    # counts its bytes toward the header limit, once, not toward the head's)
    raw = binary([float(i % 7) for i in range(12_000)])  # 48 KB of tensor
    trailer = b"x-t: " + b"t" * 9000 + b"\r\n"  # under the limit once, over it twice
    python, front, stats = both_servers([chunked(raw, 4096, trailer)])
    assert front == python and python[0].startswith(b"HTTP/1.1 200 "), python[0][:200]
    assert stats["refusals"] == 0 and stats["streamed"] == 1, stats


def test_a_body_sent_with_its_expect_head_is_read_whole_and_no_100_follows_it():
    """A client that sends its body without waiting for the 100, then half-closes: the app
    reads all of it (what the front still held is handed over before the app learns the
    client sends no more) and no 100 Continue goes out once body bytes came; and one whose
    body comes in two parts, the app waiting between them, gets no 100 either."""
    raw = binary([2.0] * 20_000)  # 80 KB: past what the front hands over ahead of the app
    expect = raw.replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n", 1)
    python, front, _ = both_servers([request("GET", "/v2/health/live") + expect])
    assert front == python and python[0].count(b"HTTP/1.1 200 ") == 2, python[0][:300]
    assert b"100 Continue" not in python[0]

    head, body = expect.split(b"\r\n\r\n", 1)

    async def main(front: bool):
        async with Served(front=front) as s:
            r, w = await s.connect()
            w.write(head + b"\r\n\r\n" + body[:1000])  # some of the body, at once
            # a moment for the app to read what came and wait for the rest (on a slow
            # machine it may not have: then there was nothing to get wrong)
            await asyncio.sleep(0.2)
            w.write(body[1000:])
            a = await read_response(r)
            first = a.status
            w.close()
            return first, a.body[-8:]

    python, front = run(main(False)), run(main(True))
    assert python == front and python[0] == 200, (python, front)
