"""The native front (`deployments.http.native.front`): its answers are the Python server's, byte
for byte, and it holds the same bounds, over real sockets (no Ray).

The differential test sends the same random streams of requests (a fixed seed: binary and
JSON infer requests the front queues itself, with numbers spelled every way JSON allows,
values out of range, wrong counts, other routes, bad JSON, closes) over several
connections at once to the Python server alone and to the front, and compares every
answer; the rest pin what the front decides itself: when a connection goes to the
Python server, what a client that never reads may make it hold, slow requests,
keep-alive, draining, stopping.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time

import pytest

from deployments.http.native.front import available
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.served import INFER, Served, read_response, request

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

ECHO = "/v2/models/echo/infer"
INFER_TEMPLATE = "/v2/models/{model}/infer"


def binary(values: list[float], path: str = INFER, datatype: str = "FP32",
           cols: int | None = None, binary_out: bool = True, close: bool = False) -> bytes:
    fmt = f"<{len(values)}{'f' if datatype == 'FP32' else 'd'}"
    data = struct.pack(fmt, *values)
    shape = [len(values)] if cols is None else [len(values) // cols, cols]
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": binary_out}}).encode()
    headers = {"inference-header-content-length": str(len(header))}
    if close:
        headers["connection"] = "close"
    return request("POST", path, header + data, headers)


def spelled(rng: random.Random, x: float) -> str:
    """A number as a client might write it in JSON."""
    style = rng.randrange(6)
    if style == 0:
        return repr(float(x))
    if style == 1:
        return str(int(x))
    if style == 2:
        return f"{x:.3e}"
    if style == 3:
        return f"{x:.9g}"
    if style == 4:
        return f"{int(x)}E+0{rng.randrange(3)}" if x >= 0 else "-0"
    return rng.choice(["-0", "0", "1e-45", "3.4028234e38", "1e39", "12345678901234567890",
                       "0.1", "-2.5E-3", "7"])


def json_infer(rng: random.Random, path: str = INFER, close: bool = False) -> bytes:
    n = rng.choice([1, 2, 2, 3])
    values = [spelled(rng, rng.uniform(-100, 100)) for _ in range(n)]
    shape = n if rng.random() > 0.05 else n + 1  # a wrong count now and then: 400
    space = rng.choice(["", " ", "\n  "])
    sep = "," + rng.choice(["", " ", "\t"])
    body = ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[' + str(shape)
            + '],"data":[' + space + sep.join(values) + space + "]}]}")
    if path == ECHO:
        pairs = [spelled(rng, rng.uniform(-5, 5)) for _ in range(2 * n)]
        body = ('{"inputs":[{"name":"INPUT0","datatype":"FP64","shape":[' + str(n)
                + ',2],"data":[' + ",".join(pairs) + "]}]}")
    return request("POST", path, body.encode(), {"connection": "close"} if close else None)


def stream(rng: random.Random) -> list[bytes]:
    """One connection's requests: mostly what the front queues, some of everything else."""
    out = []
    for _ in range(rng.randrange(5, 25)):
        kind = rng.random()
        if kind < 0.35:
            vals = [rng.choice([rng.uniform(-1e3, 1e3), 0.0, -0.0, float("inf"), 1e-40])
                    for _ in range(2)]
            out.append(binary(vals))
        elif kind < 0.65:
            out.append(json_infer(rng))
        elif kind < 0.72:
            out.append(json_infer(rng, ECHO))
        elif kind < 0.78:  # FP64 pairs answered as JSON: NaN in one request's rows is its 400
            vals = [rng.choice([1.5, -2.0, float("nan")]) for _ in range(4)]
            out.append(binary(vals, ECHO, "FP64", cols=2, binary_out=False))
        elif kind < 0.84:
            out.append(request("GET", "/v2/models/square"))
        elif kind < 0.88:
            out.append(request("POST", INFER, b'{"inputs": [{"name": "INPUT0", "datatype": '
                               b'"FP32", "shape": [1], "data": [true]}]}'))
        elif kind < 0.92:
            out.append(request("POST", INFER, b"{"))
        else:
            out.append(binary([rng.uniform(0, 9)] * 3))  # another header: learnt too
    if rng.random() < 0.3:
        out.append(json_infer(rng, close=True))
    return out


async def _answers(front: bool, streams: list[list[bytes]], pipelined: bool) -> list:
    """Each stream on a connection of its own, all at once: first one request at a time,
    then (`pipelined`) again each stream in one write, once the front has learnt."""
    async with Served(front=front, max_body_bytes=4096) as s:
        async def one(reqs: list[bytes], pipelined: bool) -> list:
            r, w = await s.connect()
            got = []
            try:
                if pipelined:
                    w.write(b"".join(reqs))
                for raw in reqs:
                    if not pipelined:
                        w.write(raw)
                    try:
                        a = await read_response(r)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        break
                    got.append((a.status, list(a.headers.items()), a.body))
                    if a.headers.get("connection") == "close":
                        break
            finally:
                w.close()
            return got

        got = await asyncio.gather(*(one(reqs, False) for reqs in streams))
        if pipelined:
            got += await asyncio.gather(*(one(reqs, True) for reqs in streams))
        return got, (s.server.stats() if front else {})


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-by-one", "pipelined"])
def test_the_front_answers_byte_for_byte_as_the_python_server(pipelined):
    rng = random.Random(20261126)
    streams = [stream(rng) for _ in range(24)]
    python, _ = run(_answers(False, streams, pipelined), 60)
    front, stats = run(_answers(True, streams, pipelined), 60)
    assert sum(map(len, python)) > 300
    for i, (want, got) in enumerate(zip(python, front)):
        assert got == want, (i, next(((j, w, g) for j, (w, g) in enumerate(zip(want, got))
                                      if w != g), None))
    statuses = {a[0] for conn in python for a in conn}
    assert {200, 400} <= statuses
    # the front queued most of it itself and handed the rest to Python whole: every stream
    # is well-formed, so none was refused as it was read, nor streamed
    assert stats["fast"] > 100 and stats["requests"] > 24 and stats["plans"] >= 3, stats
    assert stats["refusals"] == 0 and stats["streamed"] == 0, stats


def test_many_clients_at_once_each_get_their_own_answer():
    async def main():
        async with Served(front=True) as s:
            async def client(i: int) -> bool:
                r, w = await s.connect()
                ok = True
                for j in range(30):
                    w.write(binary([float(i), float(j)]))
                    a = await read_response(r)
                    ok &= struct.unpack("<2f", a.body[-8:]) == (i * i, j * j)
                w.close()
                return ok
            return await asyncio.gather(*(client(i) for i in range(40))), s.server.stats()

    oks, stats = run(main(), 30)
    assert all(oks) and stats["fast"] >= 40 * 29 - 40, stats


def _learnt(s: Served) -> None:
    sock = socket.create_connection(("127.0.0.1", s.server.port))
    sock.sendall(binary([1.0, 1.0]))
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()


def test_a_client_that_never_reads_is_held_to_the_bounds():
    """Queued requests pushed by a client that reads nothing: the front stops reading it
    once its answers back up; what it holds stays bounded however much is pushed (the push
    ends once its counts say so: unsent answers past its mark, none still to come)."""
    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            sock = socket.create_connection(("127.0.0.1", s.server.port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            block = binary([2.0, 3.0]) * 200
            mark = s.server.max_unsent_bytes

            def stopped_reading() -> dict | None:
                stats = s.server.stats()
                return stats if stats["unsent_bytes"] > mark and stats["queued"] == 0 else None

            pushed, stats, give_up = 0, None, time.monotonic() + 60  # bounds a stuck one
            while pushed < 64 * 2**20 and stats is None:
                try:
                    pushed += sock.send(block[pushed % len(block):])
                except BlockingIOError:  # full: because the front stopped, or is behind?
                    stats = stopped_reading()
                    if stats is None:
                        if time.monotonic() > give_up:
                            pytest.fail(f"the front did not stop reading in 60 s "
                                        f"({pushed} bytes taken): {s.server.stats()}")
                        await asyncio.sleep(0.01)
            stats = stats or s.server.stats()
            sock.close()
            return pushed, stats, mark, s.server.max_pipelined

    pushed, stats, unsent, pipelined = run(main(), 120)
    assert pushed < 64 * 2**20, (pushed, stats)  # it stopped reading
    assert unsent < stats["unsent_bytes"] <= unsent + 64 * 2**10, stats
    # unparsed: a head and a body at their limits (40 KiB + 64 KiB), and one read
    assert stats["unparsed_bytes"] <= 40 * 2**10 + 64 * 2**10 + 64 * 2**10, stats
    assert stats["queued"] <= pipelined and stats["refusals"] == 0, stats


def test_a_slow_head_is_waited_for_and_a_slow_body_streamed_to_the_app():
    """A head arriving slowly is answered once whole, refused (408, the Python server's
    words) past header_timeout_s; a body arriving slowly (past 0.5 s) is streamed to the
    app as it comes, whose body timeouts apply."""
    async def main():
        s = Served(front=True)
        s.server.header_timeout_s = 3.0
        async with s:
            await asyncio.to_thread(_learnt, s)
            raw = binary([2.0, 2.0])
            got = []
            for cut in (20, len(raw) - 4):  # in the head, then in the body
                r, w = await s.connect()
                w.write(raw[:cut])
                await asyncio.sleep(0.8)  # past 0.5 s; no bound on anything
                w.write(raw[cut:])
                got.append(await read_response(r))
                got.append(s.server.stats())
                w.close()
            r, w = await s.connect()
            w.write(raw[:20])  # and never the rest
            late = await read_response(r)
            return got, late, await r.read()

    (head, after_head, body, after_body), late, rest = run(main(), 120)
    for answer in (head, body):
        assert answer.status == 200 and struct.unpack("<2f", answer.body[-8:]) == (4.0, 4.0)
    # (the plan was taught by a request Python answered: the slow head is its first)
    assert after_head["streamed"] == 0 and after_head["fast"] == 1, after_head
    assert after_body["streamed"] == 1 and after_body["fast"] == 1, after_body
    assert late.status == 408 and late.headers["connection"] == "close" and rest == b""
    assert "(ingress.header_timeout_s)" in late.json()["error"]


def test_idle_connections_are_closed_after_keep_alive():
    async def main():
        async with Served(front=True) as s:
            pass
        s.server.keep_alive_s = 0.3
        async with s:
            await asyncio.to_thread(_learnt, s)
            r, w = await s.connect()
            w.write(binary([1.0, 2.0]))
            await read_response(r)
            return await asyncio.wait_for(r.read(), 30)  # bounds the wait only

    assert run(main(), 60) == b""


def test_draining_refuses_as_the_python_server_and_closes():
    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            s.app.begin_drain()
            r, w = await s.connect()
            w.write(binary([1.0, 2.0]) * 2)
            first = await read_response(r)
            rest = await asyncio.wait_for(r.read(), 5)
            return first, rest

    first, rest = run(main())
    assert first.status == 503 and first.headers["connection"] == "close"
    assert "shutting down" in first.json()["error"] and rest == b""


def test_stop_answers_what_is_queued_and_closes_the_rest():
    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            s.backend.step.clear()
            r, w = await s.connect()
            w.write(binary([3.0, 3.0]))
            idle_r, _ = await s.connect()
            # the request is with the engine and the idle connection the front's
            await until(lambda: s.app.inflight == 1 and s.server.stats()["accepted"] == 3,
                        "the request in flight, the idle connection accepted", 30)
            stopping = asyncio.ensure_future(s.server.stop(30))
            idle = await asyncio.wait_for(idle_r.read(), 30)
            s.backend.step.set()
            answer = await read_response(r)
            await stopping
            with pytest.raises(OSError):
                await s.connect()
            return idle, answer

    idle, answer = run(main(), 120)
    assert idle == b"" and struct.unpack("<2f", answer.body[-8:]) == (9.0, 9.0)


def test_a_client_gone_before_its_answer_leaves_the_others_theirs():
    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            s.backend.step.clear()
            _, gone_w = await s.connect()
            gone_w.write(binary([5.0, 5.0]))
            r, w = await s.connect()
            w.write(binary([2.0, 1.0]))
            await until(lambda: s.app.inflight == 2, "both requests in flight", 30)
            gone_w.get_extra_info("socket").setsockopt(  # a reset, not a polite close
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            gone_w.transport.abort()
            await until(lambda: s.server.stats()["connections"] == 1,
                        "the front saw the client go", 30)
            s.backend.step.set()
            answer = await read_response(r)
            w.write(binary([4.0, 1.0]))
            again = await read_response(r)
            return answer, again, s.app.inflight

    answer, again, inflight = run(main(), 60)
    assert struct.unpack("<2f", answer.body[-8:]) == (4.0, 1.0)
    assert struct.unpack("<2f", again.body[-8:]) == (16.0, 1.0) and inflight == 0


def test_the_python_server_sees_each_clients_address():
    """Event streams are counted per client address (ingress.max_streams_per_client)."""
    async def main():
        async with Served(front=True) as s:
            seen = []
            s.app.backend.step.set()
            original = s.app.direct

            async def spy(scope, receive, send):
                seen.append((scope["client"], scope["server"]))
                return await original(scope, receive, send)

            s.server.app = spy
            r, w = await s.connect()
            w.write(request("GET", "/v2/health/live"))
            await read_response(r)
            port = w.get_extra_info("sockname")[1]
            w.close()
            return seen, port, s.server.port

    seen, port, server_port = run(main())
    assert seen == [(("127.0.0.1", port), ("127.0.0.1", server_port))]


def test_requests_past_max_inflight_get_503_as_from_the_python_server():
    async def main():
        async with Served(front=True, max_inflight_requests=4) as s:
            await asyncio.to_thread(_learnt, s)
            s.backend.step.clear()
            conns = [await s.connect() for _ in range(6)]
            for i, (_, w) in enumerate(conns):
                w.write(binary([float(i), 1.0]))
            await until(lambda: s.app.counts.get((INFER_TEMPLATE, 503), 0) == 2
                        and s.app.inflight == 4, "all six taken: four run, two refused", 30)
            s.backend.step.set()
            answers = [await read_response(r) for r, _ in conns]
            return answers, s.app.inflight

    answers, inflight = run(main(), 60)
    assert sorted(a.status for a in answers) == [200] * 4 + [503] * 2 and inflight == 0
    for i, a in enumerate(answers):
        if a.status == 200:
            assert struct.unpack("<2f", a.body[-8:]) == (i * i, 1.0)
        else:
            assert a.headers["connection"] == "close" and "limit" in a.json()["error"]


def test_a_model_that_takes_fewer_items_a_request_gets_smaller_blocks():
    from deployments.protocol import PayloadTooLarge

    async def main():
        async with Served(front=True) as s:
            submit = s.backend.submit_infer
            sizes = []

            def limited(model, request, received_s=None, requests=1):
                sizes.append(request.batch_size)
                if request.batch_size > 4:  # as limits.max_request_items: 4 would say
                    raise PayloadTooLarge("the request carries too many items")
                return submit(model, request, received_s, requests)

            s.app._submit = limited
            await asyncio.to_thread(_learnt, s)
            r, w = await s.connect()
            w.write(b"".join(binary([float(i), 2.0]) for i in range(8)))
            answers = [await read_response(r) for _ in range(8)]
            return answers, sizes

    answers, sizes = run(main())
    assert [struct.unpack("<2f", a.body[-8:]) for a in answers] == \
        [(i * i, 4.0) for i in range(8)]
    # refused twice at most (16 rows, then 8), then blocks that fit
    assert sum(n > 4 for n in sizes) <= 2 and sizes[-1] <= 4, sizes


def test_a_failure_on_the_way_to_the_engine_is_each_requests_500_not_silence(monkeypatch):
    from deployments.http.native.blocks import Blocks

    def broken(self, plan, rec, data):
        raise RuntimeError("a bug between the front and the engine")

    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            monkeypatch.setattr(Blocks, "_block", broken)
            r, w = await s.connect()
            w.write(binary([1.0, 2.0]) * 3)
            answers = [await read_response(r) for _ in range(3)]
            monkeypatch.undo()
            w.write(binary([3.0, 2.0]))
            after = await read_response(r)
            return answers, after

    answers, after = run(main())
    assert [a.status for a in answers] == [500] * 3
    assert all(set(a.json()) == {"error"} for a in answers)
    assert struct.unpack("<2f", after.body[-8:]) == (9.0, 4.0)
