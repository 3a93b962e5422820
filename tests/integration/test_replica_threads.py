"""A dynamic model's replica actor with `read_ahead`, on Ray: with two pipeline slots, the
batch sent while another runs is read (unpickled) during that run, on a second Ray
thread, and the model still runs every batch on one thread of its own; with one slot, a
batch is read only once the one before has ended. Every batch gets its own answers."""

from __future__ import annotations

import asyncio

import pytest

from cluster.config import ModelConfig
from deployments.pool import ReplicaPool
from tests.conftest import arun
from tests.models import Marked

pytestmark = pytest.mark.integration


def config(inflight: int) -> ModelConfig:
    return ModelConfig(
        name="readahead", transformer="tests.models:ReadWhileRunning",
        # long enough that the second batch, sent 50 ms in, arrives while the first runs
        # on a loaded machine too (at 300 ms, with a load average of 16, it did not)
        init_kwargs={"delay_ms": 1500},
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        batching={"max_batch_size": 8, "max_queue_delay_s": 0.0},
        replicas={"num_cpus": 0.1, "max_inflight_batches": inflight, "read_ahead": True},
        warmup={"enabled": False},
    )


@pytest.mark.parametrize("inflight, read_ahead", [(2, 1.0), (1, 0.0)])
def test_the_next_batch_is_read_while_one_runs_and_the_model_keeps_one_thread(
        ray_address, inflight, read_ahead):
    pool = ReplicaPool(config(inflight), host=None)
    _, client = pool._create()

    async def main():
        await client.info()  # ready
        first = asyncio.ensure_future(client.run([Marked(1.0), Marked(2.0)]))
        await asyncio.sleep(0.05)  # the first runs (1.5 s) when the second is sent
        second = asyncio.ensure_future(client.run([Marked(3.0)]))
        third_after = await first
        return third_after, await second

    try:
        (a, _), (b, _) = arun(main(), timeout_s=60)
    finally:
        client.stop()
    assert len(a) == 2 and len(b) == 1  # each batch got its own answers
    assert [list(map(float, row)) for row in b] == [[read_ahead, 0.0]]
    assert all(float(row[1]) == 0.0 for row in a)  # one model thread throughout


@pytest.mark.parametrize("read_ahead", [True, False])
def test_the_replica_pipeline_benchmark_runs_every_batch(ray_address, read_ahead):
    from benchmarks.placement.replica_pipeline import measure

    r = arun(measure("sleep", 20, 8, 2, read_ahead), timeout_s=120)
    assert (r["batches"], r["read_ahead"], r["inflight"]) == (20, read_ahead, 2)
    assert 0 < r["busy"] <= 1.05 and r["mean_compute_ms"] >= 2.0  # sleep: 2 ms + 0.05/item
