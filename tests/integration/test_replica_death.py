"""A replica actor killed under load: every request still ends once, with its own result.

`slowsquare` (x², 10 ms per batch of at most 8) runs on two replicas; so does
`slowsquare-local`, whose engine runs in the ingress replica (`batcher.placement:
ingress`), reached by the client through the app's handle. The test
sends 800 requests of distinct inputs, kills one replica's process while it has
batches outstanding, and checks that each caller got exactly x² of its own x
(the batches of the dead replica included), that nothing failed, that the
batcher counted each request once, and that the pool started a replacement.
"""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from batching.errors import WorkerDied
from deployments.ingress.client import RaybatchClient
from tests.conftest import arun, wait_until

pytestmark = pytest.mark.integration

ROUND = 200
MAX_ROUNDS = 25  # 5,000 requests at most before the victim must have been seen busy


def x(i: int) -> np.ndarray:
    return np.array([i, i + 0.25], np.float32)


@pytest.mark.parametrize("model", ["slowsquare", "slowsquare-local"])
def test_killing_a_replica_mid_load_loses_duplicates_and_misroutes_nothing(app, model):
    before = app.stats(model)
    assert before["replicas"] == 2, before["replica_info"]
    victim = before["replica_info"][0]

    async def one(client: RaybatchClient, i: int):
        try:
            return i, await client.infer(model, {"INPUT0": x(i)})
        except WorkerDied as e:
            return i, e

    async def main():
        client = RaybatchClient(app.handle)
        sent: list[asyncio.Future] = []

        def send_round():
            start = len(sent)
            sent.extend(asyncio.ensure_future(one(client, i))
                        for i in range(start, start + ROUND))

        send_round()
        while True:  # kill only once the victim is busy: its batches must be retried
            s = await app.astats(model)
            busy = [r for r in s["replica_info"]
                    if r["index"] == victim["index"] and r.get("outstanding_batches", 0) > 0]
            if busy and s["batches"] > before["batches"]:
                break
            if sum(not f.done() for f in sent) < ROUND // 2:  # keep the replicas busy
                assert len(sent) < MAX_ROUNDS * ROUND, (
                    f"{len(sent)} requests answered and the victim never seen busy: {s}")
                send_round()
            await asyncio.sleep(0.005)
        # SIGKILL, as the OOM killer would: the actor dies with no chance to clean up.
        # (The test shares the node with the cluster; the batcher reports the pid.)
        os.kill(victim["pid"], signal.SIGKILL)
        send_round()
        return await asyncio.gather(*sent)

    results = arun(main())
    n = len(results)

    assert sorted(i for i, _ in results) == list(range(n))  # every request ended once
    errors = [(i, r) for i, r in results if isinstance(r, BaseException)]
    assert errors == [], f"{len(errors)} requests failed, e.g. {errors[:3]}"
    for i, out in results:
        np.testing.assert_array_equal(out["OUTPUT0"], x(i) * x(i), err_msg=f"request {i}")

    after = app.stats(model)
    assert after["success"]["count"] - before["success"]["count"] == n
    assert after["fail"]["count"] == before["fail"]["count"]
    assert after["items"] - before["items"] == 2 * n  # no request was batched twice
    assert after["open_requests"] == 0
    assert after["replica_deaths"] - before["replica_deaths"] == 1
    assert after["retried_batches"] > before["retried_batches"]  # its batches ran again

    def replaced():
        s = app.stats(model)
        infos = s["replica_info"]
        alive = [r for r in infos if r["state"] == "ALIVE"]
        ok = (s["replicas"] == 2 and len(alive) == 2
              and victim["index"] not in {r["index"] for r in infos})
        return ok and infos

    infos = wait_until(replaced, timeout_s=60, what="the pool to be back to 2 live replicas")
    assert victim["pid"] not in {r["pid"] for r in infos}
    out = app.handle.infer.remote(model, {"INPUT0": np.array([4.0], np.float32)})
    np.testing.assert_array_equal(out.result(timeout_s=30)["OUTPUT0"], [16.0])
