"""Stateful models on the shared app: sequence batching through handles and HTTP.

The accumulator returns each sequence's running sum, so an answer given to the
wrong sequence, out of order, or with another sequence's state cannot pass.
The GRU's outputs are compared with the same model run alone, in this process.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import aiohttp
import numpy as np
import pytest

from batching.errors import SequenceLost, UnknownSequence
from batching.sequence.stateful import SequenceBatchInput, StateStore
from deployments.ingress.client import RaybatchClient
from deployments.models.stateful import GRU
from tests.conftest import arun, wait_until

pytestmark = pytest.mark.integration


def _steps(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(-50, 50) for _ in range(n)]


async def _run_sequence(client: RaybatchClient, model: str, sequence_id, values, rng):
    outs = []
    for i, v in enumerate(values):
        await asyncio.sleep(rng.random() * 0.002)  # interleave the 50 clients differently
        params = {"sequence_id": sequence_id, "sequence_start": i == 0,
                  "sequence_end": i == len(values) - 1}
        x = np.array([[v]], dtype=np.int32) if model.startswith("acc") else v[None]
        out = await client.infer(model, {"INPUT0": x}, params)
        outs.append(out["OUTPUT0"][0])
    return outs


def test_50_interleaved_sequences_each_get_their_own_running_sums(app):
    ids = [*range(1, 26), *(f"seq-{i}" for i in range(25))]  # int and string ids
    values = {sid: _steps(i, 8 + i % 5) for i, sid in enumerate(ids)}

    async def main():
        client = RaybatchClient(app.handle)
        rng = random.Random(7)
        runs = [_run_sequence(client, "accumulator", sid, values[sid], rng) for sid in ids]
        return await asyncio.gather(*runs)

    before = app.stats("accumulator")
    results = arun(main())
    for sid, outs in zip(ids, results, strict=True):
        assert [int(o[0]) for o in outs] == list(np.cumsum(values[sid])), sid
    after = app.stats("accumulator")
    steps = sum(len(v) for v in values.values())
    assert after["success"]["count"] - before["success"]["count"] == steps
    assert after["batches"] - before["batches"] < steps  # sequences shared batches
    placed = {r["index"] for r in after["replica_info"]}
    assert len(placed) == 2


def test_50_interleaved_gru_sequences_equal_the_model_alone(app):
    rng = np.random.default_rng(3)
    seqs = {f"g{i}": rng.standard_normal((5 + i % 4, 8)).astype(np.float32) for i in range(50)}

    async def main():
        client = RaybatchClient(app.handle)
        r = random.Random(11)
        return await asyncio.gather(*(_run_sequence(client, "gru", sid, list(xs), r)
                                      for sid, xs in seqs.items()))

    results = arun(main())
    model = GRU()
    model.setup("cpu")
    for (sid, xs), outs in zip(seqs.items(), results, strict=True):
        store = StateStore(model)
        for i, x in enumerate(xs):  # alone: a batch of one row per step
            alone = store.run(SequenceBatchInput(x[None], (sid,), (i == 0,),
                                                 (i == len(xs) - 1,), (True,)))[0]
            np.testing.assert_allclose(outs[i], alone, rtol=1e-5, atol=1e-5)


def _post(app, model: str, value: int, **params):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
           "parameters": params}

    async def main():
        async with aiohttp.ClientSession() as s, s.post(
                f"{app.base_url}/v2/models/{model}/infer", json=doc) as r:
            return r.status, await r.json()

    return arun(main(), 30)


def test_bad_sequence_controls_get_400_and_leave_the_sequence_alone(app):
    assert _post(app, "accumulator", 5, sequence_id=901, sequence_start=True)[0] == 200
    status, body = _post(app, "accumulator", 1, sequence_id=901, sequence_start=True)
    assert status == 400 and "901" in body["error"]  # a second start of a live sequence
    status, body = _post(app, "accumulator", 1, sequence_id=902)  # never started
    assert status == 400 and "902" in body["error"] and "sequence_start" in body["error"]
    status, body = _post(app, "accumulator", 1)  # no sequence id at all
    assert status == 400 and "sequence_id" in body["error"]
    status, body = _post(app, "accumulator", 1, sequence_id="")
    assert status == 400
    # the live sequence was not disturbed by any of that
    status, body = _post(app, "accumulator", 2, sequence_id=901, sequence_end=True)
    assert status == 200 and body["outputs"][0]["data"] == [7]
    status, body = _post(app, "accumulator", 1, sequence_id=901)  # ended
    assert status == 400


def test_two_items_in_one_sequence_request_is_refused(app):
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}],
           "parameters": {"sequence_id": 77, "sequence_start": True}}

    async def main():
        async with aiohttp.ClientSession() as s, s.post(
                f"{app.base_url}/v2/models/accumulator/infer", json=doc) as r:
            return r.status, await r.json()

    status, body = arun(main(), 30)
    assert status == 400 and "one item" in body["error"]


def test_an_idle_sequence_is_ended_and_its_slot_freed(app):
    assert _post(app, "accumulator-idle", 1, sequence_id="idle-a", sequence_start=True)[0] == 200
    assert _post(app, "accumulator-idle", 1, sequence_id="idle-b", sequence_start=True)[0] == 200
    wait_until(lambda: app.stats("accumulator-idle")["live_sequences"] == 0, timeout_s=10,
               what="the idle sequences to be ended")
    status, body = _post(app, "accumulator-idle", 1, sequence_id="idle-a")
    assert status == 400 and "idle-a" in body["error"]
    # both slots are free again: two new sequences start at once
    for sid in ("idle-c", "idle-d"):
        assert _post(app, "accumulator-idle", 3, sequence_id=sid, sequence_start=True)[0] == 200


def test_a_dead_replica_loses_its_sequences_clearly_and_is_replaced(app):
    client_ids = [f"death-{i}" for i in range(8)]

    async def start_all(client):
        for sid in client_ids:
            await client.infer("accumulator", {"INPUT0": np.array([[1]], np.int32)},
                               {"sequence_id": sid, "sequence_start": True})

    async def next_step(client, sid):
        return await client.infer("accumulator", {"INPUT0": np.array([[1]], np.int32)},
                                  {"sequence_id": sid})

    async def main():
        client = RaybatchClient(app.handle)
        await start_all(client)
        info = (await app.astats("accumulator"))["replica_info"]
        victim = info[0]
        os.kill(victim["pid"], signal.SIGKILL)
        await asyncio.sleep(1.0)
        outcomes = await asyncio.gather(*(next_step(client, s) for s in client_ids),
                                        return_exceptions=True)
        fresh = await client.infer("accumulator", {"INPUT0": np.array([[4]], np.int32)},
                                   {"sequence_id": "after-death", "sequence_start": True})
        return outcomes, fresh

    before = app.stats("accumulator")["replica_deaths"]
    outcomes, fresh = arun(main())
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    kept = [o for o in outcomes if not isinstance(o, BaseException)]
    assert lost and kept, outcomes  # sequences were on both replicas
    assert all(isinstance(e, SequenceLost) and "sequence_start" in str(e) for e in lost), lost
    assert all(int(o["OUTPUT0"][0][0]) == 2 for o in kept)
    assert int(fresh["OUTPUT0"][0][0]) == 4
    wait_until(lambda: (lambda s: s["replicas"] == 2 and s["replica_deaths"] == before + 1)(
        app.stats("accumulator")), timeout_s=60, what="the pool to be restored")
    with pytest.raises((SequenceLost, UnknownSequence)):  # the state is gone for good
        arun(next_step(RaybatchClient(app.handle), next(
            s for s, o in zip(client_ids, outcomes, strict=True) if isinstance(o, BaseException))))
