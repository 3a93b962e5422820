"""`replicas.in_process`: replicas built inside their engine's process, on the real cluster.

In the shared app (tests/configs/app.yaml), `square` runs its replica in the ingress
replica (its engine is there: `batcher.placement: ingress`) and the sequence model
`gru` in its batching actor. Each answers every way in, and its replica reports the
process it really runs in: its host's, not an actor of its own.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from deployments.ingress.client import RaybatchClient
from tests.conftest import alive_pids, arun

pytestmark = pytest.mark.integration


def test_an_in_process_replica_runs_in_the_ingress_and_answers_every_way_in(app):
    info = app.stats("square")["replica_info"]
    assert len(info) == 1 and info[0]["in_process"] and info[0]["state"] == "ALIVE", info
    assert info[0]["pid"] in alive_pids(f"SERVE_REPLICA::{app.name}#Ingress#"), info
    assert not info[0]["pinned"], info
    client = RaybatchClient(app.handle)
    xs = [np.array([i, -i], np.float32) for i in range(64)]

    async def load():
        outs = await asyncio.gather(*[client.infer("square", {"INPUT0": x}) for x in xs[:32]],
                                    *[app.handle.infer.remote("square", {"INPUT0": x})
                                      for x in xs[32:]])
        return [o["OUTPUT0"] for o in outs]

    for x, y in zip(xs, arun(load())):
        np.testing.assert_array_equal(y, x * x)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [3, 4]}]}
    for base in (app.base_url, app.direct_url):
        r = httpx.post(f"{base}/v2/models/square/infer", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [9, 16], r.text


def test_a_stateful_in_process_replica_runs_in_its_batching_actor(app):
    info = app.stats("gru")["replica_info"]
    assert len(info) == 1 and info[0]["in_process"], info
    batcher = alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{app.name}::", "::batcher-gru")
    assert info[0]["pid"] in batcher, (info, batcher)

    async def sequence(sid: int) -> list[np.ndarray]:
        out = []
        for step in range(3):
            x = np.full((1, 8), sid + step, np.float32)
            r = await app.handle.infer.remote("gru", {"INPUT0": x}, {
                "sequence_id": sid, "sequence_start": step == 0, "sequence_end": step == 2})
            out.append(r["OUTPUT0"])
        return out

    async def three() -> list[list[np.ndarray]]:
        return await asyncio.gather(*(sequence(s) for s in (101, 102, 1101)))

    runs = arun(three())
    assert all(len(r) == 3 and r[0].shape == (1, 8) for r in runs)
    # a sequence's answers depend on its own history only: the same inputs, the same answers
    again = arun(sequence(101))
    for a, b in zip(runs[0], again):
        np.testing.assert_allclose(a, b, rtol=1e-5)
