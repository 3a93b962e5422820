"""BatchedService end to end in one process: real asyncio, a real worker.

Models block on a threading.Event (thread executor) instead of sleeping, so
every test decides exactly when the model may run; a test that needs a batch running
waits until the model has seen it (`until`), not for a while.
"""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

from batching import (
    BatchedService,
    BatchSizeMismatch,
    DeadlineExceeded,
    DynamicPolicy,
    ItemFailed,
    QueueFull,
    QueuePolicy,
    ServiceClosed,
    VectorTransformer,
    WorkerDied,
)
from tests.conftest import arun as run
from tests.conftest import until


class Square(VectorTransformer):
    def transform(self, xs):
        return [x * x for x in xs]


class Gated(VectorTransformer):
    """Records every batch it sees; waits for `gate` before answering."""

    def __init__(self, gate: threading.Event, seen: list) -> None:
        self.gate, self.seen = gate, seen

    def transform(self, xs):
        self.seen.append(list(xs))
        assert self.gate.wait(10), "test forgot to open the gate"
        if any(x == "boom" for x in xs):
            raise ValueError("boom in batch")
        return [ItemFailed(KeyError(x)) if x == "bad" else f"<{x}>" for x in xs]


class Short(VectorTransformer):
    def transform(self, xs):
        return list(xs)[:-1]


class Dies(VectorTransformer):
    def transform(self, xs):
        os._exit(3)


class BadSetup(VectorTransformer):
    def setup(self, device):
        raise RuntimeError("no weights here")


def gated(policy=None, **kw):
    gate, seen = threading.Event(), []
    svc = BatchedService(Gated, policy or DynamicPolicy(max_batch_size=8), executor="thread",
                         init_args=(gate, seen), **kw)
    return svc, gate, seen


def test_square_in_a_worker_process(capfd):
    async def main():
        async with BatchedService(Square, policy=DynamicPolicy(max_batch_size=64,
                                                               max_queue_delay_s=0.002)) as svc:
            assert await svc.submit(3) == 9
            got = await asyncio.gather(*(svc.submit(i) for i in range(300)))
            assert got == [i * i for i in range(300)]
            assert svc.stats()["mean_batch_size"] > 1
    run(main())
    # the worker's start says nothing (`python -m` of it warned on every start, in runpy)
    assert capfd.readouterr().err == ""


def test_submit_many_is_split_and_joined_in_order():
    async def main():
        svc = BatchedService(Square, policy=DynamicPolicy(max_batch_size=4), executor="thread")
        async with svc:
            xs = np.arange(10)
            got = await svc.submit_many(xs)
            assert [int(v) for v in got] == [x * x for x in range(10)]
            assert svc.stats()["by_size"] == {2: 1, 4: 2}
    run(main())


def test_model_error_fails_only_its_batch_and_item_failed_only_its_request():
    async def main():
        svc, gate, seen = gated(DynamicPolicy(max_batch_size=2))
        async with svc:
            tasks = [asyncio.ensure_future(svc.submit(x)) for x in ["a", "boom", "c", "bad"]]
            await asyncio.sleep(0)
            gate.set()
            res = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(res[0], ValueError) and isinstance(res[1], ValueError)
        assert res[2] == "<c>"
        assert isinstance(res[3], KeyError)
        assert seen == [["a", "boom"], ["c", "bad"]]
    run(main())


def test_wrong_result_count_fails_the_batch_with_batch_size_mismatch():
    async def main():
        async with BatchedService(Short, policy=DynamicPolicy(max_batch_size=4),
                                  executor="thread") as svc:
            with pytest.raises(BatchSizeMismatch, match="returned 2 results for a batch of 3"):
                await svc.submit_many([1, 2, 3])
    run(main())


def test_full_queue_rejects_at_once_and_keeps_nothing():
    async def main():
        policy = DynamicPolicy(max_batch_size=1,
                               default_queue_policy=QueuePolicy(max_queue_size=2))
        svc, gate, seen = gated(policy, max_inflight_batches=1)
        async with svc:
            first = asyncio.ensure_future(svc.submit("x0"))
            await until(lambda: seen == [["x0"]], "x0 running, the queue empty", 30)
            queued = [asyncio.ensure_future(svc.submit(f"q{i}")) for i in range(2)]
            await asyncio.sleep(0)
            with pytest.raises(QueueFull, match="max_queue_size=2"):
                await svc.submit("rejected")
            gate.set()
            assert await asyncio.gather(first, *queued) == ["<x0>", "<q0>", "<q1>"]
        assert ["rejected"] not in seen
    run(main())


def test_cancelled_request_never_reaches_the_model():
    async def main():
        svc, gate, seen = gated(DynamicPolicy(max_batch_size=1), max_inflight_batches=1)
        async with svc:
            first = asyncio.ensure_future(svc.submit("first"))
            await until(lambda: seen == [["first"]], "the first running", 30)
            doomed = asyncio.ensure_future(svc.submit("doomed"))
            kept = asyncio.ensure_future(svc.submit("kept"))
            await asyncio.sleep(0)
            doomed.cancel()
            gate.set()
            assert await first == "<first>" and await kept == "<kept>"
            with pytest.raises(asyncio.CancelledError):
                await doomed
        assert seen == [["first"], ["kept"]]
    run(main())


def test_expired_request_fails_with_deadline_exceeded_and_is_not_run():
    async def main():
        svc, gate, seen = gated(DynamicPolicy(max_batch_size=1), max_inflight_batches=1)
        async with svc:
            first = asyncio.ensure_future(svc.submit("first"))
            await until(lambda: seen == [["first"]], "the first running", 30)
            with pytest.raises(DeadlineExceeded, match="deadline"):
                await svc.submit("late", timeout_s=0.02)
            gate.set()
            await first
        assert seen == [["first"]]
    run(main())


def test_close_drains_what_is_queued_then_refuses_new_work():
    async def main():
        svc, gate, _seen = gated(DynamicPolicy(max_batch_size=8, max_queue_delay_s=60))
        await svc.start()
        tasks = [asyncio.ensure_future(svc.submit(i)) for i in range(3)]
        await asyncio.sleep(0)
        gate.set()
        await svc.aclose()
        assert await asyncio.gather(*tasks) == ["<0>", "<1>", "<2>"]
        assert svc.stats()["by_reason"] == {"drain": 1}
        with pytest.raises(ServiceClosed):
            await svc.submit(4)
    run(main())


def test_close_fails_what_cannot_finish_instead_of_hanging():
    async def main():
        svc, gate, seen = gated(DynamicPolicy(max_batch_size=1), max_inflight_batches=1)
        await svc.start()
        tasks = [asyncio.ensure_future(svc.submit(i)) for i in range(2)]
        await until(lambda: seen == [[0]], "the first running", 30)
        await svc.aclose(timeout_s=0.05)  # it cannot finish: the gate stays shut
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ServiceClosed) for r in res), res
        gate.set()
    run(main())


def test_worker_death_fails_open_requests_and_closes_the_service():
    async def main():
        async with BatchedService(Dies, policy=DynamicPolicy(max_batch_size=4)) as svc:
            with pytest.raises(WorkerDied, match="exited with code 3"):
                await svc.submit(1)
            with pytest.raises(ServiceClosed, match="create a new BatchedService"):
                await svc.submit(2)
    run(main())


def test_setup_failure_is_raised_by_start():
    async def main():
        with pytest.raises(RuntimeError, match="no weights here"):
            async with BatchedService(BadSetup):
                pass
    run(main())


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_holds_a_fast_response_for_an_earlier_slow_one(preserve):
    # "low" arrives before "high" but runs after it (priority 1 jumps the queue):
    # only preserve_ordering makes "high" wait for "low".
    async def main():
        done: list[str] = []
        policy = DynamicPolicy(max_batch_size=1, priority_levels=2, preserve_ordering=preserve)
        svc, gate, seen = gated(policy, max_inflight_batches=1)
        async with svc:
            async def one(x, prio):
                await svc.submit(x, priority=prio)
                done.append(x)
            tasks = [asyncio.ensure_future(one("first", 2))]
            await until(lambda: seen == [["first"]], "the first running", 30)
            tasks += [asyncio.ensure_future(one("low", 2))]
            await asyncio.sleep(0)
            tasks += [asyncio.ensure_future(one("high", 1))]
            await asyncio.sleep(0)
            gate.set()
            await asyncio.gather(*tasks)
        assert seen == [["first"], ["high"], ["low"]]
        assert done == (["first", "low", "high"] if preserve else ["first", "high", "low"])
    run(main())
