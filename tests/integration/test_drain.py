"""Deleting or redeploying an app loses no request it accepted.

An app of its own (`drainer`, beside the shared one), one slow model: SlowSquare,
x -> x², 20 ms per batch of 8. Deleting it with 400 requests accepted by its batching
actor: every one ends with its own answer (before the drain, the actor was killed
with them). Redeploying it (a new code version: new ingress replica, new batching
actor) under load from a `RaybatchClient` and from HTTP clients: not one request
fails, and every answer is right.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest

from cluster.config import load_config
from deployments.ingress.client import RaybatchClient
from tests.conftest import arun

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME, PREFIX = "drainer", "/drainer"


def drainer_config(delay_ms: float):
    return load_config({
        "app_name": NAME,
        "ingress": {"num_cpus": 0.05, "route_prefix": PREFIX, "drain_timeout_s": 10},
        "models": [{
            "name": "slow", "transformer": "tests.models:SlowSquare",
            "init_kwargs": {"delay_ms": delay_ms},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 8},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
            "limits": {"queue_batches": 64, "max_queue_wait_s": None},  # 512 may wait
            "batcher": {"placement": "actor"},  # the batching actor's drain is under test
        }],
    })


def deploy(delay_ms: float):
    from ray import serve

    from deployments.app import build_app

    return serve.run(build_app(drainer_config(delay_ms)), name=NAME, route_prefix=PREFIX)


@pytest.fixture
def drainer(app):
    from ray import serve

    handle = deploy(20)
    yield handle
    if NAME in serve.status().applications:
        serve.delete(NAME)


def x(v: float) -> dict:
    return {"INPUT0": np.array([v], np.float32)}


def test_deleting_the_app_finishes_every_request_its_batching_actor_accepted(drainer):
    from ray import serve

    n = 400

    async def main():
        client = RaybatchClient(drainer)
        tasks = [asyncio.ensure_future(client.infer("slow", x(i))) for i in range(n)]
        while True:  # until all are accepted: queued at the actor, running, or answered
            open_ = (await drainer.status.remote())["slow"]["open_requests"]
            if open_ + sum(t.done() for t in tasks) >= n:
                break
            await asyncio.sleep(0.01)
        assert open_ >= n // 4, f"only {open_} requests left open: the load ended too soon"
        deleting = asyncio.get_running_loop().run_in_executor(None, serve.delete, NAME)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await deleting
        return outcomes

    outcomes = arun(main())
    wrong = [(i, o) for i, o in enumerate(outcomes)
             if isinstance(o, BaseException) or o["OUTPUT0"].tolist() != [float(i * i)]]
    assert not wrong, f"{len(wrong)} accepted requests were lost, e.g. {wrong[:3]}"
    assert NAME not in serve.status().applications


def test_redeploying_under_load_fails_no_request(drainer, app):
    url = f"{app.base_url}{PREFIX}/v2/models/slow/infer"
    outcomes: list = []

    async def client_loop(client: RaybatchClient, stop: asyncio.Event, seed: int):
        i = seed
        while not stop.is_set():
            try:
                v = i % 4000  # its square is exact in float32
                out = await client.infer("slow", x(v))
                outcomes.append(("client", i, out["OUTPUT0"].tolist() == [float(v * v)]))
            except Exception as e:
                outcomes.append(("client", i, e))
            i += 1

    async def http_loop(session, stop: asyncio.Event, seed: int):
        i = seed
        while not stop.is_set():
            v = i % 4000
            doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                               "data": [v]}]}
            try:
                async with session.post(url, json=doc) as r:
                    body = await r.json()
                    ok = r.status == 200 and body["outputs"][0]["data"] == [float(v * v)]
                    outcomes.append(("http", i, ok or (r.status, body)))
            except Exception as e:
                outcomes.append(("http", i, e))
            i += 1

    async def main():
        stop = asyncio.Event()
        client = RaybatchClient(drainer)
        async with aiohttp.ClientSession() as session:
            loops = [asyncio.ensure_future(client_loop(client, stop, s * 97))
                     for s in range(24)]
            loops += [asyncio.ensure_future(http_loop(session, stop, 2500 + s * 97))
                      for s in range(8)]
            await asyncio.sleep(1.0)
            before = len(outcomes)
            t0 = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, deploy, 10)  # new version
            redeploy_s = time.monotonic() - t0
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.gather(*loops)
        return before, redeploy_s

    before, redeploy_s = arun(main(), timeout_s=180)
    failed = [o for o in outcomes if o[2] is not True]
    by_path = {p: sum(1 for o in outcomes if o[0] == p) for p in ("client", "http")}
    print(f"redeploy took {redeploy_s:.1f} s; {len(outcomes)} requests ({by_path}), "
          f"{before} before it began; {len(failed)} failed")
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[:5]}"
    assert by_path["client"] > 100 and by_path["http"] > 20
    assert len(outcomes) > before + 100  # the load went on through the redeploy
