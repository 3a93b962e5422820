"""The native front against broken and bent requests: whatever a client sends, the answer
is the Python server's, byte for byte (bytes on real sockets, a fixed seed, no Ray).

The front queues a request itself only when it is whole, plain and byte for byte one the
Python server answered before; anything else goes to the Python server. These tests hold
that line: random byte mutations of queued requests, and a list of heads bent the ways
request smuggling and lax parsers use, each sent on its own connection with a half-close,
everything the server sends back compared.
"""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from deployments.http.native.front import available
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.served import Served, read_response
from tests.unit.deployments.http.test_front import _learnt, binary, json_infer

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")


def _mutants(rng: random.Random, n: int) -> list[bytes]:
    """Requests the front queues, broken a byte at a time (a fixed seed)."""
    bases = [binary([1.5, -2.0]), json_infer(random.Random(1)), binary([1.0, 2.0], close=True)]
    junk = [b"\r", b"\n", b"\r\n", b" ", b"\t", b"\x00", b":", b"\x7f", b"\xff", b"0", b"9",
            b",", b"]", b"[", b'"', b"-", b"e", b"content-length: 3\r\n", b"host: b\r\n",
            b"transfer-encoding: chunked\r\n", b"connection: close\r\n",
            b"expect: 100-continue\r\n"]
    out = []
    for _ in range(n):
        raw = bytearray(rng.choice(bases))
        for _ in range(rng.choice([1, 1, 2, 3])):
            at = rng.randrange(len(raw) + 1)
            how = rng.randrange(6)
            if how == 4:  # what stays valid: a header's case, a header more, a digit
                raw = bytearray(bytes(raw).replace(b"host:", b"HoSt:", 1))
                raw[raw.index(b"\r\n") + 2:raw.index(b"\r\n") + 2] = b"x-extra:  v \r\n"
            elif how == 5 and at < len(raw) and raw[at:at + 1].isdigit():
                raw[at] = ord(rng.choice("0123456789"))
            elif how == 0 and at < len(raw):
                raw[at] = rng.randrange(256)
            elif how == 1:
                raw[at:at] = rng.choice(junk)
            elif how == 2:
                del raw[at:at + rng.randrange(1, 8)]
            else:
                raw[at:at] = raw[max(0, at - 20):at]
        out.append(bytes(raw))
    return out


async def _raw_exchanges(front: bool, raws: list[bytes]) -> list[bytes]:
    """Each input on a connection of its own, the client half-closing after it: every byte
    the server sends until it closes."""
    async with Served(front=front, max_body_bytes=4096) as s:
        await asyncio.to_thread(_learnt, s)
        warm_r, warm_w = await s.connect()
        for raw in (json_infer(random.Random(1)), binary([1.0, 2.0], close=True)):
            warm_w.write(raw)
            await read_response(warm_r)
        warm_w.close()

        async def one(raw: bytes) -> bytes:
            r, w = await s.connect()
            w.write(raw)
            w.write_eof()
            try:
                return await asyncio.wait_for(r.read(), 10)
            finally:
                w.close()

        out = []
        for i in range(0, len(raws), 16):
            out += await asyncio.gather(*(one(raw) for raw in raws[i:i + 16]))
        return out


def test_broken_requests_get_the_python_servers_answers_byte_for_byte():
    raws = _mutants(random.Random(7), 600)
    python = run(_raw_exchanges(False, raws), 60)
    front = run(_raw_exchanges(True, raws), 60)
    differ = [(raw, p, f) for raw, p, f in zip(raws, python, front) if p != f]
    assert not differ, differ[:3]
    statuses = {p[9:12] for p in python if p}
    assert {b"200", b"400"} <= statuses, statuses


def _variants() -> list[bytes]:
    """A queued request's head bent the ways request smuggling and lax parsers use."""
    good = binary([1.5, -2.0])
    head, body = good.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    line, fields = lines[0], lines[1:]

    def made(first: bytes = line, more: list | None = None, sep: bytes = b"\r\n") -> bytes:
        return sep.join([first, *(fields if more is None else more)]) + sep + sep + body

    cl = next(f for f in fields if f.startswith(b"content-length"))
    others = [f for f in fields if f is not cl]
    out = [made(sep=b"\n"), made(more=[f.replace(b": ", b":\t ") for f in fields])]
    for bad in (b"\x00", b"\r", b"\n", b"\x0b", b"\x1f", b"\x7f", b"\xff"):
        out.append(made(more=[*others, cl + bad]))
        out.append(made(more=[b"x-y: a" + bad + b"b", *fields]))
    out += [
        made(more=[*fields, b" folded"]), made(more=[*others, cl.replace(b":", b" :")]),
        made(more=[*fields, cl]), made(more=[*others, cl.replace(b": ", b": +")]),
        made(more=[*others, cl.replace(b": ", b": 00")]),
        made(more=[*others, cl.replace(b": ", b": ") + b" , 5"]),
        made(more=[*fields, b"transfer-encoding: chunked"]),
        made(more=[f for f in fields if not f.startswith(b"host")]),
        made(more=[*fields, b"host: other"]), made(line.replace(b"HTTP/1.1", b"HTTP/1.0")),
        made(line.replace(b"POST", b"post")), made(line.replace(b"POST ", b"POST  ")),
        made(line.replace(b" /v2", b" http://a/v2")), made(line.replace(b"infer", b"infer?x=1")),
        made(line.replace(b"square", b"squ%61re")), made(line.replace(b"infer", b"infer/")),
        made(line + b" "), made(more=[*fields, b"connection: upgrade", b"upgrade: h2c"]),
        made(more=[*fields, b"expect: 100-continue"]),
        made(more=[*fields, b"content-encoding: gzip"]),
        made(more=[*fields, b"connection: keep-alive, close"]),
        made(more=[*fields, b"CONNECTION: Close"]), made(more=[*fields, b"bad name: x"]),
        made(more=[*fields, b": empty name"]),
        made(more=[*(f.replace(b"inference-header-content-length: ",
                               b"inference-header-content-length: 1") for f in fields)]),
    ]
    return out


def test_bent_heads_get_the_python_servers_answers_byte_for_byte():
    raws = _variants()
    python = run(_raw_exchanges(False, raws), 60)
    front = run(_raw_exchanges(True, raws), 60)
    differ = [(raw, p, f) for raw, p, f in zip(raws, python, front) if p != f]
    assert not differ, differ[:3]
    assert sum(p.startswith(b"HTTP/1.1 200") for p in python) >= 3


def test_clients_that_vanish_mid_anything_leave_the_others_their_own_answers():
    """Honest clients beside ones that reset, half-close, stop mid-head or mid-body, or
    pipeline and leave, all at once (a fixed seed): every honest answer is its own, the
    front keeps serving, and nothing stays held. The run is counted, not timed: each
    honest client sends its requests until it has had HONEST answers and the rogues have
    left ROGUE times in all; the rogues go on until every honest client is done."""
    honest_n, rogue_n = 200, 800
    rng = random.Random(11)

    async def main():
        async with Served(front=True) as s:
            await asyncio.to_thread(_learnt, s)
            left, finished = [0], asyncio.Event()

            async def honest(i: int) -> int:
                r, w = await s.connect()
                done = 0
                while done < honest_n or left[0] < rogue_n:
                    w.write(binary([float(i), float(done % 7)]))
                    a = await read_response(r)
                    assert struct.unpack("<2f", a.body[-8:]) == (i * i, (done % 7) ** 2)
                    done += 1
                w.close()
                return done

            async def rogue(seed: int) -> None:
                r_ng = random.Random(seed)
                while not finished.is_set():
                    r, w = await s.connect()
                    raw = binary([1.0, 2.0]) * r_ng.randrange(1, 6)
                    cut = r_ng.randrange(len(raw) + 1)
                    w.write(raw[:cut])
                    await asyncio.sleep(r_ng.random() * 0.01)
                    how = r_ng.randrange(3)
                    if how == 0:
                        w.transport.abort()  # a reset, whatever was under way
                    elif how == 1:
                        w.write_eof()
                        await asyncio.wait_for(r.read(), 30)  # bounds the wait only
                        w.close()
                    else:
                        w.close()
                    left[0] += 1

            rogues = [asyncio.ensure_future(rogue(rng.randrange(10**6))) for _ in range(8)]
            done = await asyncio.gather(*(honest(i) for i in range(8)))
            finished.set()
            await asyncio.gather(*rogues)

            def held() -> dict:
                """What the server still holds: with every client gone, once all of it is
                zero nothing can come back (a request read from a closed connection's last
                bytes counts as a connection, then as in flight, until it is answered)."""
                stats = s.server.stats()
                keys = ("connections", "reserved", "queued", "unsent_bytes", "unparsed_bytes")
                return {**{k: stats[k] for k in keys}, "python connections":
                        len(s.server.connections), "in flight": s.app.inflight}

            await until(lambda: not any(held().values()),
                        "nothing held once every client is gone", 30)
            return done, left[0], held()

    done, left, still = run(main(), 120)
    assert all(n >= honest_n for n in done) and left >= rogue_n, (done, left)
    assert not any(still.values()), still
