"""Requests the native front frames whole and hands to Python (`deployments.http.native.exchange`),
over real sockets: answers streamed in their connection's turn, a client that does not read
holding its stream back, a client that goes or half-closes ending what runs for it, and an
answer that closes its connection ending what was pipelined after it, unrun.

Each waits on the server's own state (the front's counters, the app's records), never on
how long something took.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from deployments.http.native.front import FrontServer, available
from tests.conftest import arun as run
from tests.unit.deployments.http.served import Served, read_response, request
from tests.unit.deployments.http.test_front import binary

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

STREAM = "/v2/models/words/generate_stream"


async def until(check, what: str) -> None:
    """Wait (on the loop: the server runs on it) until `check()`; fail past a hang."""
    for _ in range(20_000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


def sse(body: bytes) -> list[dict]:
    chunks = body.split(b"\n\n")
    assert chunks[-1] == b"", body[-200:]
    return [json.loads(c[6:]) for c in chunks[:-1]]


def generate(prompt: str, tokens: int) -> bytes:
    return request("POST", STREAM, json.dumps({"text_input": prompt,
                                               "max_tokens": tokens}).encode())


def both_servers(cases: list[bytes], **limits) -> tuple[list[bytes], list[bytes], dict]:
    """Each of `cases` on a connection of its own, then a half-close, read to the server's
    close: from the Python server alone and from the front (with the front's stats)."""
    async def main(front: bool):
        async with Served(front=front, **limits) as s:
            got = []
            for raw in cases:
                r, w = await s.connect()
                w.write(raw)
                w.write_eof()
                got.append(await r.read())
                w.close()
            return got, (s.server.stats() if front else {})

    python, _ = run(main(False))
    front, stats = run(main(True))
    return python, front, stats


def chunked(raw: bytes, piece: int = 40, trailer: bytes = b"") -> bytes:
    """`raw` (a whole request with a Content-Length) sent with chunked transfer coding, in
    chunks of `piece` bytes, `trailer` (whole field lines) after the last."""
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"content-length")]
    parts = [body[i:i + piece] for i in range(0, len(body), piece)]
    return (b"\r\n".join(lines) + b"\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
            + b"0\r\n" + trailer + b"\r\n")


def test_requests_without_a_plan_go_to_python_framed_whole_or_streamed_never_the_connection():
    async def main():
        async with Served(front=True) as s:
            r, w = await s.connect()
            seen = []
            expect = binary([7.0, 8.0]).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n", 1)
            for raw in [binary([1.0, 2.0]), binary([3.0, 4.0]), request("GET", "/v2/health/live"),
                        chunked(binary([5.0, 6.0])), expect, binary([9.0, 1.0])]:
                w.write(raw)
                a = await read_response(r)
                st = s.server.stats()
                seen.append((a.status, st["fast"], st["requests"], st["streamed"]))
            w.close()
            return seen

    # (status, queued by the front, handed to Python whole, streamed): the first is Python's,
    # whole (it teaches the plan), the second the front's, the health check and the chunked
    # one Python's, whole; the one with Expect is streamed (its body once the app asks for
    # it), and the connection stays the front's: the last is queued by it
    assert run(main()) == [(200, 0, 1, 0), (200, 1, 1, 0), (200, 1, 2, 0), (200, 1, 3, 0),
                           (200, 1, 3, 1), (200, 2, 3, 1)]


def test_chunked_requests_are_framed_whole_up_to_a_heads_bound_and_answered_alike():
    raw = binary([2.0, 3.0])
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = b"\r\n".join(ln for ln in head.split(b"\r\n")
                         if not ln.startswith(b"content-length"))
    te = lines + b"\r\ntransfer-encoding: chunked\r\n\r\n"
    cases = [
        chunked(raw, 7),  # many chunks
        # a chunk extension and a trailer field
        te + b"%x;ext=1\r\n%s\r\n0\r\nx-trailer: t\r\n\r\n" % (len(body), body),
        te.replace(b"chunked", b"Chunked  ") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body),
        te + b"%x\r\n%s\r\n0\r\nx-big: %s\r\n\r\n" % (len(body), body, b"t" * 20_000),  # 431
        chunked(binary([1.5] * 12_000), 4096),  # past a head's bound: the Python server's
        te.replace(b"chunked", b"gzip, chunked") + b"0\r\n\r\n",  # another coding: 400
    ]

    python, front, stats = both_servers(cases, max_header_bytes=16 * 1024)
    assert front == python
    assert [g.split(b" ", 2)[1] for g in python] == [b"200", b"200", b"200", b"431", b"200",
                                                    b"400"]
    # three whole; the trailer past the limit refused as the front read it; the one past a
    # head's bound and the other coding streamed (the second refused by Python's checks)
    assert (stats["requests"], stats["refusals"], stats["streamed"]) == (3, 1, 2), stats


def test_a_stream_behind_a_queued_answer_is_held_until_its_turn_then_follows_it():
    async def main():
        async with Served(front=True) as s:
            r, w = await s.connect()
            w.write(binary([1.0, 1.0]))  # teaches the front the plan
            assert (await read_response(r)).status == 200
            gate = asyncio.Event()
            infer = s.backend.infer

            async def held(*args, **kwargs):
                await gate.wait()
                return await infer(*args, **kwargs)

            s.backend.infer = held
            w.write(binary([2.0, 3.0]) + generate("later", 40))
            front = s.server
            # the stream ran to its end while the queued request waits: all of it is held
            streamed = ("/v2/models/{model}/generate_stream", 200)
            await until(lambda: streamed in s.app.response_counts()
                        and front.exchanges.pending == 0, "the stream whole, held")
            assert front.stats()["queued"] == 2  # neither written yet
            assert front.stats()["unsent_bytes"] > 40 * 20 and front.stats()["fast"] == 1
            gate.set()
            first = await read_response(r)
            second = await read_response(r)
            w.close()
            return first, second

    first, second = run(main())
    assert first.status == 200 and struct.unpack("<2f", first.body[-8:]) == (4.0, 9.0)
    got = sse(second.body)
    assert second.status == 200 and [e["text_output"] for e in got[:-1]] == \
        [f"w{i} " for i in range(40)] and got[-1]["final"] is True


def _streaming_app(chunks: int, size: int):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":
            app.calls.append("/hold")
            assert (await receive())["type"] == "http.request"
            app.ended = (await receive())["type"]  # waits for the client to go
            return
        if scope["path"] == "/close":
            app.calls.append("/close")
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"connection", b"close"), (b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        app.calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(chunks):
            app.sent = i + 1
            await send({"type": "http.response.body", "body": bytes([i % 251]) * size,
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    app.calls, app.sent, app.ended = [], 0, None
    return app


async def _front(app, **kwargs) -> FrontServer:
    server = FrontServer(app, port=0, reuse_port=False, **kwargs)
    await server.start()
    return server


def test_a_stream_to_a_client_that_does_not_read_waits_within_the_bound():
    chunks, size, bound = 256, 64 * 1024, 256 * 1024

    async def main():
        app = _streaming_app(chunks, size)
        server = await _front(app, max_unsent_bytes=bound)
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
            sock.sendall(request("GET", "/stream"))
            lines = server.exchanges.lines

            def waiting() -> bool:  # the app is held at the front's mark
                return any(line.writable is not None and not line.writable.is_set()
                           for line in lines.values())

            await until(waiting, "the stream held at max_unsent_bytes")
            unsent, sent = server.stats()["unsent_bytes"], app.sent
            r, w = await asyncio.open_connection(sock=sock)
            answer = await read_response(r)
            w.close()
            return unsent, sent, answer, server.stats()
        finally:
            await server.stop(1.0)

    unsent, sent, answer, stats = run(main(), 60)
    assert unsent <= bound + size and sent < chunks, (unsent, sent)
    assert answer.status == 200 and answer.body == b"".join(bytes([i % 251]) * size
                                                            for i in range(chunks))
    assert stats["streamed"] == 0 and stats["requests"] == 1


def test_a_client_that_goes_mid_stream_ends_its_generation_and_frees_its_slot():
    async def main():
        async with Served(front=True) as s:
            r, w = await s.connect()
            w.write(generate("endless", 1_000_000))
            assert (await r.readline()).startswith(b"HTTP/1.1 200")
            sock = w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.close()  # a reset: gone both ways
            front = s.server
            await until(lambda: s.backend.closed == ["endless"], "the generation closed")
            await until(lambda: front.stats()["reserved"] == 0 and not front.exchanges.lines,
                        "the slot free, nothing left in Python's hands")
            return front.stats()

    stats = run(main())
    assert stats["connections"] == 0 and stats["streamed"] == 0


@pytest.mark.parametrize("front", [False, True], ids=["python", "front"])
def test_a_half_closed_client_ends_its_stream_as_the_python_server_ends_it(front):
    async def main():
        async with Served(front=front) as s:
            r, w = await s.connect()
            w.write(generate("halved", 1_000_000))
            w.write_eof()
            got = await r.read()  # to the server's close
            return got, s.backend.closed

    got, closed = run(main(), 30)
    # the generation ends (closed before its end) and so does the connection, its
    # answer cut where it stopped: the same with either server
    assert got.startswith(b"HTTP/1.1 200") and b"data: " in got and closed == ["halved"]
    assert not got.endswith(b"0\r\n\r\n")


def test_an_answer_that_closes_ends_what_was_pipelined_after_it_unrun():
    async def main():
        app = _streaming_app(1, 1)
        server = await _front(app)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(request("GET", "/close") + request("GET", "/a") + request("GET", "/b"))
            answer = await read_response(r)
            rest = await r.read()
            w.close()
            await until(lambda: not server.exchanges.pending and server.stats()["reserved"] == 0
                        and server.stats()["connections"] == 0, "the connection ended")
            return answer, rest, list(app.calls)
        finally:
            await server.stop(1.0)

    answer, rest, calls = run(main())
    assert answer.status == 200 and answer.body == b"ok" and rest == b""
    assert calls == ["/close"]  # /a and /b were framed, never run


def test_a_client_gone_with_requests_pipelined_ends_the_one_running_and_runs_no_other():
    async def main():
        app = _streaming_app(1, 1)
        server = await _front(app)
        try:
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(request("GET", "/hold") + request("GET", "/a"))
            await until(lambda: app.calls == ["/hold"] and server.stats()["queued"] == 2,
                        "the first running, the second queued behind it")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            await until(lambda: app.ended == "http.disconnect", "the app told")
            await until(lambda: server.stats()["reserved"] == 0 and not server.exchanges.lines,
                        "the slot free")
            return list(app.calls)
        finally:
            await server.stop(1.0)

    assert run(main()) == ["/hold"]


def test_http_1_0_and_any_method_but_connect_are_handed_over_whole_and_answered_alike():
    cases = [
        request("GET", "/v2/health/live", version="1.0"),  # closes after its answer
        request("GET", "/v2/models/square", headers={"connection": "keep-alive"},
                version="1.0") + request("HEAD", "/v2/health/ready", version="1.0"),
        request("OPTIONS", "/v2") + request("DELETE", "/v2/models/square")
        + request("PUT", "/v2/models/square/infer", b"{}") + request("HEAD", "/v2/health/ready"),
        request("GET", "/v2/models/square?x=%41", version="1.0").replace(b"host: 127.0.0.1\r\n",
                                                                         b""),
    ]

    python, front, stats = both_servers(cases)
    assert front == python
    # the PUT's answer closes (its body unread): the HEAD after it is never answered
    assert [g.count(b"HTTP/1.1 ") for g in python] == [1, 2, 3, 1]
    assert stats["streamed"] == 0 and stats["requests"] >= 7, stats


def test_a_body_past_the_read_buffer_is_framed_whole_and_learnt_as_a_plan():
    big = [float(i % 97) for i in range(40_000)]  # 160 KB of tensor: past a 64 KB read

    async def main(front: bool):
        async with Served(front=front) as s:
            r, w = await s.connect()
            got = []
            for _ in range(3):
                w.write(binary(big))
                a = await read_response(r)
                got.append((a.status, a.body))
            w.close()
            return got, (s.server.stats() if front else {})

    python, _ = run(main(False))
    front, stats = run(main(True))
    assert front == python and [status for status, _ in python] == [200] * 3
    assert struct.unpack("<3f", python[0][1][-12:]) == tuple(float(x * x) for x in big[-3:])
    # the first teaches the plan (handed over whole), the rest are queued by the front
    assert stats["requests"] == 1 and stats["fast"] == 2 and stats["streamed"] == 0, stats
