"""BatchHost and deadlines once a batch is out: a batch of a lost replica is sent once more
only where its requests' deadline leaves the time a batch takes (else 503, WorkerDied); a
batch whose replica never answers (cut off: no error comes either) ends at its latest
deadline plus `ANSWER_GRACE_S` with 504, its late answer dropped, never sent again; a
parked batch ends by its deadline too. Fake replicas and a fake clock, as `test_host`;
the host's timer is stood in for by calling its pump at the instant it is armed for."""

from __future__ import annotations

import pytest

from batching import WorkerDied
from batching.dynamic.host import ANSWER_GRACE_S
from batching.errors import NoAnswerInTime, http_status
from tests.conftest import arun as run
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, make_host, spin, submit


def _with_latency(host, seconds: float) -> None:
    """Make the host's latency model predict `seconds` for a batch of one."""
    host.seed_latency([(1.0, seconds)] * 8)


def test_a_lost_batch_is_sent_once_more_when_its_deadline_allows_and_answered_once():
    async def main():
        clock = Clock()
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(a, b, clock=clock, max_batch_size=2)
        _with_latency(host, 1.0)
        futs = [submit(host, i, i + 1, timeout_s=5.0) for i in range(2)]
        await spin()
        assert a.pending() == [[1, 2]]
        clock.now = 3.9  # 1.1 s left, a batch takes 1 s
        a.die()
        await spin()
        assert died == ["a"] and b.pending() == [[1, 2]]
        b.finish()
        await spin()
        assert [f.result() for f in futs] == ["b:1", "b:4"]
        assert host.retried_batches == 1 and host.stats()["open_requests"] == 0
    run(main())


def test_a_lost_batch_too_near_its_deadline_fails_with_503_and_is_not_sent_again():
    async def main():
        clock = Clock()
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(a, b, clock=clock, max_batch_size=2)
        _with_latency(host, 1.0)
        futs = [submit(host, i, i + 1, timeout_s=5.0) for i in range(2)]
        await spin()
        clock.now = 4.1  # 0.9 s left: it could not end in time elsewhere
        a.die()
        await spin()
        errors = [f.exception() for f in futs]
        assert all(type(e) is WorkerDied and http_status(e) == 503 for e in errors)
        assert "too near its deadline" in str(errors[0])
        assert b.calls == [] and host.retried_batches == 0 and died == ["a"]
    run(main())


def test_a_lost_batch_without_a_deadline_is_always_sent_again():
    async def main():
        clock = Clock()
        a, b = FakeReplica("a"), FakeReplica("b")
        host, _ = make_host(a, b, clock=clock)
        _with_latency(host, 1.0)
        fut = submit(host, "r", 3)
        await spin()
        clock.now = 3600.0
        host._pump()  # nothing to end: it has no deadline
        assert not fut.done()
        a.die()
        await spin()
        b.finish()
        await spin()
        assert fut.result() == "b:9"
    run(main())


def test_a_batch_with_no_answer_ends_at_its_deadline_and_its_late_answer_is_dropped():
    """A replica cut off: neither an answer nor an error comes. Its requests end with 504
    at the batch's latest deadline plus the grace; the slot stays taken until the call
    ends; the answer that comes later reaches nobody, and nothing is sent again."""
    async def main():
        clock = Clock()
        a, b = FakeReplica("a"), FakeReplica("b")
        host, _ = make_host(a, clock=clock, max_batch_size=2, max_inflight=1)
        futs = [submit(host, "early", 1, timeout_s=1.0), submit(host, "late", 2, timeout_s=2.0)]
        await spin()
        assert a.pending() == [[1, 2]]
        assert host._timer_at == pytest.approx(2.0 + ANSWER_GRACE_S)  # the one timer
        clock.now = 2.0 + ANSWER_GRACE_S / 2
        host._pump()
        assert not any(f.done() for f in futs)
        clock.now = 2.0 + ANSWER_GRACE_S
        host._pump()
        errors = [f.exception() for f in futs]
        assert all(isinstance(e, NoAnswerInTime) and http_status(e) == 504 for e in errors)
        assert host.outstanding(a) == 1 and host.stats()["open_requests"] == 0
        queued = submit(host, "next", 3, timeout_s=10.0)  # a's one slot is still taken
        host.add_replica(b)
        await spin()
        assert b.pending() == [[3]]
        a.finish()  # the late answer
        await spin()
        assert [f.exception() for f in futs] == errors  # unchanged: one outcome each
        assert host.outstanding(a) == 0 and [items for items, _ in b.calls] == [[3]]
        b.finish()
        await spin()
        assert queued.result() == "b:9"
        assert host.stats()["fail"]["count"] == 2 and host.stats()["success"]["count"] == 1
    run(main())


def test_a_batch_given_up_on_is_not_sent_again_when_its_replica_is_lost_later():
    async def main():
        clock = Clock()
        a, b = FakeReplica("a"), FakeReplica("b")
        host, died = make_host(a, b, clock=clock, max_batch_size=2)
        fut = submit(host, "r", 1, timeout_s=1.0)
        await spin()
        clock.now = 1.0 + ANSWER_GRACE_S
        host._pump()
        assert isinstance(fut.exception(), NoAnswerInTime)
        a.die()  # the connection's keepalive takes it for lost, a little later
        await spin()
        assert died == ["a"] and b.calls == [] and host.retried_batches == 0
    run(main())


def test_a_parked_batch_ends_with_503_by_its_deadline_and_never_runs_later():
    async def main():
        clock = Clock()
        a = FakeReplica("a")
        host, _ = make_host(a, clock=clock, max_batch_size=2)
        fut = submit(host, "r", 1, timeout_s=3.0)
        await spin()
        clock.now = 1.0
        a.die()  # no other replica: parked, waiting for one
        await spin()
        assert not fut.done()
        clock.now = 3.0 + ANSWER_GRACE_S
        host._pump()
        error = fut.exception()
        assert type(error) is WorkerDied and "no replica was free" in str(error)
        c = FakeReplica("c")
        host.add_replica(c)
        await spin()
        assert c.calls == [] and host.stats()["inflight_batches"] == 0
    run(main())


def test_a_parked_batch_whose_deadline_got_too_near_fails_when_a_replica_comes():
    async def main():
        clock = Clock()
        a = FakeReplica("a")
        host, _ = make_host(a, clock=clock, max_batch_size=2)
        _with_latency(host, 1.0)
        fut = submit(host, "r", 1, timeout_s=3.0)
        await spin()
        a.die()
        await spin()
        clock.now = 2.5  # 0.5 s left when a replica is there again
        c = FakeReplica("c")
        host.add_replica(c)
        await spin()
        assert c.calls == [] and type(fut.exception()) is WorkerDied
    run(main())
