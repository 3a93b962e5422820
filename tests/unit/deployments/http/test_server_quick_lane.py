"""Raybatch's own HTTP server: the quick lane (`OipApp.quick`: infer requests answered from
the engine's callback, byte for byte as the ASGI app answers them), over real sockets."""

from __future__ import annotations

import asyncio
import socket
import struct

from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.fakes import infer_body
from tests.unit.deployments.http.served import INFER, Served, read_response, request


# -- the quick lane (`OipApp.quick`): infer requests answered from the engine's callback ---
def _lane_cases() -> list[bytes]:
    """Infer requests, good and bad, whose answers must not depend on the lane."""
    binary = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],' \
        b'"parameters":{"binary_data_size":8}}],"parameters":{"binary_data_output":true}}'
    return [
        request("POST", INFER, infer_body([3.0])),
        request("POST", INFER, binary + b"\x00\x00\x80\x3f\x00\x00\x00\x40",
                {"inference-header-content-length": str(len(binary))}),
        request("POST", INFER, b'{"inputs": [{"name": "nope"}]}'),
        request("POST", INFER, b"{not json"),
        request("POST", "/v2/models/square/versions/1/infer", infer_body([2.0])),
        request("POST", "/v2/models/square/versions/7/infer", infer_body([2.0])),
        request("POST", "/v2/models/ghost/infer", infer_body([2.0])),
        request("POST", "/v2/models/words/infer", infer_body([2.0])),
        request("POST", INFER, infer_body([1.0] * 100)),  # past max_body_bytes: 413
        request("POST", INFER, b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", '
                b'"shape": [1], "data": [NaN]}]}'),
        request("GET", INFER),  # 405
    ]


async def _raw_answers(quick: bool, raws: list[bytes]) -> list[bytes]:
    async with Served(quick, max_body_bytes=300) as s:
        out = []
        for raw in raws:
            r, w = await s.connect()
            w.write(raw)
            answer = await read_response(r)
            out.append((answer.status, sorted(answer.headers.items()), answer.body))
            w.close()
        return out


def test_the_quick_lane_answers_byte_for_byte_as_the_asgi_app():
    """Same status, headers and body; only `connection: close` differs: the ASGI app
    closes after an error that left the body unread, the quick lane has read it all."""
    raws = _lane_cases()
    quick, asgi = run(_raw_answers(True, raws)), run(_raw_answers(False, raws))

    def kept(answers):
        return [(st, [h for h in hs if h[0] != "connection"], b) for st, hs, b in answers]

    assert kept(quick) == kept(asgi)
    assert not any(("connection", "close") in hs for st, hs, b in quick if st not in (405, 413))
    assert [a[0] for a in quick] == [200, 200, 400, 400, 200, 404, 404, 400, 413, 400, 405]


def test_a_client_that_hangs_up_cancels_its_quick_lane_request():
    async def main():
        async with Served() as s:
            s.backend.step.clear()  # the engine holds every request
            _r, w = await s.connect()
            w.write(request("POST", INFER, infer_body([8.0])))
            await until(lambda: s.app.inflight, "the request in flight", 30)
            held = s.app.inflight
            sock = w.get_extra_info("socket")  # a reset, not a half-close (FIN): a client
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()  # that only half-closes still gets its answer
            await until(lambda: s.backend.cancelled, "the request cancelled", 30)
            s.backend.step.set()
            after = await s.one(request("POST", INFER, infer_body([3.0])))
            return held, s.backend.cancelled, s.app.inflight, s.app.counts, after

    held, cancelled, inflight, counts, after = run(main(), 60)
    assert (held, cancelled, inflight) == (1, 1, 0)
    assert counts[("/v2/models/{model}/infer", 499)] == 1
    assert after.json()["outputs"][0]["data"] == [9.0]


def test_quick_and_asgi_requests_pipelined_on_one_connection_keep_their_order():
    async def main():
        async with Served() as s:
            s.backend.step.clear()
            r, w = await s.connect()
            w.write(request("POST", INFER, infer_body([1.0])) + request("GET", "/v2/health/live")
                    + request("POST", INFER, infer_body([2.0]))
                    + request("POST", "/v2/models/words/generate", b'{"text_input": "x"}')
                    + request("POST", INFER, infer_body([3.0])))
            await asyncio.sleep(0.05)
            early = r._buffer[:]  # nothing may overtake the held first request
            s.backend.step.set()
            out = [await read_response(r) for _ in range(5)]
            w.close()
            return bytes(early), out

    early, out = run(main())
    assert early == b""
    assert [o.status for o in out] == [200] * 5
    assert [out[i].json()["outputs"][0]["data"] for i in (0, 2, 4)] == [[1.0], [4.0], [9.0]]
    assert out[3].json()["text_output"] == "w0 w1 w2 "


def test_a_slow_body_leaves_the_quick_lane_and_gets_the_stall_timeout():
    """A body still arriving after the server's one-second sweep goes to the ASGI app,
    whose body reader answers 408 when it stalls; a whole one sent in pieces is quick."""
    async def main():
        async with Served(body_timeout_s=0.5) as s:
            r, w = await s.connect()
            raw = request("POST", INFER, infer_body([4.0]))
            w.write(raw[:-5])  # the last bytes never come
            stalled = await asyncio.wait_for(read_response(r), 10)
            w.close()
            return stalled, s.app.inflight

    stalled, inflight = run(main(), 30)
    assert stalled.status == 408 and "stalled" in stalled.json()["error"]
    assert inflight == 0


def test_the_quick_lane_leaves_draining_and_full_to_the_asgi_app():
    async def main():
        async with Served(max_inflight_requests=1) as s:
            s.backend.step.clear()
            r1, w1 = await s.connect()
            w1.write(request("POST", INFER, infer_body([2.0])))
            await until(lambda: s.app.inflight, "the first request in flight", 30)
            full = await s.one(request("POST", INFER, infer_body([3.0])))
            s.backend.step.set()
            first = await read_response(r1)
            s.app.begin_drain()
            draining = await s.one(request("POST", INFER, infer_body([3.0])))
            w1.close()
            return full, first, draining

    full, first, draining = run(main(), 60)
    assert full.status == 503 and "limit" in full.json()["error"]
    assert first.json()["outputs"][0]["data"] == [4.0]
    assert draining.status == 503 and draining.headers["connection"] == "close"
