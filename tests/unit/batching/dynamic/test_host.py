"""BatchHost against fake replicas whose batches the test finishes by hand.

No Ray, no worker, no real time: every `run` call parks on a future that the
test resolves (a result, a model error, or `ReplicaDied`), the clock is a
number the test moves, and the loop only ever turns with `asyncio.sleep(0)`.
"""

from __future__ import annotations

import asyncio

import pytest

from batching import Cancelled, DynamicPolicy, ServiceClosed, WorkerDied
from batching.dynamic.host import BatchHost, ReplicaDied
from batching.errors import BatchTimedOut
from batching.loop import ReplicaHung
from batching.types import Request
from tests.conftest import arun as run


class FakeReplica:
    """A `ReplicaClient` whose batches wait until the test ends them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[list, asyncio.Future]] = []  # (items, future), oldest first
        self.max_outstanding = 0

    async def run(self, items):
        fut = asyncio.get_running_loop().create_future()
        self.calls.append((list(items), fut))
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return await fut

    @property
    def outstanding(self) -> int:
        return sum(not fut.done() for _, fut in self.calls)

    def pending(self) -> list[list]:
        return [items for items, fut in self.calls if not fut.done()]

    def _next(self) -> tuple[list, asyncio.Future]:
        return next((items, fut) for items, fut in self.calls if not fut.done())

    def finish(self, compute_s: float = 0.001) -> list:
        """Answer the oldest open batch with `name:x²` for each item x; returns its items."""
        items, fut = self._next()
        fut.set_result(([f"{self.name}:{x * x}" for x in items], compute_s))
        return items

    def fail(self, error: BaseException) -> list:
        items, fut = self._next()
        fut.set_exception(error)
        return items

    def die(self) -> None:
        """Every open batch of this replica ends with ReplicaDied, as when its actor dies."""
        for _, fut in self.calls:
            if not fut.done():
                fut.set_exception(ReplicaDied(f"{self.name} is gone"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def spin(turns: int = 10) -> None:
    """Let the pump and the batch tasks run; no time passes."""
    for _ in range(turns):
        await asyncio.sleep(0)


def make_host(*replicas, max_batch_size=1, max_inflight=2, clock=None, **policy):
    died: list[str] = []
    host = BatchHost(DynamicPolicy(max_batch_size=max_batch_size, **policy),
                     max_inflight=max_inflight, clock=clock or Clock(),
                     on_replica_died=lambda client: died.append(client.name))
    for r in replicas:
        host.add_replica(r)
    return host, died


def submit(host: BatchHost, rid, x, **kw) -> asyncio.Future:
    return host.submit(Request(rid, (x,), single=True, **kw))


def test_a_batch_goes_to_the_replica_with_the_fewest_outstanding():
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, _ = make_host(a, b)
        f = {x: submit(host, x, x) for x in (1, 2, 3)}
        await spin()
        # ties go to the first replica: 1 → a, 2 → b (a has 1), 3 → a (1 each)
        assert (a.pending(), b.pending()) == ([[1], [3]], [[2]])
        b.finish()
        await spin()
        assert f[2].result() == "b:4"
        f[4], f[5] = submit(host, 4, 4), submit(host, 5, 5)
        await spin()
        # a holds 2 batches, b none: both new batches go to b
        assert (a.pending(), b.pending()) == ([[1], [3]], [[4], [5]])
        assert host.outstanding(a) == 2 and host.outstanding(b) == 2
        for r in (a, a, b, b):
            r.finish()
        await spin()
        assert {x: fut.result() for x, fut in f.items()} == {
            1: "a:1", 2: "b:4", 3: "a:9", 4: "b:16", 5: "b:25"}
    run(main())


def test_no_replica_gets_more_than_max_inflight_batches():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_inflight=2)
        futs = [submit(host, i, i) for i in range(6)]
        await spin()
        assert a.pending() == [[0], [1]]
        assert host.stats()["queued_requests"] == 4
        for _ in range(4):
            a.finish()
            await spin()
            assert a.outstanding == 2
        a.finish()
        a.finish()
        await spin()
        assert [f.result() for f in futs] == [f"a:{i * i}" for i in range(6)]
        assert a.max_outstanding == 2
    run(main())


def test_a_dead_replicas_batch_is_retried_once_elsewhere_and_each_request_gets_its_own_result():
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(a, b, max_batch_size=4)
        futs = {x: submit(host, f"r{x}", x) for x in (2, 3, 5)}
        await spin()
        assert a.pending() == [[2, 3, 5]] and b.pending() == []
        a.die()
        await spin()
        assert died == ["a"] and host.replicas == [b]
        assert b.pending() == [[2, 3, 5]]  # the same batch, resent whole
        assert not any(f.done() for f in futs.values())
        b.finish()
        await spin()
        assert {x: f.result() for x, f in futs.items()} == {2: "b:4", 3: "b:9", 5: "b:25"}
        assert host.stats()["open_requests"] == 0
    run(main())


def test_a_batch_whose_second_replica_dies_too_fails_with_worker_died():
    async def main():
        a, b, c = FakeReplica("a"), FakeReplica("b"), FakeReplica("c")
        host, died = make_host(a, b, c, max_batch_size=2)
        futs = [submit(host, i, i) for i in range(2)]
        await spin()
        a.die()
        await spin()
        assert b.pending() == [[0, 1]]
        b.die()
        await spin()
        for f in futs:
            with pytest.raises(WorkerDied, match="two replicas died"):
                f.result()
        assert died == ["a", "b"] and host.replicas == [c]
        assert c.calls == []  # not tried a third time
        assert host.stats()["fail"]["count"] == 2
    run(main())


def test_a_hung_batch_fails_with_its_timeout_alone_and_its_replica_is_replaced():
    """The client stops a replica whose batch ran past batch_timeout_s: that batch fails
    with BatchTimedOut (not retried: it would hang again); the replica's other batch,
    waiting behind it, runs on another replica; the pool is told to replace it."""
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(b, max_batch_size=2)
        host.add_replica(a)
        host.remove_replica(b)  # everything goes to a first
        futs = [submit(host, i, i) for i in range(4)]
        await spin()
        assert a.pending() == [[0, 1], [2, 3]]
        host.add_replica(b)
        a.fail(ReplicaHung("a: hung", BatchTimedOut("ran past batch_timeout_s=1 s")))
        a.die()  # the kill ends its other batch too
        await spin()
        for f in futs[:2]:
            with pytest.raises(BatchTimedOut, match="batch_timeout_s"):
                f.result()
        assert died == ["a"] and host.replicas == [b]
        assert b.pending() == [[2, 3]]  # retried, not failed with its batch-mate
        b.finish()
        await spin()
        assert [f.result() for f in futs[2:]] == ["b:4", "b:9"]
        assert host.stats()["open_requests"] == 0 and host.replica_deaths == 1
    run(main())


def test_with_no_live_replica_the_batch_is_parked_until_add_replica():
    async def main():
        a = FakeReplica("a")
        host, died = make_host(a, max_batch_size=2)
        futs = [submit(host, i, i + 1) for i in range(2)]
        await spin()
        a.die()
        await spin()
        assert died == ["a"] and host.replicas == []
        assert not any(f.done() for f in futs)
        later = submit(host, "later", 7)  # queued meanwhile: no replica to run it
        await spin()
        assert not later.done()
        c = FakeReplica("c")
        host.add_replica(c)
        await spin()
        assert c.pending() == [[1, 2], [7]]  # the parked batch goes first
        c.finish()
        c.finish()
        await spin()
        assert [f.result() for f in futs] == ["c:1", "c:4"] and later.result() == "c:49"
    run(main())


def test_a_parked_batch_runs_on_a_busy_replica_once_it_frees_a_slot():
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, _ = make_host(a, b, max_inflight=1)
        fa, fb = submit(host, "a", 2), submit(host, "b", 3)
        await spin()
        assert a.pending() == [[2]] and b.pending() == [[3]]
        a.die()  # b is alive but full: the batch waits for a slot, not for a new replica
        await spin()
        assert b.pending() == [[3]] and not fa.done()
        b.finish()
        await spin()
        assert fb.result() == "b:9"
        assert b.pending() == [[2]]
        b.finish()
        await spin()
        assert fa.result() == "b:4"
    run(main())


def test_a_model_error_fails_only_its_batch_and_keeps_the_replica():
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(a, b)
        bad, good = submit(host, "bad", 1), submit(host, "good", 2)
        await spin()
        a.fail(ValueError("boom in the model"))
        b.finish()
        await spin()
        with pytest.raises(ValueError, match="boom in the model"):
            bad.result()
        assert good.result() == "b:4"
        assert died == [] and host.replicas == [a, b]
        again = submit(host, "again", 3)
        await spin()
        assert a.pending() == [[3]]
        a.finish()
        await spin()
        assert again.result() == "a:9"
        s = host.stats()
        assert (s["success"]["count"], s["fail"]["count"]) == (2, 1)
    run(main())


def test_close_refuses_new_requests_and_drains_what_is_queued():
    async def main():
        a = FakeReplica("a")
        # a long queue delay: without the drain, 2 and 3 would wait for company
        host, _ = make_host(a, max_batch_size=4, max_inflight=1, max_queue_delay_s=60.0)
        f1 = submit(host, 1, 1)
        await spin()
        assert a.pending() == []  # waiting for max_queue_delay_s
        closing = asyncio.ensure_future(host.close(timeout_s=60.0))
        await spin()
        assert a.pending() == [[1]]
        with pytest.raises(ServiceClosed, match="closing"):
            submit(host, 9, 9)
        a.finish()
        await spin()
        assert f1.result() == "a:1" and closing.done()
        assert host.stats()["by_reason"] == {"drain": 1}
    run(main())


def test_close_fails_what_did_not_finish_in_time_with_service_closed_exactly_once():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_inflight=1)
        running, queued = submit(host, 1, 1), submit(host, 2, 2)
        await spin()
        assert a.pending() == [[1]]
        await host.close(timeout_s=0)
        for f in (running, queued):
            with pytest.raises(ServiceClosed, match="drain timeout"):
                f.result()
        a.finish()  # the late answer of the running batch is dropped, not delivered twice
        await spin()
        with pytest.raises(ServiceClosed):
            running.result()
        assert a.pending() == [] and len(a.calls) == 1  # the queued request never ran
        assert host.stats()["fail"]["count"] == 2
    run(main())


def test_statistics_count_queue_time_successes_and_failures_on_the_hosts_clock():
    async def main():
        clock, a = Clock(), FakeReplica("a")
        host, _ = make_host(a, max_batch_size=2, clock=clock)
        s0 = host.stats()
        assert (s0["success"]["count"], s0["queue"]["count"], s0["replicas"]) == (0, 0, 1)
        f1, f2 = submit(host, 1, 1), submit(host, 2, 2)
        clock.now = 1.0  # the pump runs on the next turn: both waited 1 s in the queue
        await spin()
        s = host.stats()
        assert s["queue"] == {"count": 2, "s": 2.0}
        assert (s["queued_requests"], s["inflight_batches"], s["open_requests"]) == (0, 1, 2)
        clock.now = 3.0
        a.finish(compute_s=0.25)
        await spin()
        assert f1.result() == "a:1" and f2.result() == "a:4"
        f3 = submit(host, 3, 3)
        await spin()
        a.fail(RuntimeError("bad weights"))
        await spin()
        assert isinstance(f3.exception(), RuntimeError)
        s = host.stats()
        assert s["success"] == {"count": 2, "s": 6.0}
        assert s["fail"]["count"] == 1 and s["queue"]["count"] == 3
        assert (s["batches"], s["items"], s["by_size"]) == (2, 3, {1: 1, 2: 1})
        assert s["compute_s_by_size"] == {2: 0.25}
        assert (s["inflight_batches"], s["open_requests"]) == (0, 0)
    run(main())


def test_a_cancel_between_forming_a_batch_and_sending_it_spares_its_batch_mates():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4)
        futs = {x: submit(host, x, x) for x in (1, 2, 3)}
        await asyncio.sleep(0)  # the pump formed [1, 2, 3]; its task has not started yet
        host.cancel(2)
        await spin()
        assert a.pending() == [[1, 2, 3]]  # what was formed runs whole: the inputs were taken
        a.finish()
        await spin()
        assert futs[1].result() == "a:1" and futs[3].result() == "a:9"
        assert isinstance(futs[2].exception(), Cancelled)
        s = host.stats()  # the cancel is one of "fail" (Triton's count), and said so
        assert (s["open_requests"], s["fail"]["count"], s["cancelled"]) == (0, 1, 1)
    run(main())


def test_a_retried_batch_keeps_its_inputs_when_a_member_was_cancelled_meanwhile():
    async def main():
        a, b = FakeReplica("a"), FakeReplica("b")
        host, _ = make_host(a, b, max_batch_size=4, max_inflight=1)
        futs = {x: submit(host, x, x) for x in (1, 2)}
        await spin()
        assert a.pending() == [[1, 2]]
        host.cancel(1)
        a.die()  # the batch is retried on b, its cancelled member's item included
        await spin()
        assert b.pending() == [[1, 2]]
        b.finish()
        await spin()
        assert futs[2].result() == "b:4"
        assert isinstance(futs[1].exception(), Cancelled)
    run(main())


def test_the_next_batch_reaches_the_replica_before_the_finished_batchs_answers_are_handled():
    """With one batch in flight per replica, a finished batch frees the replica: the next
    one is sent before the finished batch's answers are handled (each one's callback
    encodes and writes a response, a few ms for 64 of them), not after all of them."""
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=2, max_inflight=1)
        first = [submit(host, i, i) for i in range(2)]
        await spin()
        queued = [submit(host, i, i) for i in range(2, 4)]
        await spin()
        assert a.pending() == [[0, 1]]  # the second batch waits for the replica
        seen = []
        for f in first:
            f.add_done_callback(lambda f: seen.append(len(a.calls)))
        a.finish()
        await spin()
        assert [f.result() for f in first] == ["a:0", "a:1"]
        assert seen == [2, 2]  # the replica had the next batch when the answers were handled
        a.finish()
        await spin()
        assert [f.result() for f in queued] == ["a:4", "a:9"]
    run(main())
