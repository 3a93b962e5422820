"""Raybatch's own HTTP/1.1 server (`deployments.http.pyserver.server`) with the real OipApp and a
fake backend, over real sockets on 127.0.0.1 (no Ray): keep-alive, pipelining, bodies in
pieces and chunked, 100-continue, limits, SSE and hang-ups, errors, idle sweeps, stop,
many clients at once, and fuzz (fixed seeds) at the byte level and the OIP level."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from deployments.http.pyserver.cycle import READ_BUFFER_BYTES
from deployments.http.pyserver.server import HttpServer
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.fakes import infer_body, make_app
from tests.unit.deployments.http.fuzz_cases import Target, cases, check
from tests.unit.deployments.http.served import INFER, Served, read_response, request


def test_infer_and_health_on_one_kept_alive_connection():
    async def main():
        async with Served() as s:
            r, w = await s.connect()
            w.write(request("POST", INFER, infer_body([3.0])))
            first = await read_response(r)
            w.write(request("GET", "/v2/health/ready"))
            second = await read_response(r)
            w.write(request("POST", INFER, infer_body([4.0])))
            third = await read_response(r)
            w.close()
            return first, second, third, len(s.server.connections)

    first, second, third, conns = run(main())
    assert first.status == 200 and first.json()["outputs"][0]["data"] == [9.0]
    assert "connection" not in first.headers and first.headers["content-type"] == \
        "application/json"
    assert second.status == 200
    assert third.json()["outputs"][0]["data"] == [16.0] and conns == 1


def test_the_routes_answer_under_the_route_prefix_and_without_it():
    async def main():
        app, _ = make_app()
        server = HttpServer(app.direct, port=0, reuse_port=False, route_prefix="/rb/")
        await server.start()
        try:
            out = []
            for path in ("/rb" + INFER, INFER, "/other" + INFER):
                r, w = await asyncio.open_connection("127.0.0.1", server.port)
                w.write(request("POST", path, infer_body([2.0])))
                out.append((await read_response(r)).status)
                w.close()
            return out
        finally:
            await server.stop(1)

    assert run(main()) == [200, 200, 404]


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_pipelined_requests_are_answered_in_order(quick):
    async def main():
        async with Served(quick) as s:
            r, w = await s.connect()
            w.write(b"".join(request("POST", INFER, infer_body([float(i)])) for i in range(5))
                    + request("GET", "/v2/models/nope"))
            out = [await read_response(r) for _ in range(6)]
            w.close()
            return out

    out = run(main())
    assert [o.json()["outputs"][0]["data"] for o in out[:5]] == [[0.0], [1.0], [4.0], [9.0],
                                                                 [16.0]]
    assert out[5].status == 404 and "nope" in out[5].json()["error"]


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_a_body_in_pieces_and_a_chunked_body(quick):
    async def main():
        async with Served(quick) as s:
            r, w = await s.connect()
            raw = request("POST", INFER, infer_body([5.0]))
            for i in range(0, len(raw), 7):  # 7 bytes a write, each its own packet
                w.write(raw[i:i + 7])
                await w.drain()
                await asyncio.sleep(0)
            first = await read_response(r)
            body = infer_body([6.0])
            chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:]))
            w.write(request("POST", INFER, headers={"transfer-encoding": "chunked"})
                    + chunked + b"0\r\n\r\n")
            second = await read_response(r)
            w.close()
            return first, second

    first, second = run(main())
    assert first.json()["outputs"][0]["data"] == [25.0]
    assert second.json()["outputs"][0]["data"] == [36.0]


def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async def main():
        async with Served() as s:
            r, w = await s.connect()
            body = infer_body([7.0])
            w.write(request("POST", INFER, headers={"content-length": str(len(body)),
                                                    "expect": "100-continue"}))
            interim = await asyncio.wait_for(read_response(r), 5)
            w.write(body)
            final = await read_response(r)
            w.close()
            return interim, final

    interim, final = run(main())
    assert interim.status == 100
    assert final.status == 200 and final.json()["outputs"][0]["data"] == [49.0]


@pytest.mark.parametrize("raw, status, words", [
    (request("GET", "/v2/health/ready", headers={"x-big": "a" * 3000}), 431, "headers"),
    (request("GET", "/v2/" + "a" * 3000), 414, "URL"),
    (b"GARBAGE / HTTP/1.1\r\n\r\n", 400, "malformed"),
    (b"GET / HTTP/1.1\r\ncontent-length: x\r\n\r\n", 400, "malformed"),
])
def test_bad_input_gets_an_error_and_the_connection_closes(raw, status, words):
    async def main():
        async with Served(max_header_bytes=2048) as s:
            r, w = await s.connect()
            w.write(raw)
            answer = await read_response(r)
            rest = await asyncio.wait_for(r.read(), 5)  # EOF: the server closed
            w.close()
            ok = await s.one(request("GET", "/v2/health/live"))
            return answer, rest, ok

    answer, rest, ok = run(main())
    assert answer.status == status and words in answer.json()["error"], answer.body
    assert answer.headers["connection"] == "close" and rest == b""
    assert ok.status == 200


def test_an_upgrade_is_answered_in_http_1_1_and_the_connection_closes():
    async def main():
        async with Served() as s:
            r, w = await s.connect()
            w.write(b"GET /v2/health/live HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\n"
                    b"upgrade: websocket\r\n\r\n")
            answer = await read_response(r)
            return answer, await asyncio.wait_for(r.read(), 5)

    answer, rest = run(main())
    assert answer.status == 200 and answer.headers["connection"] == "close" and rest == b""


def test_an_event_stream_is_chunked_and_a_hang_up_ends_its_generation():
    async def main():
        async with Served() as s:
            whole = await s.one(request("POST", "/v2/models/words/generate_stream",
                                        json.dumps({"text_input": "all"}).encode()))
            r, w = await s.connect()
            w.write(request("POST", "/v2/models/words/generate_stream", json.dumps(
                {"text_input": "gone", "parameters": {"max_tokens": 100000}}).encode()))
            line = await r.readline()
            while (await r.readline()) != b"\r\n":
                pass
            first = await r.readline()  # the size of the first chunk
            w.close()  # hang up mid-stream
            await until(lambda: "gone" in s.backend.closed, "the stream closed", 30)
            return whole, line, first, s.backend.closed, s.app.streams

    whole, line, first, closed, streams = run(main(), 60)
    assert whole.headers["transfer-encoding"] == "chunked"
    assert whole.headers["content-type"] == "text/event-stream"
    events = [json.loads(x[6:]) for x in whole.body.split(b"\n\n") if x.startswith(b"data: ")]
    assert [e["text_output"] for e in events] == ["w0 ", "w1 ", "w2 ", ""]
    assert line.startswith(b"HTTP/1.1 200") and int(first, 16) > 0
    assert closed == ["gone"] and streams == {}


def test_http_1_0_gets_its_answer_and_a_closed_connection():
    async def main():
        async with Served() as s:
            r, w = await s.connect()
            w.write(request("GET", "/v2/health/live", version="1.0"))
            answer = await read_response(r)
            rest = await asyncio.wait_for(r.read(), 5)
            return answer, rest

    answer, rest = run(main())
    assert answer.status == 200 and answer.headers["connection"] == "close" and rest == b""


def test_an_app_that_raises_gets_a_500_error_body():
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    async def main():
        server = HttpServer(broken, port=0, reuse_port=False)
        await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(request("GET", "/x"))
            return await read_response(r)
        finally:
            await server.stop(1)

    answer = run(main())
    assert answer.status == 500 and "RuntimeError" in answer.json()["error"]
    assert "boom" not in answer.json()["error"]  # nothing internal reaches the client


def test_a_body_past_the_limit_gets_413_and_reading_pauses_meanwhile():
    async def main():
        async with Served(max_body_bytes=65536) as s:
            declared = await s.one(request("POST", INFER, headers={"content-length": "999999"}))
            s.backend.step.clear()  # the app holds its answer: the body piles up
            r, w = await s.connect()
            w.write(request("POST", INFER, headers={"transfer-encoding": "chunked"}))
            piece = b"%x\r\n%s\r\n" % (8192, b"1" * 8192)
            answer = None
            for _ in range(64):  # 512 KiB offered, never ending
                w.write(piece)
                try:
                    answer = await asyncio.wait_for(read_response(r), 0.02)
                    break
                except asyncio.TimeoutError:
                    pass
            conn = next(iter(s.server.connections), None)
            held = 0 if conn is None else sum(c.buffered for c in conn.cycles)
            rest = await asyncio.wait_for(r.read(), 5)
            s.backend.step.set()
            return declared, answer, held, rest

    declared, answer, held, rest = run(main())
    assert declared.status == 413 and "Content-Length" in declared.json()["error"]
    assert answer is not None and answer.status == 413 and answer.headers["connection"] == "close"
    assert held <= READ_BUFFER_BYTES + 8192 and rest == b""


def test_idle_connections_are_closed_by_the_sweep():
    async def main():
        async with Served() as s:
            s.server.keep_alive_s = 0.0
            r, w = await s.connect()
            w.write(request("GET", "/v2/health/live"))
            answer = await read_response(r)
            s.server._sweep()  # as its timer would, past keep_alive_s
            return answer, await asyncio.wait_for(r.read(), 5), len(s.server.connections)

    answer, rest, left = run(main())
    assert answer.status == 200 and rest == b"" and left == 0


def _open_connections(s: Served) -> int:
    """The server's open connections (behind the front, RAYBATCH_TEST_FRONT=1: its count)."""
    if hasattr(s.server, "front"):
        return s.server.stats()["connections"]
    return len(s.server.connections)


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_stop_finishes_what_is_in_flight_and_accepts_nothing_new(quick):
    async def main():
        async with Served(quick) as s:
            s.backend.step.clear()
            r, w = await s.connect()
            w.write(request("POST", INFER, infer_body([8.0])))
            idle_r, _idle_w = await s.connect()
            # the request is with the engine, the idle connection accepted
            await until(lambda: s.app.inflight == 1 and _open_connections(s) == 2,
                        "the request in flight, the idle connection accepted", 30)
            stopping = asyncio.ensure_future(s.server.stop(30))
            idle_eof = await asyncio.wait_for(idle_r.read(), 30)  # bounds the wait only
            s.backend.step.set()
            answer = await read_response(r)
            await stopping
            try:
                await s.connect()
                refused = False
            except OSError:
                refused = True
            return answer, idle_eof, refused

    answer, idle_eof, refused = run(main(), 60)
    assert answer.json()["outputs"][0]["data"] == [64.0]
    assert idle_eof == b"" and refused


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_many_clients_at_once_each_get_their_own_result(quick):
    async def main():
        async with Served(quick) as s:
            async def client(i: int) -> list[float]:
                r, w = await s.connect()
                got = []
                for k in range(3):
                    w.write(request("POST", INFER, infer_body([float(i * 10 + k)])))
                    got.append((await read_response(r)).json()["outputs"][0]["data"][0])
                w.close()
                return got

            return await asyncio.gather(*(client(i) for i in range(150)))

    results = run(main(), 60)
    assert results == [[float((i * 10 + k) ** 2) for k in range(3)] for i in range(150)]


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_every_malformed_oip_request_gets_a_4xx_error_over_the_socket(quick):
    target = Target(infer_model="square", generate_model="words", max_body_bytes=65536)

    async def main():
        async with Served(quick, max_body_bytes=65536) as s:
            for case in cases(20_261_124, 200, target):
                headers = dict(case.headers)
                raw = request(case.method, case.path, case.body, headers)
                answer = await asyncio.wait_for(s.one(raw), 10)
                check(case, answer.status, answer.headers, answer.body)
            return await s.one(request("POST", INFER, infer_body([2.0])))

    assert run(main(), 120).json()["outputs"][0]["data"] == [4.0]


@pytest.mark.parametrize("quick", [True, False], ids=["quick-lane", "asgi"])
def test_byte_level_fuzz_never_crashes_hangs_or_answers_wrongly(quick):
    """Valid requests with bytes flipped, cut, repeated or inserted (seed fixed): each
    connection gets well-formed responses (a 2xx only with the right answer) or is
    closed, within a bound; the server serves normally after."""
    rng = random.Random(20_261_125)
    valid = [request("POST", INFER, infer_body([3.0])), request("GET", "/v2/health/ready"),
             request("POST", "/v2/models/words/generate", json.dumps(
                 {"text_input": "x"}).encode()), request("GET", "/v2/models/square")]

    def mutate(raw: bytes) -> bytes:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            op, i = rng.random(), rng.randrange(len(b))
            if op < 0.4:
                b[i] = rng.randrange(256)
            elif op < 0.6:
                del b[i:i + rng.randint(1, 20)]
            elif op < 0.8:
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
            else:
                b[i:i] = b[i:i + rng.randint(1, 40)] * rng.randint(1, 3)
        return bytes(b)

    intact = infer_body([3.0])

    async def main():
        statuses = []
        async with Served(quick) as s:
            for _ in range(300):
                raw = mutate(rng.choice(valid))
                r, w = await s.connect()
                w.write(raw)
                w.write_eof()
                try:
                    while True:
                        answer = await asyncio.wait_for(read_response(r), 10)
                        statuses.append(answer.status)
                        if answer.status == 200 and intact in raw:  # the infer body, unharmed
                            assert answer.json()["outputs"][0]["data"] == [9.0], (raw, answer.body)
                        if answer.status >= 400:
                            assert set(answer.json()) == {"error"}
                except (ConnectionResetError, asyncio.IncompleteReadError, ValueError,
                        IndexError):
                    pass  # closed (mid-response, for a request cut short)
                w.close()
            after = await s.one(request("POST", INFER, infer_body([5.0])))
            return statuses, after, s.app.inflight

    statuses, after, inflight = run(main(), 180)
    assert all(code < 500 for code in statuses), sorted(set(statuses))
    assert {200, 400, 404} <= set(statuses), sorted(set(statuses))  # it reaches the app
    assert after.json()["outputs"][0]["data"] == [25.0] and inflight == 0
