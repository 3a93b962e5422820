"""`deployments.replica.link_server`, the replica's end of a direct connection, against hostile
and broken callers: a wrong token, a frame past the limit, no token at all, random bytes
(a fixed seed) with and without the token. Nothing runs that is not a whole call's frame,
each such connection ends, and a real caller beside them keeps getting its answers. Also:
`close` fails what is open on every connection, as the actor's death would."""

from __future__ import annotations

import asyncio
import pickle
import random
import socket
import struct
import threading

import pytest

from deployments.replica.link_server import ThreadedLinkServer
from deployments.wire.link import HEAD, INFER, MAX_FRAME, Link, LinkLost
from tests.conftest import arun as run
from tests.conftest import until


class Model:
    """Doubles a batch's items; records each batch it ran; blocks while `gate` is clear."""

    def __init__(self) -> None:
        self.ran: list = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items):
        self.ran.append(list(items))
        self.gate.wait(10)
        return [2 * x for x in items]


def ended(sock: socket.socket) -> bytes:
    """What the server sent before it ended the connection (b"" for nothing)."""
    sock.settimeout(5)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("how", ["wrong-token", "oversized-frame", "not-a-call", "unreadable"])
def test_a_broken_caller_is_cut_off_and_nothing_runs(how):
    model = Model()
    server = ThreadedLinkServer(model, workers=1)
    host, port, token = server.address("127.0.0.1")
    payload = pickle.dumps(([1, 2],), protocol=5)
    frames = {
        "wrong-token": b"x" * len(token) + HEAD.pack(len(payload), 1, INFER) + payload,
        "oversized-frame": token + struct.pack("<IQB", MAX_FRAME + 1, 1, INFER) + b"junk",
        "not-a-call": token + HEAD.pack(len(payload), 1, 99) + payload,
        "unreadable": token + HEAD.pack(4, 1, INFER) + b"junk",
    }
    sock = socket.create_connection((host, port), timeout=5)
    try:
        sock.sendall(frames[how])
        assert ended(sock) == b""
    finally:
        sock.close()
        server.close()
    assert model.ran == []


def test_a_connection_that_never_sends_the_token_is_closed(monkeypatch):
    import deployments.replica.link_server as module

    monkeypatch.setattr(module, "TOKEN_WAIT_S", 0.2)
    server = ThreadedLinkServer(Model(), workers=1)
    host, port, _ = server.address("127.0.0.1")
    sock = socket.create_connection((host, port), timeout=5)
    try:
        sock.sendall(b"\x00" * 7)  # a few bytes, never the whole token
        assert ended(sock) == b""
    finally:
        sock.close()
        server.close()


def test_fuzzed_bytes_run_nothing_and_spare_a_real_caller():
    """200 random byte strings (a fixed seed), half after the right token, each on its own
    connection, while a real caller sends batches on its own."""
    rng = random.Random(20261128)
    model = Model()
    server = ThreadedLinkServer(model, workers=1)
    host, port, token = server.address("127.0.0.1")

    def one(i: int) -> None:
        junk = rng.randbytes(rng.choice([1, 5, 13, 40, 300, 5000]))
        if i % 3 == 0:  # a header that claims a short payload of junk
            junk = struct.pack("<IQB", len(junk), i, rng.choice([1, 2, 3, 4, 5, 9])) + junk
        sock = socket.create_connection((host, port), timeout=5)
        try:
            sock.sendall((token if i % 2 else b"") + junk)
            sock.shutdown(socket.SHUT_WR)
            ended(sock)
        except OSError:  # the server ended it first (a reset, not connected any more)
            pass
        finally:
            sock.close()

    async def main():
        caller = await Link.open_to(host, port, token)
        answers = []
        for i in range(200):
            await asyncio.to_thread(one, i)
            if i % 40 == 0:
                answers.append(await caller.call([i]))
        answers += await asyncio.gather(*(caller.call([k]) for k in range(10)))
        caller.close()
        return answers

    try:
        answers = run(main())
    finally:
        server.close()
    assert answers == [[2 * i] for i in range(0, 200, 40)] + [[2 * k] for k in range(10)]
    # only the real caller's batches ran (a fuzzed PING gets a PONG, a CANCEL nothing)
    assert model.ran == [[i] for i in range(0, 200, 40)] + [[k] for k in range(10)]


def test_close_fails_what_is_open_on_every_connection():
    model = Model()
    model.gate.clear()  # the first batch holds its thread
    server = ThreadedLinkServer(model, workers=1)
    host, port, token = server.address("127.0.0.1")

    async def main():
        links = [await Link.open_to(host, port, token) for _ in range(2)]
        calls = [link.call([k]) for k, link in enumerate(links)]
        await until(lambda: len(model.ran) == 2, "both batches running")
        server.close()
        model.gate.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    results = run(main())
    assert all(isinstance(r, LinkLost) for r in results), results
