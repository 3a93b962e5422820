"""Deleting or redeploying an app loses no request it accepted.

An app of its own (`drainer`, beside the shared one), one model. Deleting it with 400
requests accepted by its batching actor and held there (Gated, x -> x + 1, its gate
closed until the delete has begun): every one ends with its own answer (before the
drain, the actor was killed with them). Redeploying it (SlowSquare, x -> x², 20 ms per
batch of 8) (a new code version: new ingress replica, new batching
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


def drainer_config(delay_ms: float, gate_path: str | None = None):
    model = ({"transformer": "tests.models:Gated", "init_kwargs": {"gate_path": gate_path}}
             if gate_path else
             {"transformer": "tests.models:SlowSquare", "init_kwargs": {"delay_ms": delay_ms}})
    return load_config({
        "app_name": NAME,
        # a bound only (a drain ends once its requests are answered), wide for a starved box
        "ingress": {"num_cpus": 0.05, "route_prefix": PREFIX, "drain_timeout_s": 60},
        "models": [{
            "name": "slow", **model,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 8},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
            "limits": {"queue_batches": 64, "max_queue_wait_s": None},  # 512 may wait
            "batcher": {"placement": "actor"},  # the batching actor's drain is under test
        }],
    })


def deploy(delay_ms: float, gate_path: str | None = None):
    from ray import serve

    from deployments.app import build_app

    return serve.run(build_app(drainer_config(delay_ms, gate_path)), name=NAME,
                     route_prefix=PREFIX)


@pytest.fixture
def drainer(app):
    from ray import serve

    handle = deploy(20)
    yield handle
    if NAME in serve.status().applications:
        serve.delete(NAME)


@pytest.fixture
def held_drainer(app, tmp_path):
    """The drainer app with Gated: its batches wait while `gate` (a file) exists."""
    from ray import serve

    gate = tmp_path / "gate"
    handle = deploy(0, str(gate))  # the gate open while it warms up
    yield handle, gate
    gate.unlink(missing_ok=True)
    if NAME in serve.status().applications:
        serve.delete(NAME)


def x(v: float) -> dict:
    return {"INPUT0": np.array([v], np.float32)}


def test_deleting_the_app_finishes_every_request_its_batching_actor_accepted(held_drainer):
    from ray import serve

    handle, gate = held_drainer
    n = 400

    def deleting_begun() -> bool:
        state = serve.status().applications.get(NAME)
        return state is None or str(state.status).rsplit(".", 1)[-1] == "DELETING"

    async def main():
        gate.touch()  # nothing is answered until the delete has begun
        client = RaybatchClient(handle)
        tasks = [asyncio.ensure_future(client.infer("slow", x(i))) for i in range(n)]
        while True:  # until all are accepted: queued at the actor, or held running
            open_ = (await handle.status.remote())["slow"]["open_requests"]
            if open_ + sum(t.done() for t in tasks) >= n:
                break
            await asyncio.sleep(0.01)
        deleting = asyncio.get_running_loop().run_in_executor(None, serve.delete, NAME)
        while not await asyncio.to_thread(deleting_begun):
            await asyncio.sleep(0.05)
        gate.unlink()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await deleting
        return open_, outcomes

    open_, outcomes = arun(main())
    wrong = [(i, o) for i, o in enumerate(outcomes)
             if isinstance(o, BaseException) or o["OUTPUT0"].tolist() != [float(i + 1)]]
    assert not wrong, f"{len(wrong)} accepted requests were lost, e.g. {wrong[:3]}"
    assert open_ == n  # every one was open (held) when the delete began
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
