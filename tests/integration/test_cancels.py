"""A caller that gives up cancels its request at the batching actor.

Through the `RaybatchClient` (its task is cancelled) and through HTTP (the client
hangs up): a request still queued at the batching actor never runs, and nobody
else's answer suffers. The `gated` and `held` models (their batches held while the
gate is closed; one batch in flight at a time) make "queued at the actor" a state the
test sets and reads back from the actor's counts, never a moment it guesses: so that a
cancel reaches the actor while its request waits there is certain, whatever the
machine's speed. `slowsquare`, which no gate holds, takes 3,000 concurrent requests
of which 5% are cancelled at random moments while its queue drains: there, where each
cancel lands (before its request was sent, while it was queued, while its batch ran,
after its answer) depends on timing, so that test checks what holds for every landing:
every other answer, and the actor's counts agree with the outcomes.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import numpy as np
import pytest

from deployments.ingress.client import RaybatchClient
from tests.conftest import arun

pytestmark = pytest.mark.integration


async def until(check, timeout_s: float = 30.0, what: str = "condition"):
    give_up = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < give_up, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


def x(v: float) -> dict:
    return {"INPUT0": np.array([v], np.float32)}


async def _queued(app, n: int) -> bool:
    return (await app.astats("gated"))["queued_requests"] == n


def test_a_raybatch_client_that_gives_up_cancels_its_queued_request_at_the_actor(app, gate):
    async def main():
        client = RaybatchClient(app.handle)
        before = await app.astats("gated")
        gate.close()
        running = asyncio.ensure_future(client.infer("gated", x(1)))
        # running: in flight at the closed gate, none queued (queued == 0 alone holds
        # before it even arrives)
        await until(lambda: _running_alone(app), what="the first request to run")
        given_up = [asyncio.ensure_future(client.infer("gated", x(v))) for v in (2, 3)]
        await until(lambda: _queued(app, 2), what="two requests queued at the actor")
        for t in given_up:
            t.cancel()
        after = await until(lambda: _cancelled(app, before, 2), what="the cancels to arrive")
        assert after["queued_requests"] == 0  # they left the queue while the model is busy
        gate.open()
        assert (await running)["OUTPUT0"].tolist() == [2.0]
        done = await app.astats("gated")
        assert done["items"] - before["items"] == 1  # the cancelled ones never ran
        assert done["open_requests"] == 0
    arun(main())


async def _cancelled(app, before: dict, n: int):
    s = await app.astats("gated")
    return s if s["cancelled_by_caller"] - before["cancelled_by_caller"] == n else None


def test_an_http_client_that_hangs_up_cancels_its_queued_request_at_the_actor(app, gate):
    url = f"{app.base_url}/v2/models/gated/infer"

    def doc(v):
        return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [v]}]}

    async def main():
        before = await app.astats("gated")
        gate.close()
        async with aiohttp.ClientSession() as session:
            async def post(v):
                async with session.post(url, json=doc(v)) as r:
                    return r.status, await r.json()

            running = asyncio.ensure_future(post(1.0))
            await until(lambda: _running_alone(app), what="the first request to run")
            hung_up = [asyncio.ensure_future(post(v)) for v in (2.0, 3.0)]
            await until(lambda: _queued(app, 2), what="two requests queued at the actor")
            for t in hung_up:
                t.cancel()  # closes their connections
            after = await until(lambda: _cancelled(app, before, 2), what="the cancels")
            assert after["queued_requests"] == 0
            gate.open()
            status, body = await running
        assert status == 200 and body["outputs"][0]["data"] == [2.0]
        done = await app.astats("gated")
        assert done["items"] - before["items"] == 1
    arun(main())


async def _running_alone(app) -> bool:
    """The gated model's one batch is in flight (at the closed gate) and nothing waits."""
    s = await app.astats("gated")
    return s["inflight_batches"] == 1 and s["queued_requests"] == 0


def _delta(before: dict, after: dict) -> dict[str, int]:
    """What the batching actor counted between two snapshots: requests ended with an
    answer and failed, items run, and requests cancelled by their caller while open."""
    return {"success": after["success"]["count"] - before["success"]["count"],
            "fail": after["fail"]["count"] - before["fail"]["count"],
            "items": after["items"] - before["items"],
            "cancelled": after["cancelled_by_caller"] - before["cancelled_by_caller"]}


def test_random_cancels_under_load_spare_every_other_request(app):
    """Where each cancel lands depends on timing: before its request was sent (it never
    reaches the actor), while it was queued (it never runs), while its batch ran (it ran;
    its answer is dropped), or after its answer (the caller has it). Checked for each:
    every request not cancelled gets its own answer; a cancelled one either raises
    CancelledError or got its own answer; at the actor every failure is a caller's cancel,
    and nothing is left open. (That a cancel reaching a queued request keeps it from
    running, counted exactly, is the next test's: there the queue is held.)"""
    n, rng = 3000, random.Random(5)
    doomed = rng.sample(range(n), n // 20)  # cancelled in this (random) order

    async def main():
        client = RaybatchClient(app.handle)
        # the route first: otherwise every request waits for its lookup, and on a busy
        # machine all the cancels came before it and none reached the batching actor
        assert (await client.infer("slowsquare", x(2)))["OUTPUT0"].tolist() == [4.0]
        before = await app.astats("slowsquare")
        tasks = [asyncio.ensure_future(client.infer("slowsquare", x(i))) for i in range(n)]
        for i in doomed:  # at random moments while the queue drains
            await asyncio.sleep(rng.uniform(0, 0.004))
            tasks[i].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return before, outcomes, await app.astats("slowsquare")

    before, outcomes, after = arun(main())

    def right(i, o) -> bool:
        return not isinstance(o, BaseException) and o["OUTPUT0"].tolist() == [float(i * i)]

    wrong = [(i, o) for i, o in enumerate(outcomes) if i not in doomed and not right(i, o)]
    assert not wrong, f"{len(wrong)} requests that were not cancelled failed: {wrong[:3]}"
    gave_up = [i for i in doomed if isinstance(outcomes[i], asyncio.CancelledError)]
    odd = [(i, outcomes[i]) for i in doomed if i not in gave_up and not right(i, outcomes[i])]
    assert not odd, f"cancelled requests that ended otherwise: {odd[:3]}"
    d = _delta(before, after)
    print(f"\n{len(doomed)} cancels: {len(gave_up)} took effect at the caller, "
          f"{d['cancelled']} reached the batching actor while their request was open; "
          f"the actor ran {d['items']} of {n} requests")
    # its only failures are cancels (one that lands as its request ends is counted, not
    # failed), and each came from a caller that gave up
    assert d["fail"] <= d["cancelled"] <= len(gave_up)
    assert d["success"] >= n - len(doomed)  # every request not cancelled, once
    assert d["success"] + d["fail"] <= n  # none twice
    assert d["success"] <= d["items"] <= n  # cancelled ones that ran were in flight
    assert after["open_requests"] == 0 and after["queued_requests"] == 0


def test_a_raybatch_client_that_gives_up_under_load_cancels_only_its_requests(app, gate):
    """200 requests wait at the `held` model's batching actor behind one batch held at
    the closed gate; the client gives up on 20 of them at random moments, in random order.
    Each of the 20 is cancelled at the actor (all were queued there: the count is exact)
    and never runs; the other 180 run once the gate opens, each with its own answer."""
    n, rng = 200, random.Random(7)
    doomed = rng.sample(range(n), n // 10)

    async def main():
        client = RaybatchClient(app.handle)
        assert (await client.infer("held", x(-1)))["OUTPUT0"].tolist() == [0.0]  # the route
        before = await app.astats("held")
        gate.close()
        blocker = asyncio.ensure_future(client.infer("held", x(-2)))
        await until(lambda: _held_running_alone(app), what="the blocker's batch to run")
        tasks = [asyncio.ensure_future(client.infer("held", x(i))) for i in range(n)]
        await until(lambda: _held_queued(app, n), what=f"{n} requests queued at the actor")
        for i in doomed:
            await asyncio.sleep(rng.uniform(0, 0.004))
            tasks[i].cancel()
        cancelled = await until(lambda: _held_cancelled(app, before, len(doomed)),
                                what="the cancels to reach the actor")
        gate.open()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return before, cancelled, (await blocker), outcomes, await app.astats("held")

    before, cancelled, blocker, outcomes, after = arun(main())
    assert cancelled["queued_requests"] == n - len(doomed)  # they left the queue
    assert blocker["OUTPUT0"].tolist() == [-1.0]
    for i in doomed:
        assert isinstance(outcomes[i], asyncio.CancelledError), (i, outcomes[i])
    wrong = [(i, o) for i, o in enumerate(outcomes) if i not in doomed
             and (isinstance(o, BaseException) or o["OUTPUT0"].tolist() != [i + 1.0])]
    assert not wrong, f"{len(wrong)} requests that stayed got no answer or a wrong one: " \
                      f"{wrong[:3]}"
    d = _delta(before, after)
    assert d["cancelled"] == d["fail"] == len(doomed)
    assert d["items"] == d["success"] == 1 + n - len(doomed)  # the cancelled never ran
    assert after["open_requests"] == 0 and after["queued_requests"] == 0


async def _held_running_alone(app) -> bool:
    s = await app.astats("held")
    return s["inflight_batches"] == 1 and s["queued_requests"] == 0


async def _held_queued(app, n: int) -> bool:
    return (await app.astats("held"))["queued_requests"] == n


def test_http_clients_that_hang_up_under_load_cost_nobody_else_their_answer(app, gate):
    """200 HTTP requests wait at the `held` model's batching actor (its gate is closed);
    20 clients hang up. Serve cancels their handlers, and Ray would cancel every Ray call
    made in their context: a bundle carrying batch-mates must not be one of them. Each
    hung-up request leaves the queue; every other client gets its own answer."""
    n, rng = 200, random.Random(9)
    doomed = set(rng.sample(range(n), n // 10))
    url = f"{app.base_url}/v2/models/held/infer"

    async def main():
        before = await app.astats("held")
        gate.close()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def post(i):
                doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [i]}]}
                async with session.post(url, json=doc) as r:
                    return r.status, await r.json()

            tasks = [asyncio.ensure_future(post(i)) for i in range(n)]
            await until(lambda: _held(app, n - 16), what=f"{n - 16} requests to be queued")
            for i in doomed:
                tasks[i].cancel()
            cancelled = await until(lambda: _held_cancelled(app, before, len(doomed)),
                                    what="the hung-up requests to be cancelled at the actor")
            gate.open()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return cancelled, outcomes, await app.astats("held")

    cancelled, outcomes, after = arun(main())
    assert cancelled["queued_requests"] <= n - len(doomed)  # they left the queue
    wrong = [(i, o) for i, o in enumerate(outcomes) if i not in doomed
             and (isinstance(o, BaseException) or o != (200, _answer("held", i + 1.0)))]
    assert not wrong, f"{len(wrong)} clients that stayed got no answer or a wrong one: {wrong[:3]}"
    assert after["open_requests"] == 0


async def _held(app, n: int) -> bool:
    return (await app.astats("held"))["queued_requests"] >= n


async def _held_cancelled(app, before: dict, n: int):
    s = await app.astats("held")
    return s if s["cancelled_by_caller"] - before["cancelled_by_caller"] >= n else None


def _answer(model: str, y: float) -> dict:
    return {"model_name": model, "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [y]}]}
