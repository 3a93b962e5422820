"""In-process replicas (`deployments.replica.inprocess`) and the pool over them, without Ray: the
model is built and run on the replica's own thread, its errors reach the caller as raised,
a hung batch fails alone while the batches queued behind it go to another replica, and
the pool replaces a replica dropped as hung."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from batching.errors import BatchTimedOut, Overloaded
from batching.loop import ReplicaDied, ReplicaHung
from batching.model import VectorTransformer
from batching.types import Request
from cluster.config import ModelConfig
from deployments.batcher.hosts import make_host
from deployments.replica.actor import ModelReplica
from deployments.replica.inprocess import InProcessClient
from deployments.replica.pool import ReplicaPool
from tests.conftest import arun, until

THREADS: list[tuple[str, str]] = []  # (what ran, on which thread), appended by Probe


class Probe(VectorTransformer):
    """FP32 [-1] → x + 1; records the thread of each call; item 13 fails the batch."""

    def __init__(self, fail_setup: bool = False) -> None:
        if fail_setup:
            raise RuntimeError("no weights here")
        THREADS.append(("init", threading.current_thread().name))

    def preprocess(self, items: Sequence[Any]) -> np.ndarray:
        return np.asarray(items, dtype=np.float32)

    def transform(self, xs: np.ndarray) -> np.ndarray:
        THREADS.append(("batch", threading.current_thread().name))
        if (xs == 13).any():
            raise ValueError("13 is unlucky")
        return xs + 1


def config(transformer: str, **replicas: Any) -> str:
    return ModelConfig(
        name="m", transformer=transformer, init_kwargs=replicas.pop("init_kwargs", {}),
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1]}],
        batching={"max_batch_size": 8, "max_queue_delay_s": 0.0},
        replicas={"in_process": True, "num_cpus": 0.5, **replicas},
        warmup={"enabled": False},
    ).model_dump_json()


PROBE = f"{__name__}:Probe"


def test_the_model_is_built_and_run_on_the_replicas_own_thread():
    async def main():
        client = InProcessClient(ModelReplica, config(PROBE), 3)
        info = await client.info()
        results, compute_s = await client.run([1.0, 2.0])
        client.stop()
        return info, results, compute_s

    THREADS.clear()
    info, results, compute_s = asyncio.run(main())
    assert [float(r) for r in results] == [2.0, 3.0] and compute_s >= 0
    assert info["in_process"] is True and info["index"] == 3
    assert info["pinned"] is False and "in process" in info["pin_note"]
    names = {name for _, name in THREADS}
    assert [what for what, _ in THREADS] == ["init", "batch"]
    assert len(names) == 1 and names.pop().startswith("raybatch-replica-3")


def test_a_models_error_reaches_the_caller_as_it_raised_it():
    async def main():
        client = InProcessClient(ModelReplica, config(PROBE), 0)
        await client.info()
        with pytest.raises(ValueError, match="13 is unlucky"):
            await client.run([13.0])
        ok, _ = await client.run([1.0])  # the replica still serves
        client.stop()
        return ok

    assert [float(r) for r in asyncio.run(main())] == [2.0]


def test_a_model_that_cannot_be_built_says_why_in_its_info():
    async def main():
        client = InProcessClient(ModelReplica, config(PROBE, init_kwargs={"fail_setup": True}),
                                 0)
        info = await client.info()
        client.stop()
        return info

    assert "no weights here" in asyncio.run(main())["error"]


def test_a_hung_batch_fails_alone_and_the_batches_behind_it_are_handed_back(caplog):
    async def main():
        client = InProcessClient(ModelReplica, config(
            "tests.models:HangOnNegative", init_kwargs={"hang_s": 0.5}), 0, timeout_s=0.15)
        await client.info()
        hung = asyncio.ensure_future(client.run([-1.0]))
        behind = asyncio.ensure_future(client.run([1.0]))  # queued on the same thread
        outcomes = await asyncio.gather(hung, behind, return_exceptions=True)
        with pytest.raises(ReplicaDied, match="stopped"):
            await client.run([2.0])  # dropped: takes no more calls
        return client, outcomes

    client, (hung, behind) = asyncio.run(main())
    assert isinstance(hung, ReplicaHung) and isinstance(hung.error, BatchTimedOut)
    assert "batch_timeout_s=0.15" in str(hung.error)
    assert type(behind) is ReplicaDied  # not hung itself: the host runs it elsewhere
    # The hung batch ends after its loop closed: quietly (a traceback from that thread
    # once raced another test's ast.parse: Python 3.11's SystemError, gh-106905).
    client._thread.shutdown(wait=True)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR
                and "callback" in r.getMessage()], caplog.text


def test_the_pool_serves_from_in_process_replicas_and_replaces_a_hung_one():
    model = ModelConfig.model_validate_json(config(
        "tests.models:HangOnNegative", init_kwargs={"hang_s": 0.5}, batch_timeout_s=0.15))

    async def main():
        pool: ReplicaPool | None = None
        host = make_host(model, on_replica_died=lambda c: pool.replaced(c))
        pool = ReplicaPool(model, host)
        await pool.start()
        first = host.replicas[0]
        ok = await host.submit(Request(1, [1.0, 2.0], False, None, None, 2))
        with pytest.raises(BatchTimedOut):
            await host.submit(Request(2, [-1.0], False, None, None, 1))
        # the replacement is built on a thread of its own
        await until(lambda: host.replicas and host.replicas[0] is not first,
                    "the hung replica replaced", 30)
        again = await host.submit(Request(3, [5.0], False, None, None, 1))
        infos = await pool.info()
        return ok, again, infos

    ok, again, infos = asyncio.run(main())
    assert [float(v) for v in ok] == [2.0, 3.0] and [float(v) for v in again] == [6.0]
    assert [i["index"] for i in infos] == [1] and infos[0]["state"] == "ALIVE"
    assert infos[0]["in_process"] is True


def test_the_pool_adds_a_replica_when_the_wait_bound_refuses_what_the_count_never_reaches():
    # 8 items per 0.1 s batch: 80 a second, far below scale_up_queue_items per second, so
    # with admission by time (0.3 s of wait) the queue never holds 1,000 items; what says
    # the replicas are short is the refusals at the bound.
    model = ModelConfig(
        name="m", transformer="tests.models:SlowSquare", init_kwargs={"delay_ms": 100.0},
        inputs=[{"name": "x", "datatype": "FP32", "shape": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [-1]}],
        batching={"max_batch_size": 8, "max_queue_delay_s": 0.0, "max_queue_wait_s": 0.3},
        replicas={"in_process": True, "num_cpus": 0.5, "min_replicas": 1, "max_replicas": 2,
                  "scale_up_queue_items": 1000},
        warmup={"enabled": False})

    async def main():
        host = make_host(model, on_replica_died=lambda c: None)
        pool = ReplicaPool(model, host)
        await pool.start()
        before = len(host.replicas)
        calls, refused = [], 0
        for i in range(200):
            try:
                calls.append(host.submit(Request(i, [float(i)], False, None, None, 1)))
            except Overloaded:  # refused at submit: past the wait bound
                refused += 1
        # the autoscaler looks every 0.5 s
        await until(lambda: len(host.replicas) == 2, "a second replica added", 60)
        after = len(host.replicas)
        await asyncio.wait(calls)  # what was accepted is answered
        assert all(c.exception() is None for c in calls)
        await host.close(1.0, reason="test over")
        return before, refused, after, host.wait_refusals

    before, refused, after, counted = arun(main())
    assert before == 1 and refused > 0 and counted == refused
    assert after == 2
