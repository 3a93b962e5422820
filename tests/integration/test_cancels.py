"""A caller that gives up cancels its request at the batching actor.

Through the `RaybatchClient` (its task is cancelled) and through HTTP (the client
hangs up): a request still queued at the batching actor never runs, and nobody
else's answer suffers. The `gated` model (one batch of one item at a time, held
while the gate is closed) makes "queued at the actor" a state the test sets. The
last test cancels 5% of 3,000 concurrent requests at random moments and checks
every other answer.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import numpy as np
import pytest

from deployments.client import RaybatchClient
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
        await until(lambda: _queued(app, 0), what="the first request to run")
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
            await until(lambda: _queued(app, 0), what="the first request to run")
            await until(lambda: _inflight(app), what="the first request to run")
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


async def _inflight(app) -> bool:
    return (await app.astats("gated"))["inflight_batches"] == 1


def test_random_cancels_under_load_spare_every_other_request(app):
    n, rng = 3000, random.Random(5)
    doomed = sorted(rng.sample(range(n), n // 20))

    async def main():
        client = RaybatchClient(app.handle)
        before = await app.astats("slowsquare")
        tasks = [asyncio.ensure_future(client.infer("slowsquare", x(i))) for i in range(n)]
        for i in doomed:  # at random moments while the queue drains
            await asyncio.sleep(rng.uniform(0, 0.004))
            tasks[i].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return before, outcomes, await app.astats("slowsquare")

    before, outcomes, after = arun(main())
    wrong = [(i, o) for i, o in enumerate(outcomes) if i not in doomed
             and (isinstance(o, BaseException) or o["OUTPUT0"].tolist() != [float(i * i)])]
    assert not wrong, f"{len(wrong)} requests that were not cancelled failed: {wrong[:3]}"
    cancelled = after["cancelled_by_caller"] - before["cancelled_by_caller"]
    assert cancelled > 0, "no cancel reached the batching actor"
    ran = after["items"] - before["items"]
    assert ran < n, "every cancelled request ran anyway"
    assert after["open_requests"] == 0 and after["queued_requests"] == 0


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
