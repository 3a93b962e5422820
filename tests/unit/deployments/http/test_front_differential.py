"""Differential fuzzing of the native front against the Python server, with h11 as referee.

The front frames what it serves itself with llhttp, the parser of the Python server; every
other request is the Python server's. So a client must see the same answers from either:
the same number of responses, the same statuses and bodies, the same close. Byte streams
(a fixed seed) are built from requests the front serves itself (binary and JSON infer
requests matching the plans both servers learnt first) and changed where servers disagree:
`Connection` and `Proxy-Connection` options, HTTP/1.0, methods and targets, Host, Content-
Length and Transfer-Encoding spellings, trailing blanks, obs-fold and bare LF, escaped JSON
keys, blank lines before a request, heads and bodies cut short, random corruption; each is
sent in pieces cut at random places. Each stream goes on a connection of its own to the
Python server and to the front; every stream's answers must be equal, and no server may
answer more requests with 200 than h11 frames of the stream.

RAYBATCH_FRONT_FUZZ_STREAMS sets the number of streams (20,000 by default).
"""

from __future__ import annotations

import heapq
import json
import os
import random
import selectors
import socket
import struct
import time

import pytest

from deployments.http.native.front import available
from tests.conftest import wait_until
from tests.unit.deployments.http.test_differential import h11_frames
from tests.unit.deployments.http.wire import ServerThread, exchange, parse_responses

pytestmark = pytest.mark.skipif(not available(), reason="the native front is not compiled "
                                "(needs a C compiler): run `make setup` with gcc installed")

STREAMS = int(os.environ.get("RAYBATCH_FRONT_FUZZ_STREAMS", "20000"))
SEED = 20_261_128
WINDOW = 200  # streams in flight at once, each on a connection of its own
GAP_S = 0.005  # between a stream's pieces
HANG_S = 30.0  # a connection still open this long after its last piece fails the test
SQUARE = b"/v2/models/square/infer"


def _binary_parts(values: list[float]) -> tuple[bytes, bytes]:
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                     "shape": [len(values)],
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return header, data


def _json_body(values: list[str], key: str = "data") -> bytes:
    return (f'{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[{len(values)}],'
            f'"{key}":[{",".join(values)}]}}]}}').encode()


def learners() -> list[bytes]:
    """The requests each server answers first, so the front has its plans."""
    header, data = _binary_parts([1.0, 1.0])
    return [_head(b"POST", SQUARE, [(b"host", b"h"), (b"inference-header-content-length",
                                                       b"%d" % len(header)),
                                    (b"content-length", b"%d" % (len(header) + 8))])
            + header + data,
            _head(b"POST", SQUARE, [(b"host", b"h"), (b"content-length", b"%d" % len(
                _json_body(["1", "2"])))]) + _json_body(["1", "2"])]


def _head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
          version: bytes = b"HTTP/1.1", eol: bytes = b"\r\n") -> bytes:
    lines = [method + b" " + target + b" " + version]
    lines += [name + b": " + value for name, value in headers]
    return eol.join(lines) + eol + eol


def _spelled(rng: random.Random) -> str:
    x = rng.uniform(-50, 50)
    return rng.choice([repr(x), str(int(x)), f"{x:.3e}", "-0", "1e39", "0.5",
                       "12345678901234567890"])


def request(rng: random.Random) -> bytes:
    """One request: most of them the front's own, some with a change the servers may
    read differently."""
    kind = rng.random()
    if kind < 0.08:
        return _head(b"GET", rng.choice([b"/v2/health/live", b"/v2/models/square", b"/nope"]),
                     [(b"host", b"h")])
    values = [float(rng.randrange(-999, 999)) for _ in range(rng.choice([1, 2, 3]))]
    if kind < 0.55:
        header, data = _binary_parts(values)
        body = header + data
        headers = [(b"host", b"h"), (b"inference-header-content-length", b"%d" % len(header)),
                   (b"content-length", b"%d" % len(body))]
    else:
        key = "d\\u0061ta" if rng.random() < 0.03 else "data"
        body = _json_body([_spelled(rng) for _ in values], key)
        if rng.random() < 0.03:  # a second data list under an escaped key
            body = body.replace(b"]}]}", b'],"d\\u0061ta":[1]}]}')
        headers = [(b"host", b"h"), (b"content-length", b"%d" % len(body))]
    method, target, version, eol = b"POST", SQUARE, b"HTTP/1.1", b"\r\n"
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
        change = rng.randrange(22)
        if change == 0:
            headers.append(rng.choice([(b"connection", b"close"), (b"Connection", b"keep-alive"),
                                       (b"connection", b"keep-alive, close"),
                                       (b"connection", b"upgrade"), (b"connection", b"Close")]))
        elif change == 1:
            headers.append((rng.choice([b"proxy-connection", b"Proxy-Connection"]),
                            rng.choice([b"close", b"keep-alive"])))
        elif change == 2:
            version = rng.choice([b"HTTP/1.0", b"HTTP/1.2", b"http/1.1"])
        elif change == 3:
            method = rng.choice([b"post", b"PUT", b"GET", b"POST "])
        elif change == 4:
            target = rng.choice([SQUARE + b"?x=1", SQUARE + b"/", b"/" + SQUARE,
                                 b"/v2/models/%73quare/infer", b"/v2/models/square/infer#f",
                                 b"http://h" + SQUARE, b"/v2/models/square/infer\x01"])
        elif change == 5:
            headers.append((b"host", b"h2"))
        elif change == 6:
            headers = [h for h in headers if h[0] != b"host"]
        elif change == 7:
            headers = [(n, b" " + v + b"  ") if n == b"content-length" else (n, v)
                       for n, v in headers]
        elif change == 8:
            n = len(body)
            headers = [(n_, rng.choice([b"+%d" % n, b"0%d" % n, b"%d, %d" % (n, n), b"%d" % (n + 1),
                                        b"%d" % max(0, n - 1)]))
                       if n_ == b"content-length" else (n_, v) for n_, v in headers]
        elif change == 9:
            headers.append((b"content-length", b"%d" % len(body)))
        elif change == 10:
            headers = [h for h in headers if h[0] != b"content-length"]
            headers.append((b"transfer-encoding", b"chunked"))
            body = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        elif change == 11:
            headers.append((b"x-pad", b"v" + b" " * rng.randrange(1, 40)))
        elif change == 12:
            headers.append((b"x-fold", b"a\r\n b"))
        elif change == 13:
            eol = b"\n"
        elif change == 14:
            headers.append((b"expect", rng.choice([b"100-continue", b"nothing"])))
        elif change == 15:
            headers.append((b"upgrade", b"websocket"))
        elif change == 16:
            headers.append((b"content-encoding", b"gzip"))
        elif change == 17:
            headers = [(n.upper(), v) for n, v in headers]
        elif change == 18:
            headers.append((b"x-big", b"z" * rng.choice([500, 4000, 9000])))
        elif change == 19:
            headers.append((b"x-bad", b"a\x00b"))
        elif change == 20:
            headers.insert(0, (b"x-a ", b"b"))
        else:
            headers.append((b"inference-header-content-length", b"3"))
    return _head(method, target, headers, version, eol) + body


def stream(rng: random.Random) -> list[bytes]:
    """A connection's bytes, in the pieces they are sent in."""
    data = rng.choice([b"", b"", b"", b"\r\n"]) + b"".join(
        request(rng) for _ in range(rng.choice([1, 1, 2, 3, 4])))
    if rng.random() < 0.08:  # cut short
        data = data[:rng.randrange(1, len(data))]
    if rng.random() < 0.05:  # corrupted
        raw = bytearray(data)
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        data = bytes(raw)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice([0, 0, 1, 2]))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def answers(port: int, streams: list[list[bytes]]) -> list[tuple]:
    """Each stream on its own connection, `WINDOW` of them in flight (the next opens as
    soon as one closes, so a stream the server closes late holds up no others): piece by
    piece, each piece `GAP_S` after the last so they arrive apart, then a half-close;
    read until the server closes. Per stream: (status, body) of each answer, and what was
    left over."""
    out: list[tuple | None] = [None] * len(streams)
    sel = selectors.DefaultSelector()
    due: list[tuple[float, int]] = []  # (when, stream): its next piece or its half-close
    sent = [0] * len(streams)  # pieces of each stream sent (one more: half-closed)
    socks: dict[int, socket.socket] = {}
    got: dict[int, bytes] = {}
    hang: dict[int, float] = {}  # stream -> when it is given up on (its last send + HANG_S)
    todo = iter(range(len(streams)))

    def advance(i: int) -> None:
        pieces = streams[i]
        try:
            if sent[i] < len(pieces):
                socks[i].sendall(pieces[sent[i]])
            else:
                socks[i].shutdown(socket.SHUT_WR)
        except TimeoutError:
            pytest.fail(f"the server read nothing of stream {i} for {HANG_S} s: {pieces}")
        except OSError:
            pass  # refused and closed: the answer is still read
        sent[i] += 1
        now = time.monotonic()
        if sent[i] <= len(pieces):
            heapq.heappush(due, (now + GAP_S, i))
        hang[i] = now + HANG_S

    def finish(i: int) -> None:
        sock = socks.pop(i)
        sel.unregister(sock)
        sock.close()
        del hang[i]
        responses, rest = parse_responses(got.pop(i))
        # a 100 Continue goes out only if the body has not come when the app asks for
        # it: when the pieces arrive decides, for either server
        out[i] = ([(r.status, r.body) for r in responses if r.status >= 200], rest)

    checked = time.monotonic()
    while True:
        while len(socks) < WINDOW and (i := next(todo, None)) is not None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks[i], got[i] = sock, b""
            sel.register(sock, selectors.EVENT_READ, i)
            advance(i)
        if not socks:
            assert None not in out, "a stream was never answered"
            return out
        wait = min(1.0, max(0.0, due[0][0] - time.monotonic())) if due else 1.0
        for key, _ in sel.select(wait):
            try:
                chunk = key.fileobj.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                got[key.data] += chunk
            else:  # the server closed: all it will answer has come
                finish(key.data)
        now = time.monotonic()
        while due and due[0][0] <= now:
            i = heapq.heappop(due)[1]
            if i in socks:
                advance(i)
        if now - checked > 1.0:
            checked = now
            late = sorted(i for i, give_up in hang.items() if now > give_up)
            assert not late, f"{len(late)} connections never closed (streams {late[:10]}): " \
                             f"{[streams[i] for i in late[:3]]}"


def _served(front: bool, streams: list[list[bytes]]) -> tuple[list[tuple], dict]:
    with ServerThread(front=front, header_timeout_s=10.0) as s:
        for raw in learners():
            assert exchange(s.port, raw, count=1).statuses == [200]
        if front:  # each plan is learnt just after its answer is written
            wait_until(lambda: s.call(s.server.stats)["plans"] >= 2, 10, 0.01, "the plans")
        got = answers(s.port, streams)
        return got, (s.call(s.server.stats) if front else {})


def test_the_front_answers_every_stream_as_the_python_server_does():
    rng = random.Random(SEED)
    streams = [stream(rng) for _ in range(STREAMS)]
    python, _ = _served(False, streams)
    front, stats = _served(True, streams)
    differ = [i for i, (a, b) in enumerate(zip(python, front)) if a != b]
    for i in differ[:3]:
        print("stream", i, streams[i], "\nthe Python server:", python[i], "\nthe front:", front[i])
    assert not differ, f"{len(differ)} of {len(streams)} streams answered differently: {differ}"
    for pieces, (got, _) in zip(streams, python):
        ok = sum(status == 200 for status, _ in got)
        assert ok <= len(h11_frames(b"".join(pieces))), pieces
    # most of it was the front's own: it framed and served those requests itself
    assert stats["fast"] > STREAMS // 3, stats
    assert sum(len(got) for got, _ in python) > STREAMS
