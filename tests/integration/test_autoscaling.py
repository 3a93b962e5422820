"""The replica pool scales on queue depth: up when work piles up, down when idle."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import arun, wait_until

pytestmark = pytest.mark.integration
MODEL = "scaling"


def test_pool_adds_a_replica_under_a_queue_and_removes_it_when_idle(app, gate):
    assert app.stats(MODEL)["replicas"] == 1  # min_replicas
    gate.close()  # the replica holds its batch: requests queue up behind it

    async def load():
        calls = [app.handle.infer.remote(MODEL, {"INPUT0": np.array([x], np.float32)})
                 for x in range(20)]
        grown = await asyncio.to_thread(
            wait_until, lambda: app.stats(MODEL)["replicas"] == 2, 60, 0.2,
            "a second replica under a queue of 20")
        gate.open()
        return grown, [await c for c in calls]

    grown, outs = arun(load())
    assert grown
    assert [float(o["OUTPUT0"][0]) for o in outs] == [x + 1.0 for x in range(20)]
    stats = app.stats(MODEL)
    assert stats["replicas"] <= 2 and stats["success"]["count"] >= 20
    wait_until(lambda: app.stats(MODEL)["replicas"] == 1, timeout_s=60,
               what="the pool to scale back down to min_replicas after 1 s idle")
