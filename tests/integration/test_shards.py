"""A model with two batching shards: every request answered once, both shards used."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.ingress.client import RaybatchClient
from tests.conftest import arun

pytestmark = pytest.mark.integration


def test_sharded_model_spreads_bundles_and_answers_each_request(app):
    before = app.stats("sharded")
    client = RaybatchClient(app.handle)
    xs = np.arange(400, dtype=np.float32)

    async def load():
        async def one(x):
            out = await client.infer("sharded", {"INPUT0": np.array([x], np.float32)})
            return float(out["OUTPUT0"][0])
        # several waves so the ingress sees several bundles and can pick both shards
        got = []
        for wave in np.array_split(xs, 8):
            got += await asyncio.gather(*(one(x) for x in wave))
        return got

    assert arun(load()) == [float(x * x) for x in xs]
    after = app.stats("sharded")
    assert after["shards"] == 2
    assert after["items"] - before["items"] == len(xs)
    assert after["success"]["count"] - before["success"]["count"] == len(xs)
    assert {r["shard"] for r in after["replica_info"]} == {0, 1}
    gained = [a - b for a, b in zip(after["items_by_shard"], before["items_by_shard"])]
    assert all(g > 0 for g in gained), f"a shard got no work: {gained}"
    assert after["replicas"] == 2  # min_replicas 2 split over 2 shards: one each
