"""What the three hosts hand their metrics recorder, and what their snapshots say.

Fake clocks and fake replicas from the hosts' own tests: every wait, latency and
gap below is exact. The recorder is `MemoryRecorder`, so the values are checked
as the engine produces them, before any Prometheus naming.
"""

from __future__ import annotations

import pytest

from batching import (
    Cancelled,
    DeadlineExceeded,
    DynamicPolicy,
    InvalidRequest,
    ModelError,
    QueueFull,
    SequenceLost,
    ServiceClosed,
    WorkerDied,
)
from batching.dynamic.host import BatchHost
from batching.iterative.host import IterativeHost
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest
from batching.metrics import (
    NULL_RECORDER,
    OUTCOMES,
    BatchDone,
    LevelDepth,
    MemoryRecorder,
    StepDone,
    outcome_of,
)
from batching.sequence.host import SequenceHost
from batching.sequence.policy import SequencePolicy
from batching.types import Request
from deployments.models.stateful import Accumulator
from tests.conftest import arun as run
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, spin
from tests.unit.batching.iterative.test_host import FakeStepReplica
from tests.unit.batching.sequence.test_host import StoreReplica, submit, x32


@pytest.mark.parametrize(("error", "outcome"), [
    (None, "ok"), (InvalidRequest("x"), "invalid"), (QueueFull("x"), "queue_full"),
    (DeadlineExceeded("x"), "deadline"), (Cancelled("x"), "cancelled"),
    (WorkerDied("x"), "worker_died"), (SequenceLost("x"), "worker_died"),
    (ServiceClosed("x"), "closed"), (ModelError("x"), "model_error"),
    (ZeroDivisionError(), "model_error"), (ValueError("a model's own"), "model_error"),
])
def test_every_error_is_counted_under_one_outcome_of_a_fixed_set(error, outcome):
    assert outcome_of(error) == outcome
    assert outcome in OUTCOMES


def test_a_host_without_a_recorder_gets_the_null_one():
    async def main():
        assert BatchHost(DynamicPolicy()).recorder is NULL_RECORDER
    run(main())


# -- dynamic batching ---------------------------------------------------------------------
def dynamic_host(clock, rec, **policy):
    return BatchHost(DynamicPolicy(**policy), clock=clock, recorder=rec)


def test_each_batch_hands_its_size_reason_and_the_wait_of_each_request_it_starts():
    async def main():
        clock, rec = Clock(), MemoryRecorder()
        host = dynamic_host(clock, rec, max_batch_size=4, priority_levels=2)
        futs = [host.submit(Request("a", (1, 2, 3), priority=1))]
        clock.now = 0.002
        futs.append(host.submit(Request("b", (4, 5), priority=None)))  # default level: 2
        await spin()
        assert host.snapshot().queued == (LevelDepth(1, 1, 3), LevelDepth(2, 1, 2))
        clock.now = 0.005
        replica = FakeReplica("r")
        host.add_replica(replica)  # the first batch: a's 3 items and b's first
        await spin()
        first = rec.sent[0]
        assert (first.num_items, first.cost, first.reason) == (4, 4.0, "full")
        assert first.queue_waits_s == pytest.approx((0.005, 0.003)) and first.levels == (1, 2)
        clock.now = 0.007
        replica.finish(compute_s=0.0015)
        await spin()
        assert rec.done == [BatchDone(4, pytest.approx(0.002), 0.0015)]
        # b's second item rides in the next batch: its wait is not counted twice
        assert [b.queue_waits_s for b in rec.sent[1:]] == [()]
        replica.finish()
        await spin()
        assert [f.done() for f in futs] == [True, True]
        assert host.snapshot().queued == (LevelDepth(1, 0, 0), LevelDepth(2, 0, 0))
    run(main())


def test_the_snapshot_counts_outcomes_of_requests_the_host_ended_and_in_flight_batches():
    async def main():
        clock, rec = Clock(), MemoryRecorder()
        host = dynamic_host(clock, rec, max_batch_size=1,
                            default_queue_policy={"max_queue_size": 5})
        futs = [host.submit(Request(i, (i,), single=True)) for i in range(4)]
        futs.append(host.submit(Request("late", (9,), single=True, timeout_s=0.001)))
        with pytest.raises(QueueFull):  # refused at submit: never open, not the host's count
            host.submit(Request("x", (0,), single=True))
        clock.now = 0.01  # "late" expires before a replica comes
        a = FakeReplica("a")
        host.add_replica(a)
        await spin()
        assert host.snapshot().inflight == (("a", 2),)
        a.finish()
        a.fail(ModelError("boom"))
        await spin()
        host.cancel(2)  # in flight: its answer is dropped
        a.finish()
        a.finish()
        await spin()
        snap = host.snapshot()
        assert snap.outcomes == {"ok": 2, "model_error": 1, "cancelled": 1, "deadline": 1}
        assert [d.compute_s is None for d in rec.done] == [False, True, False, False]
        assert sum(len(b.queue_waits_s) for b in rec.sent) == 4  # only what ran
        assert snap.inflight == (("a", 0),)
        assert all(f.done() for f in futs)
    run(main())


def test_a_request_standing_for_several_clients_requests_is_counted_as_them():
    """A block of requests gathered by a server (the native front's) is one engine request
    of `requests` clients' requests: its outcome and its queue wait count that many."""
    async def main():
        clock, rec = Clock(), MemoryRecorder()
        host = dynamic_host(clock, rec, max_batch_size=8)
        block = host.submit(Request("block", (1, 2, 3, 4, 5), requests=5))
        one = host.submit(Request("one", (6,), single=True))
        clock.now = 0.004
        replica = FakeReplica("r")
        host.add_replica(replica)
        await spin()
        assert rec.sent[0].queue_waits_s == pytest.approx((0.004,) * 6)
        replica.finish()
        await spin()
        assert block.done() and one.done()
        assert host.snapshot().outcomes == {"ok": 6}
        assert host.engine.stats.success_count == 6 and host.engine.stats.queue_count == 6
    run(main())


def test_replica_deaths_and_retries_are_cumulative_counts_of_the_snapshot():
    async def main():
        rec = MemoryRecorder()
        host = dynamic_host(Clock(), rec, max_batch_size=2)
        a, b = FakeReplica("a"), FakeReplica("b")
        host.add_replica(a)
        host.add_replica(b)
        fut = host.submit(Request("r", (1, 2)))
        await spin()
        a.die()
        await spin()
        b.finish()
        await spin()
        assert fut.result() == ["b:1", "b:4"]
        snap = host.snapshot()
        assert (snap.replica_deaths, snap.retried_batches) == (1, 1)
        assert len(rec.sent) == 1 and len(rec.done) == 1  # a retry is the same batch
    run(main())


# -- sequence batching -------------------------------------------------------------------
def test_sequence_batches_and_the_live_and_idle_expired_sequences():
    async def main():
        clock, rec = Clock(), MemoryRecorder()
        host = SequenceHost(SequencePolicy(max_batch_size=4, max_sequence_idle_s=1.0),
                            clock=clock, recorder=rec)
        replica = StoreReplica("r0", Accumulator())
        host.add_replica(replica)
        f1 = submit(host, "a", 7, 5, start=True)
        clock.now = 0.001
        f2 = submit(host, "b", 8, 1, start=True)
        await spin()
        assert host.snapshot().queued == (LevelDepth(1, 0, 0),)
        assert [b.queue_waits_s for b in rec.sent] == [(0.001, 0.0)]
        f3 = submit(host, "c", 7, 2)  # waits for a's row to come back
        await spin()
        assert host.snapshot().queued == (LevelDepth(1, 1, 1),)
        clock.now = 0.004
        replica.finish()
        await spin()
        assert rec.done[0] == BatchDone(2, pytest.approx(0.003), 0.001)
        replica.finish()
        await spin()
        assert (f1.result(), f2.result(), f3.result()) == (x32(5), x32(1), x32(7))
        assert rec.sent[1].queue_waits_s == pytest.approx((0.003,))
        snap = host.snapshot()
        assert (snap.live_sequences, snap.sequences_idle_expired) == (2, 0)
        assert snap.outcomes == {"ok": 3}
        clock.now = 2.0
        host.wake()
        await spin()
        snap = host.snapshot()
        assert (snap.live_sequences, snap.sequences_idle_expired) == (0, 2)
    run(main())


def test_sequences_lost_with_their_replica_are_counted():
    async def main():
        rec = MemoryRecorder()
        host = SequenceHost(SequencePolicy(max_batch_size=4), clock=Clock(), recorder=rec)
        replica = StoreReplica("r0", Accumulator())
        host.add_replica(replica)
        fut = submit(host, "a", 7, 5, start=True)
        await spin()
        replica.die()
        await spin()
        with pytest.raises(SequenceLost):
            fut.result()
        snap = host.snapshot()
        assert (snap.sequences_lost, snap.replica_deaths) == (1, 1)
        assert snap.outcomes == {"worker_died": 1}
        assert len(rec.sent) == 1 and rec.done == []  # a batch a dead replica took is not done
    run(main())


# -- iterative batching ------------------------------------------------------------------
def test_generation_steps_hand_tokens_first_text_times_and_the_gap_between_steps():
    async def main():
        clock, rec = Clock(), MemoryRecorder()
        host = IterativeHost(IterativePolicy(max_active=4, priority_levels=2), clock=clock,
                             recorder=rec)
        replica = FakeStepReplica("r")
        stream = host.submit(GenerateRequest("a", "ab", max_tokens=3, priority=1))
        clock.now = 0.002
        host.add_replica(replica)
        await spin()
        sent = rec.sent[0]
        assert (sent.num_items, sent.cost, sent.reason) == (1, 2.0, "step")  # prompt tokens
        assert sent.queue_waits_s == (0.002,) and sent.levels == (1,)
        clock.now = 0.003
        other = host.submit(GenerateRequest("b", "xy", max_tokens=5))  # default level: 2
        clock.now = 0.005
        replica.run()  # the prefill step's token: "A"
        await spin()
        assert rec.steps == [StepDone(1, (pytest.approx(0.005),), None)]
        assert rec.sent[1].levels == (2,) and rec.sent[1].num_items == 2
        assert rec.sent[1].queue_waits_s == pytest.approx((0.002,))
        clock.now = 0.012
        replica.run()
        await spin()
        # a went on (its gap: 7 ms); b joined, its first text came 9 ms after it arrived
        assert rec.steps[1] == StepDone(2, (pytest.approx(0.009),), pytest.approx(0.007))
        assert rec.done[1] == BatchDone(2, pytest.approx(0.007), 0.001)
        await other.aclose()  # cancelled by its consumer
        while replica.pending():
            replica.run()
            await spin()
        finished = await stream.result()
        assert finished.text == "AB"
        snap = host.snapshot()
        assert snap.outcomes == {"ok": 1, "cancelled": 1}
        assert snap.generations_cancelled == 1 and snap.active_sequences == 0
        assert snap.tokens_generated == sum(s.tokens for s in rec.steps) >= 4
        assert snap.queued == (LevelDepth(1, 0, 0), LevelDepth(2, 0, 0))
    run(main())
