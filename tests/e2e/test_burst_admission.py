"""A burst the model can serve within the wait bound is served, not refused (admission by
time, `limits.max_queue_wait_s`): 1,500 concurrent single-item requests to `square` on
Raybatch's own HTTP port all get 200 with their own answer. Under the count bound that
was the default before (8 batches of 64), about 580 were answered and the rest got 429."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest

from tests.conftest import arun

pytestmark = pytest.mark.e2e

BURST = 1500


def test_a_burst_of_1500_single_item_requests_is_all_served(app):
    url = f"{app.native_url}/v2/models/square/infer"
    policy = app.config.models[[m.name for m in app.config.models].index("square")]
    assert policy.limits.max_queue_wait_s == 1.0  # the default under test

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[int, object]:
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                           "data": [float(i)]}]}
        async with session.post(url, json=doc) as r:
            body = await r.json()
            return r.status, body["outputs"][0]["data"] if r.status == 200 else body

    async def main():
        connector = aiohttp.TCPConnector(limit=BURST)  # one connection each: all at once
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=60)) as session:
            return await asyncio.gather(*(one(session, i) for i in range(BURST)))

    answers = arun(main(), timeout_s=90)
    statuses = Counter(status for status, _ in answers)
    refused = [body for status, body in answers if status != 200][:3]
    assert statuses == {200: BURST}, (statuses, refused)
    assert all(data == [float(i * i)] for i, (_, data) in enumerate(answers))
