"""Raybatch's own HTTP server parses at most `turn_reads` reads per turn of the event loop:
under a flood of ready sockets the rest wait a turn (their bytes kept, their sockets not
read past a buffer's worth), so the loop's other callbacks (finished batches, Ray's calls,
timers) still run.
Over real sockets, on the test's loop."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from deployments.http.pyserver.connection import Connection
from deployments.http.pyserver.cycle import READ_BUFFER_BYTES
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.http.fakes import infer_body
from tests.unit.deployments.http.served import INFER, Served, read_response, request


async def _flood(s: Served, clients: int, per_client: int, budget: int) -> tuple[list, Counter]:
    """`clients` connections each write `per_client` pipelined requests at once; returns
    the answers per client and how many requests were parsed in each turn of the loop."""
    s.server.turn_reads = budget
    loop = asyncio.get_running_loop()
    turn = 0

    def tick() -> None:  # one call per turn of the loop
        nonlocal turn
        turn += 1
        if running:
            loop.call_soon(tick)

    parsed: Counter = Counter()
    lanes = s.server.quick, s.app.direct

    def quick(cycle) -> bool:
        parsed[turn] += 1
        return lanes[0](cycle)

    s.server.quick = quick
    conns = [await s.connect() for _ in range(clients)]
    running = True
    tick()
    for i, (_, w) in enumerate(conns):  # every socket readable at the same poll
        w.write(b"".join(request("POST", INFER, infer_body([float(i * 10 + k)]))
                         for k in range(per_client)))
    answers = []
    for r, w in conns:
        answers.append([(await read_response(r)) for _ in range(per_client)])
        w.close()
    running = False
    return answers, parsed


@pytest.mark.parametrize("per_client", [1, 3], ids=["one-each", "pipelined"])
def test_a_flood_is_parsed_a_budget_per_turn_and_every_client_gets_its_own_answers(
        per_client):
    async def main():
        async with Served() as s:
            return await _flood(s, clients=24, per_client=per_client, budget=3)

    answers, parsed = run(main())
    assert [[(a.status, a.json()["outputs"][0]["data"]) for a in mine] for mine in answers] \
        == [[(200, [float((i * 10 + k) ** 2)]) for k in range(per_client)] for i in range(24)]
    # the budget holds per turn: a turn's own reads plus the waiting ones it parses at its
    # start, at most twice the budget, each read holding up to `per_client` requests;
    # and the flood was spread over many turns
    assert sum(parsed.values()) == 24 * per_client
    assert max(parsed.values()) <= 2 * 3 * per_client, parsed
    assert len(parsed) >= 24 / 6, parsed


def test_under_the_budget_nothing_waits_a_turn():
    async def main():
        async with Served() as s:
            return await _flood(s, clients=24, per_client=1, budget=256)

    answers, parsed = run(main())
    assert all(a[0].status == 200 for a in answers)
    assert len(parsed) == 1, parsed  # all 24 parsed in the turn their bytes came


def test_a_client_that_leaves_while_its_read_waits_is_skipped_and_the_rest_answered():
    async def main():
        async with Served() as s:
            s.server.turn_reads = 1
            conns = [await s.connect() for _ in range(6)]
            for i, (_, w) in enumerate(conns):
                w.write(request("POST", INFER, infer_body([float(i)])))
            conns[4][1].transport.abort()  # gone before its turn
            out = []
            for i, (r, w) in enumerate(conns):
                if i != 4:
                    out.append((await read_response(r)).json()["outputs"][0]["data"])
                    w.close()
            await until(lambda: not s.server._waiting and len(s.server.connections) <= 1,
                        "no read waiting, the closed connections gone", 30)
            return out, len(s.server._waiting), len(s.server.connections)

    out, waiting, left = run(main(), 60)
    assert out == [[0.0], [1.0], [4.0], [9.0], [25.0]]
    assert waiting == 0 and left <= 1


def test_a_connection_waiting_its_turn_is_read_only_up_to_a_buffer_of_bytes(monkeypatch):
    """A waiting connection's socket is still read (no system call per wait), but once
    its kept bytes pass `READ_BUFFER_BYTES` it is not read until its turn: 30 clients
    each pipelining ~400 KB with a budget of one read a turn hold at most that and one
    read each, and every client gets its own answers."""
    kept: list[int] = []
    received = Connection.data_received

    def spy(self, data):
        received(self, data)
        if self.waiting:
            kept.append(len(self.inbuf))

    monkeypatch.setattr(Connection, "data_received", spy)
    xs = [float(k) for k in range(1000)]
    body = infer_body(xs)
    per_client = 400_000 // len(body) + 1

    async def main():
        async with Served() as s:
            s.server.turn_reads = 1
            conns = [await s.connect() for _ in range(30)]
            for _, w in conns:
                w.write(request("POST", INFER, body) * per_client)
            answers = []
            for r, w in conns:
                answers.append([(await read_response(r)).status for _ in range(per_client)])
                w.close()
            return answers

    answers = run(main())
    assert answers == [[200] * per_client] * 30
    assert kept and max(kept) <= READ_BUFFER_BYTES + 256 * 2**10, max(kept)


def test_clients_that_half_close_while_their_reads_wait_still_get_every_answer():
    """A waiting connection's socket is still read, so its client's half-close can come
    before its turn: what it sent whole is answered, in order, and a request cut short
    gets its error, not another client's answer or a hang."""
    async def main():
        async with Served() as s:
            s.server.turn_reads = 1
            conns = [await s.connect() for _ in range(20)]
            for i, (_, w) in enumerate(conns):
                w.write(b"".join(request("POST", INFER, infer_body([float(i * 10 + k)]))
                                 for k in range(3)))
                if i % 2:  # and half of a fourth request
                    w.write(request("POST", INFER, infer_body([1.0]))[:40])
                w.write_eof()
            answers = []
            for r, w in conns:
                answers.append([await read_response(r) for _ in range(3)])
                answers[-1].append(await r.read())  # the rest, until the server closes
                w.close()
            return answers

    answers = run(main())
    for i, (*mine, rest) in enumerate(answers):
        assert [(a.status, a.json()["outputs"][0]["data"]) for a in mine] == \
            [(200, [float((i * 10 + k) ** 2)]) for k in range(3)]
        assert rest == b"" or rest.startswith(b"HTTP/1.1 400"), rest[:80]
