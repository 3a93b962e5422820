"""Many concurrent HTTP clients (aiohttp): each gets its own answer, and they were batched."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from tests.conftest import arun

pytestmark = pytest.mark.e2e


def test_64_concurrent_requests_each_get_their_own_result(app):
    url = f"{app.base_url}/v2/models/square/infer"
    xs = [[float(i), i + 0.5, -float(i)] for i in range(64)]

    async def one(session: aiohttp.ClientSession, i: int):
        doc = {"id": f"r{i}",
               "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": xs[i]}]}
        async with session.post(url, json=doc) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def main():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await asyncio.gather(*(one(session, i) for i in range(64)))

    before = app.stats("square")
    answers = arun(main())
    for i, answer in enumerate(answers):
        assert answer["id"] == f"r{i}"
        x = np.array(xs[i], np.float32)
        assert answer["outputs"][0]["data"] == (x * x).tolist()
    after = app.stats("square")
    assert after["success"]["count"] - before["success"]["count"] == 64
    assert after["items"] - before["items"] == 64 * 3
