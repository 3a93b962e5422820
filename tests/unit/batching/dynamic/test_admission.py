"""Deadline admission (`batching.dynamic.admission`): what cannot finish in time is refused
at submit or shed from the queue, with Overloaded; a fake clock, one line per instant."""

from __future__ import annotations

import pickle

import pytest

from batching import (
    DeadlineExceeded,
    DynamicBatcher,
    DynamicPolicy,
    Overloaded,
    QueueFull,
    QueuePolicy,
    Request,
    TimeoutAction,
)
from batching.dynamic.admission import ServiceRate
from batching.simulate import Poisson, simulate


def req(rid, n=1, timeout_s=None, priority=None) -> Request:
    return Request(rid, tuple(range(n)), timeout_s=timeout_s, priority=priority)


def measured(q: DynamicBatcher, batch_size: int = 4, latency_s: float = 0.5) -> float:
    """Run two full batches back to back on one replica from t=0 (the rate is then
    batch_size / latency_s); returns the time they ended, with nothing queued."""
    for i in range(2 * batch_size):
        q.submit(req(f"w{i}"), now=0.0)
    a = q.next_batch(0.0, free_replicas=2)
    b = q.next_batch(0.0, free_replicas=1)
    assert a.num_items == b.num_items == batch_size
    q.complete(a.id, latency_s, compute_s=latency_s)
    q.complete(b.id, 2 * latency_s, compute_s=latency_s)
    return 2 * latency_s


# -- the rate ---------------------------------------------------------------------------
def test_rate_counts_full_batches_over_busy_time_only():
    r = ServiceRate()
    assert not r.known
    r.sent(0.0, idle=True)
    r.completed(0.5, cost=1, full=False, busy=True)  # half empty: not a sample
    assert not r.known
    r.completed(1.0, cost=4, full=True, busy=False)  # 4 in the 0.5 s since the last end
    assert r.per_s == 8.0
    r.sent(5.0, idle=True)  # after an idle spell, the stretch starts when work leaves
    r.completed(5.5, cost=4, full=True, busy=True)
    assert r.per_s == pytest.approx(8.0)
    r.failed(busy=True, now=5.6)  # a crash: no sample, the stretch restarts
    r.completed(5.7, cost=4, full=True, busy=True)  # 4 in 0.1 s: 40/s, weighted in
    assert 8.0 < r.per_s < 40.0


def test_overloaded_keeps_its_retry_hint_through_pickling():
    e = pickle.loads(pickle.dumps(Overloaded("busy", retry_after_s=1.5)))
    assert isinstance(e, QueueFull) and e.retry_after_s == 1.5 and str(e) == "busy"


# -- at submit --------------------------------------------------------------------------
def test_a_request_that_cannot_finish_in_time_is_refused_at_once():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4))
    t = measured(q)  # 8 items/s: a batch of 4 every 0.5 s
    for i in range(12):  # three batches: the last ends at 1.5 s, just in time
        q.submit(req(i, timeout_s=1.5), now=t)
    with pytest.raises(Overloaded, match=r"about 2\.00 s .* past its timeout of 1\.50 s") as e:
        q.submit(req("late", timeout_s=1.5), now=t)  # a fourth batch: 2 s
    assert e.value.retry_after_s == pytest.approx(0.5)
    assert "late" not in q._queued  # nothing kept
    q.submit(req("sooner", timeout_s=0.5), now=t)  # an earlier deadline goes first (EDF)
    q.submit(req("no deadline"), now=t)  # no deadline: only the queue bound holds
    assert q.queued_requests == 14


def test_work_in_flight_counts_and_a_higher_level_is_not_behind_a_lower_one():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4, priority_levels=2))
    t = measured(q)
    for i in range(8):
        q.submit(req(i, priority=2), now=t)
    b1 = q.next_batch(t, free_replicas=2)
    q.next_batch(t, free_replicas=1)  # 2 batches in flight (1 s), none queued
    with pytest.raises(Overloaded):
        q.submit(req("low", timeout_s=1.0, priority=2), now=t)  # a third batch: 1.5 s
    q.submit(req("low", timeout_s=1.5, priority=2), now=t)
    for i in range(4):  # level 1 goes before the low one: its third batch, 1.5 s
        q.submit(req(f"high{i}", timeout_s=1.5, priority=1), now=t)
    with pytest.raises(Overloaded):
        q.submit(req("high4", timeout_s=1.5, priority=1), now=t)  # a fourth batch
    # one batch back: the 4 high ones end at t + 1.5 s; the low one, behind them, would
    # end at t + 2 s, past its deadline: shed before it runs
    q.complete(b1.id, t + 0.5, compute_s=0.5)
    batch = q.next_batch(t + 0.5, free_replicas=1)
    assert batch.ids == ["high0", "high1", "high2", "high3"]
    [shed] = q.take_failures()
    assert shed.request_id == "low" and isinstance(shed.error, Overloaded)


def test_an_earlier_deadline_is_served_first_so_it_is_not_refused_for_later_ones():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4))
    t = measured(q)
    for i in range(12):
        q.submit(req(i, timeout_s=5.0), now=t)  # 3 batches, deadlines at t + 5 s
    q.submit(req("urgent", timeout_s=0.5), now=t)  # EDF: it goes first, in 0.5 s
    assert q.next_batch(t, free_replicas=1).ids[0] == "urgent"


def test_levels_that_run_late_requests_are_exempt():
    policy = DynamicPolicy(max_batch_size=4, default_queue_policy=QueuePolicy(
        timeout_action=TimeoutAction.DELAY))
    q = DynamicBatcher(policy)
    t = measured(q)
    for i in range(20):
        q.submit(req(i, timeout_s=0.1), now=t)
    assert q.queued_requests == 20


def test_off_it_lets_them_wait_for_their_deadline():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4, deadline_admission=False))
    t = measured(q)
    for i in range(20):
        q.submit(req(i, timeout_s=1.0), now=t)
    assert q.next_batch(t + 1.0, free_replicas=0) is None
    assert {type(f.error) for f in q.take_failures()} == {DeadlineExceeded}


def test_cold_it_refuses_nothing():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4))
    for i in range(100):
        q.submit(req(i, timeout_s=0.001), now=0.0)
    assert q.queued_requests == 100


# -- on the queue -----------------------------------------------------------------------
def test_queued_requests_that_can_no_longer_make_it_are_shed_before_they_run():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4))
    for i in range(24):  # a burst before anything is measured: all accepted
        q.submit(req(i, timeout_s=2.0), now=0.0)
    a = q.next_batch(0.0, free_replicas=2)
    b = q.next_batch(0.0, free_replicas=1)
    assert q.take_failures() == []
    q.complete(a.id, 0.5, compute_s=0.5)  # measured: 8/s
    assert q.next_batch(0.5, free_replicas=0) is None  # (the replica is still full)
    shed = q.take_failures()
    # b ends at 1.0 s, then 8..11 at 1.5 s and 12..15 at 2.0 s: in time; 16..23 would
    # end at 2.5 s, past their deadline (2 s): shed at once, before they ran, with a hint
    assert sorted(f.request_id for f in shed) == list(range(16, 24))
    assert all(isinstance(f.error, Overloaded) and "shed after 500 ms" in str(f.error)
               and f.error.retry_after_s == pytest.approx(0.5) for f in shed)
    q.complete(b.id, 1.0, compute_s=0.5)
    assert q.next_batch(1.0, free_replicas=1).ids == [8, 9, 10, 11]
    assert q.take_failures() == [] and q.queued_requests == 4


# -- the promise, on the simulator ------------------------------------------------------
@pytest.mark.parametrize("replicas,max_inflight", [(1, 2), (3, 2)])
def test_at_ten_times_capacity_nothing_accepted_ends_past_its_timeout(replicas, max_inflight):
    """Open loop at 10x what the replicas can do, a 2 s timeout: with admission every
    completed request ended within 2 s, the rest were refused (never a 504) and the
    replicas were kept busy; without it, accepted requests time out in the queue."""
    capacity = replicas * 4 / 0.5
    kwargs = dict(replicas=replicas, max_inflight=max_inflight, latency_a_s=0.5,
                  latency_b_s=0.0, timeout_s=2.0, duration_s=30.0)
    bounded = QueuePolicy(max_queue_size=replicas * 4 * 8)  # the default bound: 4 s of work
    on = simulate(DynamicPolicy(max_batch_size=4, default_queue_policy=bounded),
                  Poisson(10 * capacity), **kwargs)
    assert on.latency_ms["max"] <= 2000.0, on
    assert set(on.failed) <= {"Overloaded", "QueueFull"}, on.failed
    assert on.completed >= 0.6 * capacity * 30, on
    off = simulate(DynamicPolicy(max_batch_size=4, default_queue_policy=bounded,
                                 deadline_admission=False), Poisson(10 * capacity), **kwargs)
    assert off.failed.get("DeadlineExceeded", 0) > 0.5 * off.completed, off
